package podautoscaler

import (
	"math"
	"sync"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
)

// defaultDownscaleWindow is how long a lower recommendation must last
// before an autoscaler without behavior scales down (kube-controller-
// manager's --horizontal-pod-autoscaler-downscale-stabilization).
const defaultDownscaleWindow = 5 * time.Minute

type recommendation struct {
	replicas int32
	at       time.Time
}

type scaleEvent struct {
	change int32
	at     time.Time
}

// history is what the autoscaler remembers of each autoscaler between
// syncs: its recent recommendations (for the stabilization windows) and
// scale events (for the rate policies), in memory as in Kubernetes.
type history struct {
	mu              sync.Mutex
	recommendations map[string][]recommendation
	ups, downs      map[string][]scaleEvent
}

func newHistory() *history {
	return &history{recommendations: map[string][]recommendation{}, ups: map[string][]scaleEvent{}, downs: map[string][]scaleEvent{}}
}

func (h *history) forget(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.recommendations, key)
	delete(h.ups, key)
	delete(h.downs, key)
}

// record keeps a recommendation, reusing the slot of one past every window.
func (h *history) record(key string, replicas int32, now time.Time, old func(time.Time) bool) {
	recs := h.recommendations[key]
	for i := range recs {
		if old(recs[i].at) {
			recs[i] = recommendation{replicas, now}
			return
		}
	}
	h.recommendations[key] = append(recs, recommendation{replicas, now})
}

// conditions sets the autoscaler's conditions as its sync finds them.
type conditions struct {
	set func(t autoscalingv2.HorizontalPodAutoscalerConditionType, status corev1.ConditionStatus, reason, message string)
}

// normalize is Kubernetes' normalizeDesiredReplicas, for an autoscaler
// without behavior: the highest recommendation of the last five minutes,
// within min and max and at most double (or 4) the current replicas.
func (h *history) normalize(key string, current, desired, minReplicas, maxReplicas int32, now time.Time, c conditions) int32 {
	h.mu.Lock()
	stabilized := desired
	cutoff := now.Add(-defaultDownscaleWindow)
	for _, r := range h.recommendations[key] {
		if !r.at.Before(cutoff) && r.replicas > stabilized {
			stabilized = r.replicas
		}
	}
	h.record(key, desired, now, func(t time.Time) bool { return t.Before(cutoff) })
	h.mu.Unlock()
	if stabilized != desired {
		c.set(autoscalingv2.AbleToScale, corev1.ConditionTrue, "ScaleDownStabilized", "recent recommendations were higher than current one, applying the highest recent recommendation")
	} else {
		c.set(autoscalingv2.AbleToScale, corev1.ConditionTrue, "ReadyForNewScale", "recommended size matches current size")
	}
	limit := max(2*current, 4)
	maxAllowed, reason, message := maxReplicas, "TooManyReplicas", "the desired replica count is more than the maximum replica count"
	if maxReplicas > limit {
		maxAllowed, reason, message = limit, "ScaleUpLimit", "the desired replica count is increasing faster than the maximum scale rate"
	}
	out := stabilized
	switch {
	case stabilized < minReplicas:
		out, reason, message = minReplicas, "TooFewReplicas", "the desired replica count is less than the minimum replica count"
	case stabilized > maxAllowed:
		out = maxAllowed
	default:
		reason, message = "DesiredWithinRange", "the desired count is within the acceptable range"
	}
	c.set(autoscalingv2.ScalingLimited, limitedStatus(out != stabilized), reason, message)
	return out
}

func limitedStatus(limited bool) corev1.ConditionStatus {
	if limited {
		return corev1.ConditionTrue
	}
	return corev1.ConditionFalse
}

// normalizeWithBehavior is Kubernetes' normalizeDesiredReplicasWithBehaviors:
// the recommendation held within the lowest of the scale-up window and
// the highest of the scale-down window, then limited by the rate policies
// over the scale events of their periods, and min and max.
func (h *history) normalizeWithBehavior(key string, b *autoscalingv2.HorizontalPodAutoscalerBehavior, current, desired, minReplicas, maxReplicas int32, now time.Time, c conditions) int32 {
	up, down := b.ScaleUp, b.ScaleDown
	upCutoff := now.Add(-time.Duration(*up.StabilizationWindowSeconds) * time.Second)
	downCutoff := now.Add(-time.Duration(*down.StabilizationWindowSeconds) * time.Second)
	h.mu.Lock()
	upRec, downRec := desired, desired
	for _, r := range h.recommendations[key] {
		if r.at.After(upCutoff) {
			upRec = min(upRec, r.replicas)
		}
		if r.at.After(downCutoff) {
			downRec = max(downRec, r.replicas)
		}
	}
	stabilized := max(current, upRec)
	stabilized = min(stabilized, downRec)
	h.record(key, desired, now, func(t time.Time) bool { return t.Before(upCutoff) && t.Before(downCutoff) })
	ups, downs := h.ups[key], h.downs[key]
	h.mu.Unlock()
	if stabilized != desired {
		if desired >= current {
			c.set(autoscalingv2.AbleToScale, corev1.ConditionTrue, "ScaleUpStabilized", "recent recommendations were lower than current one, applying the lowest recent recommendation")
		} else {
			c.set(autoscalingv2.AbleToScale, corev1.ConditionTrue, "ScaleDownStabilized", "recent recommendations were higher than current one, applying the highest recent recommendation")
		}
	} else {
		c.set(autoscalingv2.AbleToScale, corev1.ConditionTrue, "ReadyForNewScale", "recommended size matches current size")
	}
	out, reason, message := stabilized, "DesiredWithinRange", "the desired count is within the acceptable range"
	switch {
	case stabilized > current:
		limit := max(scaleUpLimit(current, ups, up, now), current)
		maxAllowed, why, msg := maxReplicas, "TooManyReplicas", "the desired replica count is more than the maximum replica count"
		if maxAllowed > limit {
			maxAllowed, why, msg = limit, "ScaleUpLimit", "the desired replica count is increasing faster than the maximum scale rate"
		}
		if stabilized > maxAllowed {
			out, reason, message = maxAllowed, why, msg
		}
	case stabilized < current:
		limit := min(scaleDownLimit(current, downs, down, now), current)
		minAllowed, why, msg := minReplicas, "TooFewReplicas", "the desired replica count is less than the minimum replica count"
		if minAllowed < limit {
			minAllowed, why, msg = limit, "ScaleDownLimit", "the desired replica count is decreasing faster than the maximum scale rate"
		}
		if stabilized < minAllowed {
			out, reason, message = minAllowed, why, msg
		}
	}
	c.set(autoscalingv2.ScalingLimited, limitedStatus(out != stabilized), reason, message)
	return out
}

// changeInPeriod sums the scale events of the last period.
func changeInPeriod(periodSeconds int32, events []scaleEvent, now time.Time) int32 {
	cutoff := now.Add(-time.Duration(periodSeconds) * time.Second)
	var sum int32
	for _, e := range events {
		if e.at.After(cutoff) {
			sum += e.change
		}
	}
	return sum
}

func scaleUpLimit(current int32, events []scaleEvent, rules *autoscalingv2.HPAScalingRules, now time.Time) int32 {
	if rules.SelectPolicy != nil && *rules.SelectPolicy == autoscalingv2.DisabledPolicySelect {
		return current
	}
	pick, result := larger, int32(math.MinInt32)
	if rules.SelectPolicy != nil && *rules.SelectPolicy == autoscalingv2.MinChangePolicySelect {
		pick, result = smaller, math.MaxInt32
	}
	for _, p := range rules.Policies {
		start := current - changeInPeriod(p.PeriodSeconds, events, now)
		var proposed int32
		switch p.Type {
		case autoscalingv2.PodsScalingPolicy:
			proposed = start + p.Value
		case autoscalingv2.PercentScalingPolicy:
			proposed = int32(math.Ceil(float64(start) * (1 + float64(p.Value)/100)))
		}
		result = pick(result, proposed)
	}
	return result
}

func scaleDownLimit(current int32, events []scaleEvent, rules *autoscalingv2.HPAScalingRules, now time.Time) int32 {
	if rules.SelectPolicy != nil && *rules.SelectPolicy == autoscalingv2.DisabledPolicySelect {
		return current
	}
	// Scaling down, the smallest change is the highest count.
	pick, result := smaller, int32(math.MaxInt32)
	if rules.SelectPolicy != nil && *rules.SelectPolicy == autoscalingv2.MinChangePolicySelect {
		pick, result = larger, math.MinInt32
	}
	for _, p := range rules.Policies {
		start := current + changeInPeriod(p.PeriodSeconds, events, now)
		var proposed int32
		switch p.Type {
		case autoscalingv2.PodsScalingPolicy:
			proposed = start - p.Value
		case autoscalingv2.PercentScalingPolicy:
			proposed = int32(float64(start) * (1 - float64(p.Value)/100))
		}
		result = pick(result, proposed)
	}
	return result
}

// recordScale keeps a scale event for the rate policies of an autoscaler
// with behavior, reusing the slot of one older than its longest period.
func (h *history) recordScale(key string, b *autoscalingv2.HorizontalPodAutoscalerBehavior, from, to int32, now time.Time) {
	if b == nil || from == to {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	events, rules, change := h.ups, b.ScaleUp, to-from
	if to < from {
		events, rules, change = h.downs, b.ScaleDown, from-to
	}
	var longest int32
	for _, p := range rules.Policies {
		longest = max(longest, p.PeriodSeconds)
	}
	cutoff := now.Add(-time.Duration(longest) * time.Second)
	list := events[key]
	for i := range list {
		if list[i].at.Before(cutoff) {
			list[i] = scaleEvent{change: change, at: now}
			return
		}
	}
	events[key] = append(list, scaleEvent{change: change, at: now})
}

func larger(a, b int32) int32  { return max(a, b) }
func smaller(a, b int32) int32 { return min(a, b) }
