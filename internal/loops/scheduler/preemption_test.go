package scheduler_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/loops/hollow"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
)

func (f *fixture) classes(values map[string]int32) {
	f.t.Helper()
	for name, v := range values {
		pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: v}
		if _, err := f.client.SchedulingV1().PriorityClasses().Create(f.ctx, pc, metav1.CreateOptions{}); err != nil {
			f.t.Fatal(err)
		}
	}
}

func classed(name, cpu, class string, labels map[string]string) *corev1.Pod {
	p := pod(name, cpu)
	p.Spec.PriorityClassName = class
	p.OwnerReferences = nil
	p.Labels = labels
	return p
}

// gone waits until the named pod no longer exists.
func (f *fixture) gone(name string) {
	f.t.Helper()
	err := wait.PollUntilContextTimeout(f.ctx, 20*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := f.client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		return err != nil, nil
	})
	if err != nil {
		f.t.Fatalf("%s never went: %v", name, err)
	}
}

func (f *fixture) boundTo(name string) string {
	f.t.Helper()
	var node string
	err := wait.PollUntilContextTimeout(f.ctx, 20*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := f.client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		node = p.Spec.NodeName
		return err == nil && node != "", nil
	})
	if err != nil {
		f.t.Fatalf("%s never bound: %v", name, err)
	}
	return node
}

// TestPreemption: on a full node, a pod of higher priority has the fewest
// lower-priority pods evicted (the least important: lowest priority,
// started last) and takes their room; the victims are marked
// DisruptionTarget and told by an event; a pod that may not preempt
// (preemptionPolicy Never) waits; pods of equal priority are never
// victims — kube-scheduler's DefaultPreemption.
func TestPreemption(t *testing.T) {
	f := start(t, map[string]hollow.NodeOptions{"n1": {CPU: "1"}})
	f.classes(map[string]int32{"low": 10, "lower": 5, "high": 1000})
	never := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "high-polite"}, Value: 1000, PreemptionPolicy: ptr.To(corev1.PreemptNever)}
	if _, err := f.client.SchedulingV1().PriorityClasses().Create(f.ctx, never, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.create(classed("low-1", "400m", "low", nil), classed("lower-1", "400m", "lower", nil))
	f.placement(2)

	f.create(classed("polite", "500m", "high-polite", nil))
	f.unschedulable("polite")

	f.create(classed("urgent", "500m", "high", nil))
	f.gone("lower-1")
	if node := f.boundTo("urgent"); node != "n1" {
		t.Fatalf("urgent on %q", node)
	}
	if _, err := f.client.CoreV1().Pods("default").Get(f.ctx, "low-1", metav1.GetOptions{}); err != nil {
		t.Errorf("a second victim was taken: %v", err)
	}
	evs, err := f.client.CoreV1().Events("default").List(f.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=lower-1"})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range evs.Items {
		found = found || e.Reason == "Preempted"
	}
	if !found {
		t.Errorf("no Preempted event on the victim: %+v", evs.Items)
	}
	// The polite pod still waits: nothing of lower priority is left but low-1, and it may not take it.
	if p, _ := f.client.CoreV1().Pods("default").Get(f.ctx, "polite", metav1.GetOptions{}); p.Spec.NodeName != "" || p.Status.NominatedNodeName != "" {
		t.Errorf("a preemptionPolicy Never pod was placed or nominated: %q %q", p.Spec.NodeName, p.Status.NominatedNodeName)
	}
}

// TestPreemptionRespectsBudgets: with a victim on each of two nodes, the
// one a disruption budget protects is spared.
func TestPreemptionRespectsBudgets(t *testing.T) {
	f := start(t, map[string]hollow.NodeOptions{"n1": {CPU: "1"}, "n2": {CPU: "1"}})
	f.classes(map[string]int32{"low": 10, "high": 1000})
	db := classed("db", "800m", "low", map[string]string{"app": "db"})
	db.Spec.NodeName = "n1"
	cache := classed("cache", "800m", "low", map[string]string{"app": "cache"})
	cache.Spec.NodeName = "n2"
	f.create(db, cache)
	budget := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "default"}, Spec: policyv1.PodDisruptionBudgetSpec{
		MinAvailable: ptr.To(intstr.FromInt32(1)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}}}
	if _, err := f.client.PolicyV1().PodDisruptionBudgets("default").Create(f.ctx, budget, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the scheduler's informer sees the budget
	urgent := classed("urgent", "500m", "high", nil)
	urgent.Spec.Containers[0].Resources.Requests[corev1.ResourceMemory] = resource.MustParse("1Mi")
	f.create(urgent)
	f.gone("cache")
	if node := f.boundTo("urgent"); node != "n2" {
		t.Fatalf("urgent on %q, want n2 (n1's pod is under a budget)", node)
	}
	if _, err := f.client.CoreV1().Pods("default").Get(f.ctx, "db", metav1.GetOptions{}); err != nil {
		t.Errorf("the protected pod was preempted: %v", err)
	}
}

// TestExtendedResources: pods asking for an extended resource (a device
// plugin's, here example.com/gpu) go only where it is free, as
// kube-scheduler's NodeResourcesFit counts it; a higher-priority pod
// preempts for it like for CPU.
func TestExtendedResources(t *testing.T) {
	gpu := corev1.ResourceName("example.com/gpu")
	f := start(t, map[string]hollow.NodeOptions{"n1": {Extended: corev1.ResourceList{gpu: resource.MustParse("2")}}, "n2": {}})
	f.classes(map[string]int32{"low": 10, "high": 1000})
	withGPU := func(name, class string) *corev1.Pod {
		p := classed(name, "", class, nil)
		p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{gpu: resource.MustParse("1")}
		p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{gpu: resource.MustParse("1")}
		return p
	}
	f.create(withGPU("a", "low"), withGPU("b", "low"))
	if node := f.boundTo("a"); node != "n1" {
		t.Errorf("a on %s, the only node with the resource is n1", node)
	}
	if node := f.boundTo("b"); node != "n1" {
		t.Errorf("b on %s", node)
	}
	f.create(withGPU("c", "low"))
	if msg := f.unschedulable("c"); msg != "0/2 nodes are available: 2 Insufficient example.com/gpu." {
		t.Errorf("a third pod: %q", msg)
	}
	f.create(withGPU("urgent", "high"))
	if node := f.boundTo("urgent"); node != "n1" {
		t.Errorf("urgent on %s", node)
	}
}

// TestHighPriorityScheduledFirst: when room frees up for one pod, the
// waiting pod of highest priority takes it, not whichever of a crowd of
// lower ones comes first — and so without evicting anything
// (kube-scheduler's queue pops by priority).
func TestHighPriorityScheduledFirst(t *testing.T) {
	f := start(t, nil)
	f.classes(map[string]int32{"urgent": 1000})
	for i := range 10 {
		f.create(classed(fmt.Sprintf("low-%d", i), "1", "", map[string]string{"app": "batch"}))
	}
	f.create(classed("urgent", "1", "urgent", map[string]string{"app": "urgent"}))
	f.unschedulable("urgent")
	f.addNode("one-slot", hollow.NodeOptions{CPU: "1500m"})
	if node := f.boundTo("urgent"); node != "one-slot" {
		t.Fatalf("urgent bound to %q", node)
	}
	time.Sleep(time.Second)
	list, err := f.client.CoreV1().Pods("default").List(f.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list.Items {
		if p.Name != "urgent" && p.Spec.NodeName != "" {
			t.Errorf("%s bound to %s as well", p.Name, p.Spec.NodeName)
		}
	}
	if len(list.Items) != 11 {
		t.Errorf("%d pods left of 11: the urgent one had to preempt", len(list.Items))
	}
}
