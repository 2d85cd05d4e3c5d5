package agent_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent"
	"github.com/orch-dev/orch/internal/agent/pods"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestMemoryEviction: when the node's available memory falls under the
// hard eviction threshold, the kubelet's choice is evicted: the pod using
// more memory than it requested (here a BestEffort one holding 20 MB)
// before a Guaranteed one within its requests. The evicted pod is
// stopped and cleaned up, reported Failed with reason Evicted and the
// kubelet's message, and not started again.
func TestMemoryEviction(t *testing.T) {
	var lowOnce atomic.Bool
	n := startNode(t, "evicting-node", func(c *agent.Config) {
		c.Eviction = pods.Eviction{Every: 200 * time.Millisecond, MemoryAvailable: func() (int64, error) {
			if lowOnce.CompareAndSwap(true, false) {
				return 50 << 20, nil // one reading under the 100Mi threshold
			}
			return 8 << 30, nil
		}}
	})
	guaranteed := busybox("main", "sleep 3600")
	guaranteed.Resources = corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi"), corev1.ResourceCPU: resource.MustParse("100m")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi"), corev1.ResourceCPU: resource.MustParse("100m")},
	}
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "guaranteed"}, Spec: corev1.PodSpec{Containers: []corev1.Container{guaranteed}}})
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hungry"}, Spec: corev1.PodSpec{Containers: []corev1.Container{
		// The shell holds 20 MB (and does not exec its last command).
		busybox("main", "x=$(head -c 20000000 /dev/zero | tr '\\0' a); sleep 3600 & wait"),
	}}})
	for _, name := range []string{"guaranteed", "hungry"} {
		n.Eventually(name+" Running", time.Minute, func(ctx context.Context) (bool, error) {
			return n.pod(ctx, name).Status.Phase == corev1.PodRunning, nil
		})
	}
	time.Sleep(time.Second) // the hungry pod fills its memory
	hungry := n.pod(n.Ctx, "hungry")

	lowOnce.Store(true)
	n.Eventually("the hungry pod evicted", time.Minute, func(ctx context.Context) (bool, error) {
		p := n.pod(ctx, "hungry")
		return p.Status.Phase == corev1.PodFailed && p.Status.Reason == "Evicted", nil
	})
	p := n.pod(n.Ctx, "hungry")
	var usedKi int
	_, _ = fmt.Sscanf(p.Status.Message[strings.Index(p.Status.Message, "was using ")+len("was using "):], "%dKi", &usedKi)
	if !strings.HasPrefix(p.Status.Message, "The node was low on resource: memory. Threshold quantity: 100Mi") || !hasCondition(p, corev1.DisruptionTarget) ||
		usedKi < 19000 { // the 20 MB it holds, read from its cgroup
		t.Errorf("evicted pod's status: %q, conditions %+v", p.Status.Message, p.Status.Conditions)
	}
	n.Eventually("the evicted pod cleaned up on the node", time.Minute, func(context.Context) (bool, error) {
		_, err := os.Stat(filepath.Join(n.dir, "agent", "pods", string(hungry.UID)))
		return os.IsNotExist(err), nil
	})
	time.Sleep(2 * time.Second) // not started again, and nothing more evicted
	if p := n.pod(n.Ctx, "hungry"); p.Status.Phase != corev1.PodFailed {
		t.Errorf("the evicted pod is %s again", p.Status.Phase)
	}
	if p := n.pod(n.Ctx, "guaranteed"); p.Status.Phase != corev1.PodRunning || p.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("the pod within its requests: %s, %d restarts", p.Status.Phase, p.Status.ContainerStatuses[0].RestartCount)
	}
}
