package job

import (
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// A Job's failed pods are replaced after a back-off that doubles with each
// failure since the last success, from 10 s up to 10 minutes (Kubernetes'
// DefaultJobPodFailureBackOff and MaxJobPodFailureBackOff): a pod that
// fails at once does not spin.
const (
	podFailureBackoff    = 10 * time.Second
	maxPodFailureBackoff = 10 * time.Minute
)

// backoffRecord is the failure history the back-off is computed from,
// kept in memory per Job as Kubernetes keeps it.
type backoffRecord struct {
	failuresAfterLastSuccess int32
	lastFailure              time.Time
}

// next folds the pods newly seen finished into the record.
func (r backoffRecord) next(succeeded, failed []*corev1.Pod) backoffRecord {
	if len(failed) == 0 {
		if len(succeeded) > 0 {
			return backoffRecord{}
		}
		return r
	}
	sortByFinish(failed)
	if len(succeeded) == 0 {
		return backoffRecord{failuresAfterLastSuccess: r.failuresAfterLastSuccess + int32(len(failed)), lastFailure: finishedAt(failed[len(failed)-1])}
	}
	sortByFinish(succeeded)
	lastSuccess := finishedAt(succeeded[len(succeeded)-1])
	out := backoffRecord{}
	for i := len(failed) - 1; i >= 0 && finishedAt(failed[i]).After(lastSuccess); i-- {
		if out.lastFailure.IsZero() {
			out.lastFailure = finishedAt(failed[i])
		}
		out.failuresAfterLastSuccess++
	}
	return out
}

// remaining is how long new pods must still wait.
func (r backoffRecord) remaining(now time.Time) time.Duration {
	return backoffLeft(r.failuresAfterLastSuccess, r.lastFailure, now)
}

func backoffLeft(failures int32, last time.Time, now time.Time) time.Duration {
	if failures <= 0 {
		return 0
	}
	d := podFailureBackoff
	for i := int32(1); i < failures && d < maxPodFailureBackoff; i++ {
		d *= 2
	}
	d = min(d, maxPodFailureBackoff)
	return max(0, d-now.Sub(last))
}

func sortByFinish(pods []*corev1.Pod) {
	sort.SliceStable(pods, func(i, j int) bool { return finishedAt(pods[i]).Before(finishedAt(pods[j])) })
}

// finishedAt is when a pod finished: its containers' last exit, else when
// it stopped being ready, else its deletion, else its creation.
func finishedAt(p *corev1.Pod) time.Time {
	var last time.Time
	complete := len(p.Status.ContainerStatuses) > 0
	for _, cs := range p.Status.ContainerStatuses {
		t := cs.State.Terminated
		if t == nil || t.FinishedAt.IsZero() {
			complete = false
			break
		}
		if t.FinishedAt.After(last) {
			last = t.FinishedAt.Time
		}
	}
	if complete {
		return last
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionFalse && !c.LastTransitionTime.IsZero() {
			return c.LastTransitionTime.Time
		}
	}
	if p.DeletionTimestamp != nil {
		grace := int64(0)
		if p.DeletionGracePeriodSeconds != nil {
			grace = *p.DeletionGracePeriodSeconds
		}
		return p.DeletionTimestamp.Add(-time.Duration(grace) * time.Second)
	}
	return p.CreationTimestamp.Time
}
