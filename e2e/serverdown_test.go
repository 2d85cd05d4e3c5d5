//go:build e2e

package e2e_test

import (
	"context"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/orch-dev/orch/internal/agent/agenttest"
	"k8s.io/utils/ptr"
)

// TestServerDownForAMinute: the server is killed (kill -9, a power cut on
// the control-plane board) while a node runs a Deployment's pods, stays
// down for a minute, and starts again from its data dir. Nothing is lost:
// the pods ran on through the outage and are the same pods afterwards
// (same UIDs and containers, no restart), Ready all along once the server
// is back (the node is not marked Unknown for the server's own downtime),
// the node Ready, and new pods run.
func TestServerDownForAMinute(t *testing.T) {
	if testing.Short() {
		t.Skip("a minute's outage")
	}
	agentDir := agenttest.NodeDataDir(t)
	bin := agenttest.BuildOrch(t)
	srvDir := t.TempDir()
	port := agenttest.FreePort(t)
	server := func() *exec.Cmd {
		cmd := exec.Command(bin, "server", "--data-dir", srvDir, "--disable-agent", "--bind-address", "127.0.0.1",
			"--advertise-address", "127.0.0.1", "--https-listen-port", strconv.Itoa(port), "--write-kubeconfig", filepath.Join(srvDir, "admin.yaml"))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	srv := server()
	client := agenttest.WaitServer(t, filepath.Join(srvDir, "admin.yaml"))
	token, err := os.ReadFile(filepath.Join(srvDir, "server", "token"))
	if err != nil {
		t.Fatal(err)
	}
	stopAgent := agenttest.RunAgent(t, "https://127.0.0.1:"+strconv.Itoa(port), strings.TrimSpace(string(token)), agentDir, "edge-1")
	defer stopAgent()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	labels := map[string]string{"app": "web"}
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: appsv1.DeploymentSpec{
		Replicas: ptr.To[int32](2), Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](0), Containers: []corev1.Container{agenttest.Busybox("web", "sleep 3600")}}}}}
	if _, err := client.AppsV1().Deployments("default").Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var before map[string]string // pod UID -> container ID
	agenttest.Eventually(t, "the Deployment's 2 pods Ready", func() bool {
		before = agenttest.ReadyPods(ctx, client)
		return len(before) == 2
	})

	if err := srv.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = srv.Wait()
	time.Sleep(time.Minute)
	ctr := agenttest.ContainerdClient(t, agentDir)
	for uid := range before {
		if !agenttest.TaskRunning(ctx, ctr, uid+"-web") {
			t.Errorf("pod %s's container stopped while the server was down", uid)
		}
	}

	server()
	agenttest.Eventually(t, "the node Ready and the same pods Ready after the restart", func() bool {
		node, err := client.CoreV1().Nodes().Get(ctx, "edge-1", metav1.GetOptions{})
		return err == nil && agenttest.NodeReady(node) && maps.Equal(agenttest.ReadyPods(ctx, client), before)
	})
	// They stay so: the node is not judged on the server's own downtime
	// (past the 40 s grace period), so its pods do not turn NotReady.
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		if got := agenttest.ReadyPods(ctx, client); !maps.Equal(got, before) {
			t.Fatalf("after the restart the ready pods are %v, were %v", got, before)
		}
	}
	node, err := client.CoreV1().Nodes().Get(ctx, "edge-1", metav1.GetOptions{})
	if err != nil || len(node.Spec.Taints) != 0 {
		t.Errorf("node after the restart: taints %v, %v", node.Spec.Taints, err)
	}
	if _, err := client.AppsV1().Deployments("default").Patch(ctx, "web", "application/merge-patch+json", []byte(`{"spec":{"replicas":3}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	agenttest.Eventually(t, "a third pod Ready", func() bool { return len(agenttest.ReadyPods(ctx, client)) == 3 })

	if err := client.AppsV1().Deployments("default").Delete(ctx, "web", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)}); err != nil {
		t.Fatal(err)
	}
	agenttest.Eventually(t, "the pods gone from the node", func() bool {
		left, _ := os.ReadDir(filepath.Join(agentDir, "agent", "pods"))
		pods, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		return err == nil && len(pods.Items) == 0 && len(left) == 0
	})
}
