package agent_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent/pods"
	"github.com/orch-dev/orch/internal/api/apitest"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestKubectlResize: `kubectl patch --subresource resize` on a real node,
// as a user gives a running pod more memory and cpu: the container's own
// cgroup (read inside it, as Kubernetes' conformance suite reads it)
// takes the new memory limit, CFS quota and shares without a restart,
// and the status reports them; a container whose policy restarts it for
// memory comes back at once with its new limit; a resize past the node
// is PodResizePending, Infeasible. The pod, Guaranteed, has the
// kubelet's oom_score_adj.
func TestKubectlResize(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kubectl")
	}
	n := startNode(t, "resize-node")
	k := apitest.NewKubectl(t, n.Server.Kubeconfig)
	limits := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")}
	container := func(name string) corev1.Container {
		return corev1.Container{Name: name, Image: "busybox:test", Command: []string{"sleep", "3600"},
			Resources: corev1.ResourceRequirements{Limits: limits, Requests: limits}}
	}
	restarting := container("restarting")
	restarting.ResizePolicy = []corev1.ContainerResizePolicy{{ResourceName: corev1.ResourceMemory, RestartPolicy: corev1.RestartContainer}}
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: corev1.PodSpec{Containers: []corev1.Container{container("main"), restarting}}})
	n.waitRunning(t, "web")
	cgroup := func(container, file string) string {
		return strings.TrimSpace(k.Run("exec", "web", "-c", container, "--", "cat", "/sys/fs/cgroup/"+file))
	}
	if got := cgroup("main", "memory/memory.limit_in_bytes"); got != "67108864" {
		t.Fatalf("memory limit before the resize: %s", got)
	}
	// A Guaranteed pod's processes are the kernel's last choice when
	// the node runs out of memory, as the kubelet sets them.
	// (Not below the agent's own where it may not lower it: in a
	// container without CAP_SYS_RESOURCE, as this test may run.)
	if got, want := strings.TrimSpace(k.Run("exec", "web", "-c", "main", "--", "cat", "/proc/1/oom_score_adj")), strconv.Itoa(max(-997, pods.OOMScoreFloor())); got != want {
		t.Errorf("oom_score_adj of a Guaranteed pod's container: %s, want %s", got, want)
	}

	k.Run("patch", "pod", "web", "--subresource", "resize", "--patch",
		`{"spec":{"containers":[{"name":"main","resources":{"requests":{"cpu":"200m","memory":"128Mi"},"limits":{"cpu":"200m","memory":"128Mi"}}},`+
			`{"name":"restarting","resources":{"requests":{"cpu":"100m","memory":"96Mi"},"limits":{"cpu":"100m","memory":"96Mi"}}}]}}`)
	n.Eventually("the resize done", time.Minute, func(ctx context.Context) (bool, error) {
		p := n.pod(ctx, "web")
		main, restarted := p.Status.ContainerStatuses[0], p.Status.ContainerStatuses[1]
		return p.Status.ObservedGeneration == p.Generation && main.Resources != nil && main.Resources.Limits.Memory().String() == "128Mi" &&
			restarted.RestartCount == 1 && restarted.State.Running != nil && restarted.Resources.Limits.Memory().String() == "96Mi", nil
	})
	for file, want := range map[string]string{"memory/memory.limit_in_bytes": "134217728", "cpu/cpu.cfs_quota_us": "20000", "cpu/cpu.shares": "204"} {
		if got := cgroup("main", file); got != want {
			t.Errorf("main's %s after the resize: %s, want %s", file, got, want)
		}
	}
	if got := cgroup("restarting", "memory/memory.limit_in_bytes"); got != "100663296" {
		t.Errorf("the restarted container's memory limit: %s", got)
	}
	p := n.pod(n.Ctx, "web")
	if p.Status.ContainerStatuses[0].RestartCount != 0 || p.Status.Phase != corev1.PodRunning {
		t.Errorf("main restarted for an in-place resize: %+v", p.Status.ContainerStatuses[0])
	}

	k.Run("patch", "pod", "web", "--subresource", "resize", "--patch",
		`{"spec":{"containers":[{"name":"main","resources":{"requests":{"cpu":"1000"},"limits":{"cpu":"1000"}}}]}}`)
	n.Eventually("an infeasible resize pending", time.Minute, func(ctx context.Context) (bool, error) {
		for _, c := range n.pod(ctx, "web").Status.Conditions {
			if c.Type == corev1.PodResizePending && c.Reason == corev1.PodReasonInfeasible && strings.HasPrefix(c.Message, "Node didn't have enough capacity: cpu, requested: 1000100") {
				return true, nil
			}
		}
		return false, nil
	})
	if got := cgroup("main", "cpu/cpu.cfs_quota_us"); got != "20000" {
		t.Errorf("an infeasible resize reached the cgroup: quota %s", got)
	}
}
