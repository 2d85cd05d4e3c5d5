//go:build e2e

package e2e_test

import (
	"context"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent/agenttest"
	"github.com/orch-dev/orch/internal/agent/shutdown/logindtest"
	"github.com/orch-dev/orch/internal/api/apitest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestNodeReboot: a board of a two-node cluster reboots (its logind says
// PrepareForShutdown), with orch agent as built, on a system bus of its
// own. Its Deployment pods are stopped gracefully before the machine may
// go down and marked as the kubelet marks them, kubectl shows the node
// NotReady and the pods Terminated, and their replacements run on the
// other node at once, not after the five minutes of a node lost.
func TestNodeReboot(t *testing.T) {
	// Logind already waits longer than the grace period: the agent has
	// no drop-in to write into this machine's /etc.
	boardBus := logindtest.Start(t, time.Minute)
	c := newCluster(t)
	c.agentEnv = map[string][]string{"node-a": {"DBUS_SYSTEM_BUS_ADDRESS=" + boardBus.Address}}
	c.agentArgs = []string{"--shutdown-grace-period", "20s", "--shutdown-grace-period-critical-pods", "5s"}
	c.addNode("node-a", "198.18.0.61")
	c.addNode("node-b", "198.18.0.62")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	agenttest.Eventually(t, "node-a holds a shutdown delay lock", func() bool {
		held, _ := boardBus.Held()
		return held == 1
	})
	k := apitest.NewKubectl(t, c.kubeconfig)
	k.Run("cordon", "node-b")
	web := deployment("web", 2, agenttest.Busybox("web", "trap 'exit 0' TERM; while true; do sleep 0.2; done"))
	if _, err := c.client.AppsV1().Deployments("default").Create(ctx, web, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	k.Run("rollout", "status", "deployment/web", "--timeout=3m")
	k.Run("uncordon", "node-b")

	boardBus.PrepareForShutdown(t, true)
	agenttest.EventuallyWithin(t, "node-a's pods stopped and the lock released", time.Minute, func() bool {
		held, _ := boardBus.Held()
		return held == 0
	})
	nodes := k.Run("get", "node", "node-a", "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].message}")
	if nodes != "node is shutting down" {
		t.Errorf("node-a's Ready condition says %q", nodes)
	}
	// As a kubelet reports them: Failed, reason Terminated, and the
	// container's own exit (its SIGTERM trap exits 0), which is what
	// kubectl's STATUS column shows.
	reasons := k.Run("get", "pods", "--field-selector", "spec.nodeName=node-a", "-o",
		`jsonpath={range .items[*]}{.status.phase}/{.status.reason}/{.status.containerStatuses[0].state.terminated.exitCode} {end}`)
	if reasons != "Failed/Terminated/0 Failed/Terminated/0 " {
		t.Errorf("node-a's pods after its shutdown: %q\n%s", reasons, k.Run("get", "pods", "-o", "wide"))
	}
	agenttest.EventuallyWithin(t, "two web pods Ready on node-b", time.Minute, func() bool {
		list, err := c.client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web", FieldSelector: "spec.nodeName=node-b"})
		if err != nil {
			return false
		}
		ready := 0
		for _, p := range list.Items {
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		return ready == 2
	})
}
