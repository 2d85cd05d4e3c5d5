package podautoscaler

import (
	"testing"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// pod is a running pod requesting 100m CPU, ready since long before t0
// unless said otherwise.
func pod(name string, mut func(*corev1.Pod)) *corev1.Pod {
	started := metav1.NewTime(t0.Add(-time.Hour))
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app",
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, StartTime: &started,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: started}}}}
	if mut != nil {
		mut(p)
	}
	return p
}

func usage(values map[string]int64) podMetrics {
	out := podMetrics{}
	for name, v := range values {
		out[name] = podMetric{Timestamp: t0, Window: 15 * time.Second, Value: v}
	}
	return out
}

// TestUtilizationReplicas: Kubernetes' arithmetic, case by case (the
// expectations are what kube-controller-manager's replica calculator
// gives for the same pods and samples).
func TestUtilizationReplicas(t *testing.T) {
	unready := func(p *corev1.Pod) {
		p.Status.Conditions[0].Status = corev1.ConditionFalse
		p.Status.Conditions[0].LastTransitionTime = metav1.NewTime(t0.Add(-time.Hour))
	}
	pending := func(p *corev1.Pod) { p.Status.Phase = corev1.PodPending }
	deleting := func(p *corev1.Pod) { p.DeletionTimestamp = ptr.To(metav1.NewTime(t0)) }
	cases := []struct {
		name      string
		current   int32
		target    int32
		pods      []*corev1.Pod
		metrics   map[string]int64
		want      int32
		wantUtil  int32
		wantError bool
	}{
		{"up from one pod at 200%", 1, 50, []*corev1.Pod{pod("a", nil)}, map[string]int64{"a": 200}, 4, 200, false},
		{"within the tolerance", 3, 50, []*corev1.Pod{pod("a", nil), pod("b", nil), pod("c", nil)},
			map[string]int64{"a": 52, "b": 55, "c": 50}, 3, 52, false},
		{"down to what is needed", 4, 50, []*corev1.Pod{pod("a", nil), pod("b", nil), pod("c", nil), pod("d", nil)},
			map[string]int64{"a": 10, "b": 10, "c": 10, "d": 10}, 1, 10, false},
		// A missing pod counts as using its whole request on a way down:
		// 3 pods at 20% and one at 100% is 40% of 50%: ceil(0.8 * 4) = 4,
		// which is no scale-down.
		{"missing pod on a way down", 4, 50, []*corev1.Pod{pod("a", nil), pod("b", nil), pod("c", nil), pod("d", nil)},
			map[string]int64{"a": 20, "b": 20, "c": 20}, 4, 20, false},
		// An unready pod counts as 0% on a way up: 2 pods at 150% and one
		// at 0 is 100%: ceil(2 * 3) = 6.
		{"unready pod on a way up", 3, 50, []*corev1.Pod{pod("a", nil), pod("b", nil), pod("c", unready)},
			map[string]int64{"a": 150, "b": 150, "c": 150}, 6, 150, false},
		// A pending pod is taken at 0% on a way up, as the load it will
		// take: one pod at 200% of target and one pending is at target.
		{"pending pod on a way up", 2, 50, []*corev1.Pod{pod("a", nil), pod("b", pending)},
			map[string]int64{"a": 100}, 2, 100, false},
		{"pods being deleted are ignored", 2, 50, []*corev1.Pod{pod("a", nil), pod("b", deleting)},
			map[string]int64{"a": 100, "b": 900}, 2, 100, false},
		{"no pods", 1, 50, nil, nil, 0, 0, true},
		{"no samples", 1, 50, []*corev1.Pod{pod("a", nil)}, map[string]int64{}, 0, 0, true},
		{"a container without request", 1, 50, []*corev1.Pod{pod("a", func(p *corev1.Pod) { p.Spec.Containers[0].Resources = corev1.ResourceRequirements{} })},
			map[string]int64{"a": 100}, 0, 0, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, util, _, err := utilizationReplicas(c.current, c.target, usage(c.metrics), c.pods, "", corev1.ResourceCPU, t0)
			if c.wantError {
				if err == nil {
					t.Fatalf("want an error, got %d replicas", got)
				}
				return
			}
			if err != nil || got != c.want || util != c.wantUtil {
				t.Fatalf("got %d replicas at %d%% (%v), want %d at %d%%", got, util, err, c.want, c.wantUtil)
			}
		})
	}
	_, _, _, err := utilizationReplicas(1, 50, usage(map[string]int64{"a": 1}), []*corev1.Pod{pod("a", func(p *corev1.Pod) { p.Spec.Containers[0].Resources = corev1.ResourceRequirements{} })}, "", corev1.ResourceCPU, t0)
	if err == nil || err.Error() != "missing request for cpu in container app of Pod a" {
		t.Errorf("missing request: %v", err)
	}
}

// TestFreshPodsCPU: a pod within its first five minutes whose sample
// predates a full window of readiness is not trusted (startup CPU).
func TestFreshPodsCPU(t *testing.T) {
	fresh := pod("b", func(p *corev1.Pod) {
		p.Status.StartTime = ptr.To(metav1.NewTime(t0.Add(-time.Minute)))
		p.Status.Conditions[0].LastTransitionTime = metav1.NewTime(t0.Add(-5 * time.Second))
	})
	got, _, _, err := utilizationReplicas(2, 50, usage(map[string]int64{"a": 50, "b": 500}), []*corev1.Pod{pod("a", nil), fresh}, "", corev1.ResourceCPU, t0)
	if err != nil || got != 2 {
		t.Errorf("a fresh pod's startup burst scaled: %d, %v", got, err)
	}
	// Memory has no such doubt.
	got, _, err = valueReplicas(2, 100, usage(map[string]int64{"a": 100, "b": 500}), []*corev1.Pod{pod("a", nil), fresh}, corev1.ResourceMemory, t0)
	if err != nil || got != 6 {
		t.Errorf("memory average 300 over a target of 100 on 2 pods: %d, %v", got, err)
	}
}

type recorded struct {
	reasons map[autoscalingv2.HorizontalPodAutoscalerConditionType]string
}

func (r *recorded) conds() conditions {
	r.reasons = map[autoscalingv2.HorizontalPodAutoscalerConditionType]string{}
	return conditions{set: func(t autoscalingv2.HorizontalPodAutoscalerConditionType, _ corev1.ConditionStatus, reason, _ string) {
		r.reasons[t] = reason
	}}
}

// TestDownscaleWindow: without behavior, the highest recommendation of the
// last five minutes holds, on a stepped clock; scale-ups are at most
// double (or 4) at a time; min and max bound it.
func TestDownscaleWindow(t *testing.T) {
	h, r := newHistory(), &recorded{}
	now := t0
	if got := h.normalize("ns/a", 4, 8, 1, 10, now, r.conds()); got != 8 || r.reasons[autoscalingv2.ScalingLimited] != "DesiredWithinRange" {
		t.Fatalf("up to 8: %d %v", got, r.reasons)
	}
	now = now.Add(time.Minute)
	if got := h.normalize("ns/a", 8, 2, 1, 10, now, r.conds()); got != 8 || r.reasons[autoscalingv2.AbleToScale] != "ScaleDownStabilized" {
		t.Fatalf("down a minute after: %d %v", got, r.reasons)
	}
	now = now.Add(5 * time.Minute)
	if got := h.normalize("ns/a", 8, 2, 1, 10, now, r.conds()); got != 2 {
		t.Fatalf("down past the window: %d", got)
	}
	if got := h.normalize("ns/b", 2, 20, 1, 30, now, r.conds()); got != 4 || r.reasons[autoscalingv2.ScalingLimited] != "ScaleUpLimit" {
		t.Fatalf("2 to 20 at once: %d %v", got, r.reasons)
	}
	if got := h.normalize("ns/c", 5, 20, 1, 8, now, r.conds()); got != 8 || r.reasons[autoscalingv2.ScalingLimited] != "TooManyReplicas" {
		t.Fatalf("beyond max: %d %v", got, r.reasons)
	}
}

// TestBehavior: the policies and windows of a behavior, on a stepped
// clock, as Kubernetes applies them.
func TestBehavior(t *testing.T) {
	rules := func(window int32, policies ...autoscalingv2.HPAScalingPolicy) *autoscalingv2.HPAScalingRules {
		return &autoscalingv2.HPAScalingRules{StabilizationWindowSeconds: &window, SelectPolicy: ptr.To(autoscalingv2.MaxChangePolicySelect), Policies: policies}
	}
	pods := func(n, period int32) autoscalingv2.HPAScalingPolicy {
		return autoscalingv2.HPAScalingPolicy{Type: autoscalingv2.PodsScalingPolicy, Value: n, PeriodSeconds: period}
	}
	percent := func(n, period int32) autoscalingv2.HPAScalingPolicy {
		return autoscalingv2.HPAScalingPolicy{Type: autoscalingv2.PercentScalingPolicy, Value: n, PeriodSeconds: period}
	}
	// Up by at most 2 pods a minute; down by at most 50% a minute after a
	// 60 s window.
	b := &autoscalingv2.HorizontalPodAutoscalerBehavior{ScaleUp: rules(0, pods(2, 60)), ScaleDown: rules(60, percent(50, 60))}
	h, r := newHistory(), &recorded{}
	now, key := t0, "ns/web"
	step := func(current, desired, want int32, reason string) {
		t.Helper()
		got := h.normalizeWithBehavior(key, b, current, desired, 1, 20, now, r.conds())
		if got != want || (reason != "" && r.reasons[autoscalingv2.ScalingLimited] != reason) {
			t.Fatalf("at +%v, %d wanting %d: got %d (%v), want %d %s", now.Sub(t0), current, desired, got, r.reasons, want, reason)
		}
		h.recordScale(key, b, current, got, now)
	}
	step(2, 10, 4, "ScaleUpLimit")
	now = now.Add(30 * time.Second)
	step(4, 10, 4, "ScaleUpLimit") // the 2 pods of this minute are spent
	now = now.Add(31 * time.Second)
	step(4, 10, 6, "ScaleUpLimit")
	// Down: held by the window first (recommendations of 10 in the last 60 s).
	now = now.Add(10 * time.Second)
	step(6, 1, 6, "")
	if r.reasons[autoscalingv2.AbleToScale] != "ScaleDownStabilized" {
		t.Errorf("within the window: %v", r.reasons)
	}
	now = now.Add(61 * time.Second)
	step(6, 1, 3, "ScaleDownLimit") // 50% of 6 in a minute
	now = now.Add(61 * time.Second)
	step(3, 1, 1, "DesiredWithinRange")

	// Disabled scale-down holds.
	off := &autoscalingv2.HorizontalPodAutoscalerBehavior{ScaleUp: rules(0, pods(4, 15)), ScaleDown: &autoscalingv2.HPAScalingRules{
		StabilizationWindowSeconds: ptr.To[int32](0), SelectPolicy: ptr.To(autoscalingv2.DisabledPolicySelect), Policies: []autoscalingv2.HPAScalingPolicy{percent(100, 15)}}}
	if got := h.normalizeWithBehavior("ns/off", off, 5, 1, 1, 10, now, r.conds()); got != 5 {
		t.Errorf("scale-down disabled: %d", got)
	}
}
