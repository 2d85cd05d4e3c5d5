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
	"github.com/orch-dev/orch/internal/agent/agenttest"
	"github.com/orch-dev/orch/internal/agent/eviction"
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
		c.Eviction = eviction.Config{Every: 200 * time.Millisecond, MemoryAvailable: func() (int64, error) {
			if lowOnce.CompareAndSwap(true, false) {
				return 50 << 20, nil // one reading under the 100Mi threshold
			}
			return 8 << 30, nil
		}}
	})
	guaranteed := agenttest.Busybox("main", "sleep 3600")
	guaranteed.Resources = corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi"), corev1.ResourceCPU: resource.MustParse("100m")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi"), corev1.ResourceCPU: resource.MustParse("100m")},
	}
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "guaranteed"}, Spec: corev1.PodSpec{Containers: []corev1.Container{guaranteed}}})
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hungry"}, Spec: corev1.PodSpec{Containers: []corev1.Container{
		// The shell holds 20 MB (and does not exec its last command),
		// and says so once it does.
		agenttest.Busybox("main", "x=$(head -c 20000000 /dev/zero | tr '\\0' a); echo filled; sleep 3600 & wait"),
	}}})
	for _, name := range []string{"guaranteed", "hungry"} {
		n.Eventually(name+" Running", time.Minute, func(ctx context.Context) (bool, error) {
			return n.pod(ctx, name).Status.Phase == corev1.PodRunning, nil
		})
	}
	n.waitOutput(t, "hungry", "main", "filled") // on a busy machine filling takes its time
	hungry := n.pod(n.Ctx, "hungry")

	record := n.RecordPods("default", "")
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
	// Ten more rounds of the eviction check (every 200 ms), every change
	// to the pods recorded: the evicted pod is not started again, and the
	// pod within its requests is never touched.
	time.Sleep(2 * time.Second)
	failed := false
	for _, state := range record.Stop(t) {
		h, g := state["hungry"], state["guaranteed"]
		if h == nil || g == nil {
			t.Fatalf("a pod disappeared: %v", state)
		}
		if failed && h.Status.Phase != corev1.PodFailed {
			t.Errorf("the evicted pod is %s again", h.Status.Phase)
		}
		failed = failed || h.Status.Phase == corev1.PodFailed
		if g.Status.Phase != corev1.PodRunning || len(g.Status.ContainerStatuses) != 1 || g.Status.ContainerStatuses[0].RestartCount != 0 {
			t.Errorf("the pod within its requests: %s, %+v", g.Status.Phase, g.Status.ContainerStatuses)
		}
	}
}

// TestStorageEviction: pods over their own ephemeral-storage limits are
// evicted with the kubelet's messages (an emptyDir over its sizeLimit, a
// container writing past its limit into its root filesystem, a pod
// writing past its limit into its logs) while a pod within its limits runs on. Then, when the node's disk
// falls under nodefs.available<10%, the pod using more than it requested
// is evicted rather than the one within its requests.
func TestStorageEviction(t *testing.T) {
	var lowReadings atomic.Int32
	n := startNode(t, "disk-node", func(c *agent.Config) {
		c.Eviction = eviction.Config{Every: 200 * time.Millisecond, NodeFS: func() (eviction.Filesystem, error) {
			if lowReadings.Add(-1) >= 0 {
				return eviction.Filesystem{Size: 100 << 30, Available: 5 << 30, Inodes: 1 << 20, InodesFree: 1 << 19}, nil
			}
			return eviction.Filesystem{Size: 100 << 30, Available: 50 << 30, Inodes: 1 << 20, InodesFree: 1 << 19}, nil
		}}
	})
	lowReadings.Store(-1 << 30)
	storage := func(requests, limits string) corev1.ResourceRequirements {
		r := corev1.ResourceRequirements{}
		if requests != "" {
			r.Requests = corev1.ResourceList{corev1.ResourceEphemeralStorage: resource.MustParse(requests)}
		}
		if limits != "" {
			r.Limits = corev1.ResourceList{corev1.ResourceEphemeralStorage: resource.MustParse(limits)}
		}
		return r
	}
	withResources := func(c corev1.Container, r corev1.ResourceRequirements) corev1.Container {
		c.Resources = r
		return c
	}
	const fill = "head -c 2000000 /dev/zero > %s; sleep 3600"
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "scratch"}, Spec: corev1.PodSpec{
		Volumes:    []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: agenttest.PtrTo(resource.MustParse("1Mi"))}}}},
		Containers: []corev1.Container{{Name: "main", Image: "busybox:test", Command: []string{"sh", "-c", fmt.Sprintf(fill, "/scratch/fill")}, VolumeMounts: []corev1.VolumeMount{{Name: "scratch", MountPath: "/scratch"}}}},
	}})
	// The pod as a whole is within its 11Mi; one container is not.
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "writer"}, Spec: corev1.PodSpec{Containers: []corev1.Container{
		withResources(agenttest.Busybox("main", fmt.Sprintf(fill, "/tmp/fill")), storage("", "1Mi")),
		withResources(agenttest.Busybox("sidecar", "sleep 3600"), storage("", "10Mi")),
	}}})
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "chatty"}, Spec: corev1.PodSpec{Containers: []corev1.Container{
		withResources(agenttest.Busybox("main", "yes 'a line of log' | head -c 2000000; sleep 3600"), storage("", "1Mi")),
	}}})
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "tidy"}, Spec: corev1.PodSpec{Containers: []corev1.Container{
		withResources(agenttest.Busybox("main", "head -c 100000 /dev/zero > /tmp/fill; sleep 3600"), storage("", "10Mi")),
	}}})
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "within-requests"}, Spec: corev1.PodSpec{Containers: []corev1.Container{
		withResources(agenttest.Busybox("main", "sleep 3600"), storage("10Mi", "")),
	}}})
	uids := map[string]string{}
	for name, message := range map[string]string{
		"scratch": `Usage of EmptyDir volume "scratch" exceeds the limit "1Mi". `,
		"writer":  `Container main exceeded its local ephemeral storage limit "1Mi". `,
		// The kubelet checks the pod's total before each container's.
		"chatty": "Pod ephemeral local storage usage exceeds the total limit of containers 1Mi. ",
	} {
		n.Eventually(name+" evicted", time.Minute, func(ctx context.Context) (bool, error) {
			p := n.pod(ctx, name)
			return p.Status.Phase == corev1.PodFailed && p.Status.Reason == "Evicted", nil
		})
		p := n.pod(n.Ctx, name)
		uids[name] = string(p.UID)
		// The kubelet marks no DisruptionTarget for a pod over its own limits.
		if p.Status.Message != message || hasCondition(p, corev1.DisruptionTarget) {
			t.Errorf("%s: %q, conditions %+v; want %q", name, p.Status.Message, p.Status.Conditions, message)
		}
	}
	for name, uid := range uids {
		n.Eventually(name+" cleaned up on the node", time.Minute, func(context.Context) (bool, error) {
			_, err := os.Stat(filepath.Join(n.dir, "agent", "pods", uid))
			return os.IsNotExist(err), nil
		})
	}
	for _, name := range []string{"tidy", "within-requests"} {
		if p := n.pod(n.Ctx, name); p.Status.Phase != corev1.PodRunning {
			t.Fatalf("%s, within its limits: %s %s", name, p.Status.Phase, p.Status.Message)
		}
	}

	// Under nodefs.available for two readings: before and after the
	// node removes unused images.
	lowReadings.Store(2)
	n.Eventually("the pod over its requests evicted", time.Minute, func(ctx context.Context) (bool, error) {
		return n.pod(ctx, "tidy").Status.Reason == "Evicted", nil
	})
	p := n.pod(n.Ctx, "tidy")
	if !strings.HasPrefix(p.Status.Message, "The node was low on resource: ephemeral-storage. Threshold quantity: 10Gi, available: 5242880Ki. Container main was using ") ||
		!hasCondition(p, corev1.DisruptionTarget) {
		t.Errorf("evicted for the node's disk: %q, conditions %+v", p.Status.Message, p.Status.Conditions)
	}
	n.Eventually("the node's EvictionThresholdMet event", 10*time.Second, func(ctx context.Context) (bool, error) {
		return nodeEvents(ctx, n.Client, "disk-node")["EvictionThresholdMet"] == "Attempting to reclaim ephemeral-storage", nil
	})
	time.Sleep(time.Second)
	if p := n.pod(n.Ctx, "within-requests"); p.Status.Phase != corev1.PodRunning || p.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("the pod within its requests: %s, %d restarts", p.Status.Phase, p.Status.ContainerStatuses[0].RestartCount)
	}
}
