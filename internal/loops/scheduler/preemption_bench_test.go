package scheduler

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// BenchmarkPreemption5000: the victim search for one high-priority pod on
// 5,000 full nodes of 4 CPUs, each running eight 500m pods of mixed low
// priorities, with 100 disruption budgets over them: what kube-scheduler's
// PostFilter does before it nominates. Target: p99 under 100 ms.
func BenchmarkPreemption5000(b *testing.B) {
	c := newCache()
	for i := range 5000 {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%05d", i)}, Status: corev1.NodeStatus{
			Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi"), corev1.ResourcePods: resource.MustParse("110")},
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
		c.setNode(node)
		for j := range 8 {
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%05d-%d", i, j), Namespace: "default", UID: types.UID(fmt.Sprintf("uid-%05d-%d", i, j)),
				Labels: map[string]string{"app": fmt.Sprintf("app-%d", (i*8+j)%100)}},
				Spec: corev1.PodSpec{Priority: ptr.To(int32(j % 3)), Containers: []corev1.Container{{Name: "c",
					Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m")}}}}},
				Status: corev1.PodStatus{StartTime: ptr.To(metav1.NewTime(time.Unix(int64(i*8+j), 0)))}}
			c.place(p, node.Name)
		}
	}
	var budgets []*policyv1.PodDisruptionBudget
	for i := range 100 {
		budgets = append(budgets, &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("app-%d", i), Namespace: "default"},
			Spec:   policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app-%d", i)}}},
			Status: policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: 3}})
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "urgent", Namespace: "default", UID: "urgent"}, Spec: corev1.PodSpec{Priority: ptr.To[int32](1000),
		Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}}}}}
	pc, err := newPodContext(pod)
	if err != nil {
		b.Fatal(err)
	}
	var lat []time.Duration
	b.ResetTimer()
	for range b.N {
		for range 20 {
			start := time.Now()
			cand, ok := c.findVictims(pc, budgets)
			lat = append(lat, time.Since(start))
			if !ok || len(cand.victims) != 2 {
				b.Fatalf("victims: %v %d", ok, len(cand.victims))
			}
		}
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}
