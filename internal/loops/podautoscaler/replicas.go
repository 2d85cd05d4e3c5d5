package podautoscaler

import (
	"errors"
	"fmt"
	"math"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Kubernetes' defaults for the replica arithmetic.
const (
	// Tolerance: a usage within 10% of the target changes nothing.
	Tolerance = 0.1
	// cpuInitializationPeriod: a pod's CPU samples are doubted this long
	// after it starts (startup burns CPU).
	cpuInitializationPeriod = 5 * time.Minute
	// initialReadinessDelay: a pod not ready this soon after starting is
	// taken as one that has never been ready.
	initialReadinessDelay = 30 * time.Second
)

// podMetric is one pod's usage of a resource, in milli-units.
type podMetric struct {
	Timestamp time.Time
	Window    time.Duration
	Value     int64
}

type podMetrics map[string]podMetric

// groupPods sorts the selected pods as Kubernetes' replica calculator
// does: being deleted or failed (ignored), not running or (for CPU) not
// ready or too fresh to trust (unready), without a sample (missing), and
// the ready ones counted.
func groupPods(pods []*corev1.Pod, metrics podMetrics, res corev1.ResourceName, now time.Time) (ready int, unready, missing, ignored map[string]bool) {
	unready, missing, ignored = map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, pod := range pods {
		if pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodFailed {
			ignored[pod.Name] = true
			continue
		}
		if pod.Status.Phase == corev1.PodPending {
			unready[pod.Name] = true
			continue
		}
		metric, found := metrics[pod.Name]
		if !found {
			missing[pod.Name] = true
			continue
		}
		if res == corev1.ResourceCPU {
			cond := readyCondition(pod)
			var notReady bool
			switch {
			case cond == nil || pod.Status.StartTime == nil:
				notReady = true
			case pod.Status.StartTime.Add(cpuInitializationPeriod).After(now):
				// A sample from before it was ready for a whole window is startup's.
				notReady = cond.Status == corev1.ConditionFalse || metric.Timestamp.Before(cond.LastTransitionTime.Add(metric.Window))
			default:
				// Unready and never was: its samples say nothing.
				notReady = cond.Status == corev1.ConditionFalse && pod.Status.StartTime.Add(initialReadinessDelay).After(cond.LastTransitionTime.Time)
			}
			if notReady {
				unready[pod.Name] = true
				continue
			}
		}
		ready++
	}
	return ready, unready, missing, ignored
}

func readyCondition(pod *corev1.Pod) *corev1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == corev1.PodReady {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

// podRequests sums each pod's requests of the resource (of one container
// when container is set), in milli-units; a container without a request
// makes utilization meaningless, an error as Kubernetes says it.
func podRequests(pods []*corev1.Pod, container string, res corev1.ResourceName) (map[string]int64, error) {
	out := make(map[string]int64, len(pods))
	for _, pod := range pods {
		var sum int64
		containers := pod.Spec.Containers
		for _, c := range pod.Spec.InitContainers {
			if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
				containers = append(containers[:len(containers):len(containers)], c)
			}
		}
		for _, c := range containers {
			if container != "" && c.Name != container {
				continue
			}
			req, ok := c.Resources.Requests[res]
			if !ok {
				return nil, fmt.Errorf("missing request for %s in container %s of Pod %s", res, c.Name, pod.Name)
			}
			sum += req.MilliValue()
		}
		out[pod.Name] = sum
	}
	return out, nil
}

// utilizationRatio is the pods' usage over their requests, as a ratio to
// the target utilization; with the utilization (percent) and the raw
// average usage.
func utilizationRatio(metrics podMetrics, requests map[string]int64, target int32) (ratio float64, utilization int32, raw int64, err error) {
	var total, requested, n int64
	for name, m := range metrics {
		req, ok := requests[name]
		if !ok {
			continue
		}
		total += m.Value
		requested += req
		n++
	}
	if requested == 0 {
		return 0, 0, 0, errors.New("no metrics returned matched known pods")
	}
	utilization = int32(total * 100 / requested)
	return float64(utilization) / float64(target), utilization, total / n, nil
}

// usageRatio is the pods' average usage as a ratio to the target.
func usageRatio(metrics podMetrics, target int64) (float64, int64) {
	var total int64
	for _, m := range metrics {
		total += m.Value
	}
	usage := total / int64(len(metrics))
	return float64(usage) / float64(target), usage
}

// utilizationReplicas is Kubernetes' GetResourceReplicas: the replicas
// that bring the ready pods' utilization to the target, with missing pods
// taken at 100% on a scale-down and 0% on a scale-up, unready pods at 0%
// on a scale-up, and no change within the tolerance or when those
// assumptions would turn the direction around.
func utilizationReplicas(current int32, target int32, metrics podMetrics, pods []*corev1.Pod, container string, res corev1.ResourceName, now time.Time) (replicas, utilization int32, raw int64, err error) {
	if len(pods) == 0 {
		return 0, 0, 0, errors.New("no pods returned by selector while calculating replica count")
	}
	ready, unready, missing, ignored := groupPods(pods, metrics, res, now)
	metrics = withoutPods(metrics, ignored, unready)
	if len(metrics) == 0 {
		return 0, 0, 0, errors.New("did not receive metrics for targeted pods (pods might be unready)")
	}
	requests, err := podRequests(pods, container, res)
	if err != nil {
		return 0, 0, 0, err
	}
	ratio, utilization, raw, err := utilizationRatio(metrics, requests, target)
	if err != nil {
		return 0, 0, 0, err
	}
	scaleUpWithUnready := len(unready) > 0 && ratio > 1.0
	if !scaleUpWithUnready && len(missing) == 0 {
		if math.Abs(1.0-ratio) <= Tolerance {
			return current, utilization, raw, nil
		}
		return int32(math.Ceil(ratio * float64(ready))), utilization, raw, nil
	}
	if len(missing) > 0 {
		for name := range missing {
			if ratio < 1.0 {
				metrics[name] = podMetric{Value: requests[name] * int64(max(100, target)) / 100}
			} else if ratio > 1.0 {
				metrics[name] = podMetric{Value: 0}
			}
		}
	}
	if scaleUpWithUnready {
		for name := range unready {
			metrics[name] = podMetric{Value: 0}
		}
	}
	newRatio, _, _, err := utilizationRatio(metrics, requests, target)
	if err != nil {
		return 0, 0, 0, err
	}
	return settle(current, ratio, newRatio, len(metrics)), utilization, raw, nil
}

// valueReplicas is Kubernetes' GetRawResourceReplicas (and the plain
// metric arithmetic): the same over an average usage target.
func valueReplicas(current int32, target int64, metrics podMetrics, pods []*corev1.Pod, res corev1.ResourceName, now time.Time) (replicas int32, usage int64, err error) {
	if len(pods) == 0 {
		return 0, 0, errors.New("no pods returned by selector while calculating replica count")
	}
	ready, unready, missing, ignored := groupPods(pods, metrics, res, now)
	metrics = withoutPods(metrics, ignored, unready)
	if len(metrics) == 0 {
		return 0, 0, errors.New("did not receive metrics for targeted pods (pods might be unready)")
	}
	ratio, usage := usageRatio(metrics, target)
	scaleUpWithUnready := len(unready) > 0 && ratio > 1.0
	if !scaleUpWithUnready && len(missing) == 0 {
		if math.Abs(1.0-ratio) <= Tolerance {
			return current, usage, nil
		}
		return int32(math.Ceil(ratio * float64(ready))), usage, nil
	}
	for name := range missing {
		if ratio < 1.0 {
			metrics[name] = podMetric{Value: target}
		} else {
			metrics[name] = podMetric{Value: 0}
		}
	}
	if scaleUpWithUnready {
		for name := range unready {
			metrics[name] = podMetric{Value: 0}
		}
	}
	newRatio, _ := usageRatio(metrics, target)
	return settle(current, ratio, newRatio, len(metrics)), usage, nil
}

// settle is the end of both: no change within the tolerance, or when the
// assumed usage or the number of pods counted turns the direction around.
func settle(current int32, ratio, newRatio float64, counted int) int32 {
	if math.Abs(1.0-newRatio) <= Tolerance || (ratio < 1.0 && newRatio > 1.0) || (ratio > 1.0 && newRatio < 1.0) {
		return current
	}
	replicas := int32(math.Ceil(newRatio * float64(counted)))
	if (newRatio < 1.0 && replicas > current) || (newRatio > 1.0 && replicas < current) {
		return current
	}
	return replicas
}

// withoutPods is a copy of metrics without the named pods.
func withoutPods(metrics podMetrics, drop ...map[string]bool) podMetrics {
	out := make(podMetrics, len(metrics))
outer:
	for name, m := range metrics {
		for _, d := range drop {
			if d[name] {
				continue outer
			}
		}
		out[name] = m
	}
	return out
}
