package api_test

import (
	"context"
	"strings"
	"testing"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestHorizontalPodAutoscalerVersions: an autoscaler is one object served
// as autoscaling/v2 and v1, as Kubernetes serves it: v2's defaults (min 1,
// CPU at 80%, a behavior's missing rules), v1's CPU target, the metrics v1
// cannot say kept through a v1 read and write, and Kubernetes' errors.
func TestHorizontalPodAutoscalerVersions(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	v2, v1 := ts.client.AutoscalingV2().HorizontalPodAutoscalers("default"), ts.client.AutoscalingV1().HorizontalPodAutoscalers("default")
	ref := autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "web"}
	got, err := v2.Create(ctx, &autoscalingv2.HorizontalPodAutoscaler{ObjectMeta: metav1.ObjectMeta{Name: "plain"},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{ScaleTargetRef: ref, MaxReplicas: 5,
			Behavior: &autoscalingv2.HorizontalPodAutoscalerBehavior{ScaleDown: &autoscalingv2.HPAScalingRules{StabilizationWindowSeconds: ptr.To[int32](30)}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ptr.Deref(got.Spec.MinReplicas, 0) != 1 || len(got.Spec.Metrics) != 1 || ptr.Deref(got.Spec.Metrics[0].Resource.Target.AverageUtilization, 0) != 80 {
		t.Errorf("v2 defaults: %+v", got.Spec)
	}
	if b := got.Spec.Behavior; *b.ScaleDown.StabilizationWindowSeconds != 30 || len(b.ScaleDown.Policies) != 1 || b.ScaleUp == nil || len(b.ScaleUp.Policies) != 2 {
		t.Errorf("behavior defaults: %+v %+v", b.ScaleUp, b.ScaleDown)
	}
	old, err := v1.Get(ctx, "plain", metav1.GetOptions{})
	if err != nil || ptr.Deref(old.Spec.TargetCPUUtilizationPercentage, 0) != 80 || old.Spec.MaxReplicas != 5 {
		t.Fatalf("read as v1: %+v, %v", old, err)
	}

	// Memory as well as CPU: v1 shows CPU, and keeps memory in an annotation
	// that a v1 update carries back.
	both := &autoscalingv2.HorizontalPodAutoscaler{ObjectMeta: metav1.ObjectMeta{Name: "both"}, Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
		ScaleTargetRef: ref, MaxReplicas: 4, Metrics: []autoscalingv2.MetricSpec{
			{Type: autoscalingv2.ResourceMetricSourceType, Resource: &autoscalingv2.ResourceMetricSource{Name: corev1.ResourceMemory,
				Target: autoscalingv2.MetricTarget{Type: autoscalingv2.AverageValueMetricType, AverageValue: ptr.To(resource.MustParse("100Mi"))}}},
			{Type: autoscalingv2.ResourceMetricSourceType, Resource: &autoscalingv2.ResourceMetricSource{Name: corev1.ResourceCPU,
				Target: autoscalingv2.MetricTarget{Type: autoscalingv2.UtilizationMetricType, AverageUtilization: ptr.To[int32](60)}}}}}}
	if _, err := v2.Create(ctx, both, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	asV1, err := v1.Get(ctx, "both", metav1.GetOptions{})
	if err != nil || ptr.Deref(asV1.Spec.TargetCPUUtilizationPercentage, 0) != 60 || !strings.Contains(asV1.Annotations["autoscaling.alpha.kubernetes.io/metrics"], "memory") {
		t.Fatalf("v1 of a memory and CPU autoscaler: %+v, %v", asV1, err)
	}
	asV1.Spec.MaxReplicas = 6
	if _, err := v1.Update(ctx, asV1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	back, err := v2.Get(ctx, "both", metav1.GetOptions{})
	if err != nil || back.Spec.MaxReplicas != 6 || len(back.Spec.Metrics) != 2 || back.Spec.Metrics[0].Resource.Name != corev1.ResourceMemory ||
		back.Spec.Metrics[0].Resource.Target.AverageValue.String() != "100Mi" || len(back.Annotations) != 0 {
		t.Fatalf("v2 after a v1 update: %+v (annotations %v), %v", back.Spec, back.Annotations, err)
	}
	created, err := v1.Create(ctx, &autoscalingv1.HorizontalPodAutoscaler{ObjectMeta: metav1.ObjectMeta{Name: "old"}, Spec: autoscalingv1.HorizontalPodAutoscalerSpec{
		ScaleTargetRef: autoscalingv1.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "web"}, MaxReplicas: 3,
		TargetCPUUtilizationPercentage: ptr.To[int32](70)}}, metav1.CreateOptions{})
	if err != nil || ptr.Deref(created.Spec.MinReplicas, 0) != 1 {
		t.Fatalf("a v1 create: %+v, %v", created, err)
	}
	if n, err := v2.Get(ctx, "old", metav1.GetOptions{}); err != nil || ptr.Deref(n.Spec.Metrics[0].Resource.Target.AverageUtilization, 0) != 70 {
		t.Fatalf("a v1 autoscaler read as v2: %+v, %v", n, err)
	}

	k := newKubectl(t, ts)
	if out := k.run("get", "hpa"); !strings.Contains(out, "TARGETS") || !strings.Contains(out, "Deployment/web") ||
		!strings.Contains(out, "memory: <unknown>/100Mi, cpu: <unknown>/60%") {
		t.Errorf("kubectl get hpa:\n%s", out)
	}

	for _, bad := range []struct {
		name string
		mut  func(*autoscalingv2.HorizontalPodAutoscalerSpec)
		want string
	}{
		{"no target kind", func(s *autoscalingv2.HorizontalPodAutoscalerSpec) { s.ScaleTargetRef.Kind = "" }, "spec.scaleTargetRef.kind: Required value"},
		{"min above max", func(s *autoscalingv2.HorizontalPodAutoscalerSpec) { s.MinReplicas = ptr.To[int32](5) }, "spec.maxReplicas: Invalid value: 3: must be greater than or equal to `minReplicas`"},
		{"zero min", func(s *autoscalingv2.HorizontalPodAutoscalerSpec) { s.MinReplicas = ptr.To[int32](0) }, "spec.minReplicas: Invalid value: 0: must be greater than or equal to 1"},
		{"zero utilization", func(s *autoscalingv2.HorizontalPodAutoscalerSpec) {
			s.Metrics = []autoscalingv2.MetricSpec{{Type: autoscalingv2.ResourceMetricSourceType, Resource: &autoscalingv2.ResourceMetricSource{Name: corev1.ResourceCPU,
				Target: autoscalingv2.MetricTarget{Type: autoscalingv2.UtilizationMetricType, AverageUtilization: ptr.To[int32](0)}}}}
		}, "spec.metrics[0].resource.target.averageUtilization: Invalid value: 0: must be greater than 0"},
		{"a metric type without its source", func(s *autoscalingv2.HorizontalPodAutoscalerSpec) {
			s.Metrics = []autoscalingv2.MetricSpec{{Type: autoscalingv2.PodsMetricSourceType}}
		}, "spec.metrics[0].pods: Required value: must populate information for the given metric source"},
		{"a policy without period", func(s *autoscalingv2.HorizontalPodAutoscalerSpec) {
			s.Behavior = &autoscalingv2.HorizontalPodAutoscalerBehavior{ScaleUp: &autoscalingv2.HPAScalingRules{Policies: []autoscalingv2.HPAScalingPolicy{{Type: autoscalingv2.PodsScalingPolicy, Value: 1}}}}
		}, "spec.behavior.scaleUp.policies[0].periodSeconds: Invalid value: 0: must be greater than zero"},
	} {
		h := &autoscalingv2.HorizontalPodAutoscaler{ObjectMeta: metav1.ObjectMeta{Name: "bad"}, Spec: autoscalingv2.HorizontalPodAutoscalerSpec{ScaleTargetRef: ref, MaxReplicas: 3}}
		bad.mut(&h.Spec)
		if _, err := v2.Create(ctx, h, metav1.CreateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: %v", bad.name, err)
		}
	}
}
