package pods

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func resizeCondition(p *corev1.Pod) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if t := p.Status.Conditions[i].Type; t == corev1.PodResizePending || t == corev1.PodResizeInProgress {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

// TestResizeOnFakeRuntime: an in-place resize (what pods/resize writes)
// reaches the running container's cgroup without a restart, and its
// status says so (resources and allocatedResources); a resource whose
// resize policy is RestartContainer restarts it at once with the new
// limits; a resize past the node's allocatable is PodResizePending
// Infeasible, one the kernel refuses PodResizeInProgress with the error
// until it goes through — as the kubelet does.
func TestResizeOnFakeRuntime(t *testing.T) {
	pod := fakePod("web", "app", "db")
	res := func(cpu, mem string) corev1.ResourceRequirements {
		l := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}
		return corev1.ResourceRequirements{Requests: l, Limits: l.DeepCopy()}
	}
	pod.Spec.Containers[0].Resources = res("100m", "64Mi")
	pod.Spec.Containers[1].Resources = res("100m", "64Mi")
	pod.Spec.Containers[1].ResizePolicy = []corev1.ContainerResizePolicy{{ResourceName: corev1.ResourceMemory, RestartPolicy: corev1.RestartContainer}}
	n := newFakeNode(t, pod)
	n.m.cfg.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("1Gi"), corev1.ResourcePods: resource.MustParse("110")}
	var refuse atomic.Pointer[error]
	n.rt.UpdateError = func(string, *specs.LinuxResources) error {
		if err := refuse.Load(); err != nil {
			return *err
		}
		return nil
	}
	n.run(t)
	eventually(t, "the pod Running", func() bool { return n.pod("web").Status.Phase == corev1.PodRunning })
	if cs := statusOf(n.pod("web"), "app"); cs.Resources == nil || cs.Resources.Limits.Memory().String() != "64Mi" || cs.AllocatedResources.Cpu().String() != "100m" {
		t.Fatalf("status resources before a resize: %+v, allocated %v", cs.Resources, cs.AllocatedResources)
	}
	resize := func(container int, r corev1.ResourceRequirements) {
		t.Helper()
		p := n.pod("web").DeepCopy()
		p.Spec.Containers[container].Resources = r
		if _, err := n.api.Client.Pods("default").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	resize(0, res("200m", "96Mi"))
	eventually(t, "app resized in place", func() bool {
		cs := statusOf(n.pod("web"), "app")
		return cs.Resources.Limits.Cpu().String() == "200m" && cs.AllocatedResources.Memory().String() == "96Mi"
	})
	if got := n.rt.Resources("web-uid-app"); got == nil || *got.Memory.Limit != 96<<20 || *got.CPU.Quota != 20000 || *got.CPU.Shares != 204 {
		t.Errorf("cgroup of app after the resize: %+v", got)
	}
	if cs := statusOf(n.pod("web"), "app"); cs.RestartCount != 0 || resizeCondition(n.pod("web")) != nil {
		t.Errorf("an in-place resize restarted app (%d) or left a condition: %+v", cs.RestartCount, resizeCondition(n.pod("web")))
	}

	resize(1, res("100m", "128Mi"))
	eventually(t, "db restarted with its new memory", func() bool {
		cs := statusOf(n.pod("web"), "db")
		return cs.RestartCount == 1 && cs.State.Running != nil && cs.Resources.Limits.Memory().String() == "128Mi"
	})
	if n.rt.Resources("web-uid-db") != nil {
		t.Error("db was updated in place though its policy restarts it for memory")
	}

	resize(0, res("3", "96Mi"))
	eventually(t, "an infeasible resize pending", func() bool {
		c := resizeCondition(n.pod("web"))
		return c != nil && c.Type == corev1.PodResizePending && c.Reason == corev1.PodReasonInfeasible &&
			c.Message == "Node didn't have enough capacity: cpu, requested: 3100, capacity: 2000"
	})
	if cs := statusOf(n.pod("web"), "app"); cs.Resources.Limits.Cpu().String() != "200m" {
		t.Errorf("status resources of a resize not applied: %+v", cs.Resources)
	}

	// An infeasible resize withdrawn is no longer pending.
	p := n.pod("web").DeepCopy()
	p.Spec.Containers[0].Resources = res("200m", "96Mi") // the infeasible one withdrawn
	if _, err := n.api.Client.Pods("default").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the infeasible resize withdrawn", func() bool { return resizeCondition(n.pod("web")) == nil })

	refused := errors.New("cannot set memory limit below usage")
	refuse.Store(&refused)
	resize(0, res("200m", "32Mi"))
	eventually(t, "a refused resize in progress with its error", func() bool {
		c := resizeCondition(n.pod("web"))
		return c != nil && c.Type == corev1.PodResizeInProgress && c.Reason == corev1.PodReasonError && c.Message == "cannot set memory limit below usage"
	})
	refuse.Store(nil)
	eventually(t, "the resize through once the kernel takes it", func() bool {
		p := n.pod("web")
		return resizeCondition(p) == nil && statusOf(p, "app").Resources.Limits.Memory().String() == "32Mi"
	})
}

// TestResizeSidecarOnFakeRuntime: a sidecar (an init container that
// runs beside the pod's containers) is resized in place as they are.
func TestResizeSidecarOnFakeRuntime(t *testing.T) {
	pod := fakePod("web", "app")
	limits := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")}
	pod.Spec.InitContainers = []corev1.Container{{Name: "proxy", Image: "busybox:test", ImagePullPolicy: corev1.PullIfNotPresent,
		RestartPolicy: ptrTo(corev1.ContainerRestartPolicyAlways), Resources: corev1.ResourceRequirements{Limits: limits, Requests: limits}}}
	n := newFakeNode(t, pod)
	n.run(t)
	eventually(t, "the pod Running", func() bool { return n.pod("web").Status.Phase == corev1.PodRunning })
	p := n.pod("web").DeepCopy()
	p.Spec.InitContainers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")}
	p.Spec.InitContainers[0].Resources.Requests = p.Spec.InitContainers[0].Resources.Limits
	if _, err := n.api.Client.Pods("default").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the sidecar resized in place", func() bool {
		got := n.rt.Resources("web-uid-proxy")
		st := n.pod("web").Status.InitContainerStatuses
		return got != nil && *got.Memory.Limit == 128<<20 && len(st) == 1 && st[0].Resources.Limits.Memory().String() == "128Mi" && st[0].RestartCount == 0
	})
}

// TestNodeRoomOnFakeRuntime: the node's room for requests, as the
// kubelet counts it: a pod bound to it that does not fit is rejected
// (OutOfcpu), and a resize that would take what another pod holds is
// Deferred until that pod goes, then applied.
func TestNodeRoomOnFakeRuntime(t *testing.T) {
	withCPU := func(name, cpu string) *corev1.Pod {
		p := fakePod(name, "app")
		p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}
		return p
	}
	n := newFakeNode(t, withCPU("small", "500m"), withCPU("other", "1"))
	n.m.cfg.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("1Gi"), corev1.ResourcePods: resource.MustParse("110")}
	n.run(t)
	eventually(t, "both Running", func() bool {
		return n.pod("small").Status.Phase == corev1.PodRunning && n.pod("other").Status.Phase == corev1.PodRunning
	})
	big := withCPU("big", "1")
	if _, err := n.api.Client.Pods("default").Create(context.Background(), big, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a pod past the node's room rejected", func() bool {
		p := n.pod("big")
		return p.Status.Phase == corev1.PodFailed && p.Status.Reason == "OutOfcpu" &&
			p.Status.Message == "Pod was rejected: Node didn't have enough resource: cpu, requested: 1000, used: 1500, capacity: 2000"
	})

	p := n.pod("small").DeepCopy()
	p.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU] = resource.MustParse("1500m")
	if _, err := n.api.Client.Pods("default").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the resize deferred", func() bool {
		c := resizeCondition(n.pod("small"))
		return c != nil && c.Reason == corev1.PodReasonDeferred && c.Message == "Node didn't have enough resource: cpu, requested: 1500, used: 1000, capacity: 2000"
	})
	if err := n.api.Client.Pods("default").Delete(context.Background(), "other", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the resize applied once the other pod is gone", func() bool {
		p := n.pod("small")
		return resizeCondition(p) == nil && statusOf(p, "app").AllocatedResources.Cpu().String() == "1500m"
	})
}
