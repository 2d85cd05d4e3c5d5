package api_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api/apitest"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// BenchmarkEviction1000Budgets: evictions of ready pods, each under one
// of 1,000 disruption budgets in its namespace (which every eviction
// lists and matches), through the API over HTTPS with client-go: the
// budget's status taken, the pod marked and deleted. Target: p99 under
// 50 ms.
func BenchmarkEviction1000Budgets(b *testing.B) {
	srv := apitest.Start(b)
	ctx := context.Background()
	const budgets, evictions = 1000, 200
	for i := range budgets {
		app := map[string]string{"app": fmt.Sprintf("app-%d", i)}
		p := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("app-%d", i)},
			Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)), Selector: &metav1.LabelSelector{MatchLabels: app}}}
		created, err := srv.Client.PolicyV1().PodDisruptionBudgets("default").Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		// As the disruption loop would have it: room for many evictions.
		created.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: created.Generation, DisruptionsAllowed: 1000, CurrentHealthy: 1001, DesiredHealthy: 1, ExpectedPods: 1001}
		if _, err := srv.Client.PolicyV1().PodDisruptionBudgets("default").UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		names := make([]string, evictions)
		for i := range evictions {
			names[i] = fmt.Sprintf("p-%d-%d", time.Now().UnixNano(), i)
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: names[i], Labels: map[string]string{"app": fmt.Sprintf("app-%d", i%budgets)}},
				Spec: corev1.PodSpec{NodeName: "n1", TerminationGracePeriodSeconds: ptr.To[int64](0), Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
			created, err := srv.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
			if err != nil {
				b.Fatal(err)
			}
			created.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
			if _, err := srv.Client.CoreV1().Pods("default").UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		lat := make([]time.Duration, 0, evictions)
		for _, name := range names {
			start := time.Now()
			if err := srv.Client.PolicyV1().Evictions("default").Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	}
}
