package job

import (
	"context"
	"fmt"
	"sort"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// track counts finished pods the way that survives their deletion and a
// crash of this loop: it writes them into status.uncountedTerminatedPods,
// removes their tracking finalizers, then moves them into the counters;
// last it marks the Job finished when its end is decided and nothing is
// left uncounted or terminating.
func (c *Controller) track(ctx context.Context, s *state, needsFlush bool, now time.Time) error {
	job := s.job
	st := &job.Status
	withFinalizer := map[types.UID]bool{}
	for _, p := range s.pods {
		if hasTrackingFinalizer(p) && !s.unfinalized[p.UID] {
			withFinalizer[p.UID] = true
		}
	}
	if countUncounted(st, withFinalizer) {
		needsFlush = true
	}
	if indexed(job) {
		sort.SliceStable(s.pods, func(i, j int) bool { return completionIndex(s.pods[i]) < completionIndex(s.pods[j]) })
	}
	var unfinalize []*corev1.Pod
	var newIndexes []int
	full := false
	uncounted := st.UncountedTerminatedPods
	for _, p := range s.pods {
		if !hasTrackingFinalizer(p) || s.unfinalized[p.UID] {
			continue // counted by an earlier sync
		}
		failed := podFailed(p, job)
		if !s.canUnfinalize(p, failed) {
			continue
		}
		unfinalize = append(unfinalize, p)
		switch {
		case p.Status.Phase == corev1.PodSucceeded && !s.uncountedFailed[p.UID]:
			if indexed(job) {
				// The index is enough to count a success once.
				if ix := completionIndex(p); validIndex(job, p) && !s.prevSucceededIndexes.has(ix) {
					newIndexes = append(newIndexes, ix)
					needsFlush = true
				}
			} else if !s.uncountedSucceeded[p.UID] {
				uncounted.Succeeded = append(uncounted.Succeeded, p.UID)
				needsFlush = true
			}
		case failed || s.finishedCondition != nil && s.finishedCondition.Type != batchv1.JobSuccessCriteriaMet:
			// A Job that failed counts its unfinished pods as failed.
			if !s.uncountedFailed[p.UID] && (!indexed(job) || validIndex(job, p)) && judgeFailure(job, p).counts() {
				uncounted.Failed = append(uncounted.Failed, p.UID)
				needsFlush = true
			}
		}
		if len(newIndexes)+len(uncounted.Succeeded)+len(uncounted.Failed) >= maxUncounted {
			full = true // the next sync takes the rest
			break
		}
	}
	if indexed(job) {
		s.succeededIndexes = s.succeededIndexes.with(newIndexes...)
		if done := s.succeededIndexes.String(); done != st.CompletedIndexes {
			st.CompletedIndexes = done
			needsFlush = true
		}
		st.Succeeded = int32(s.succeededIndexes.total())
		var failedIndexes *string
		if s.failedIndexes != nil {
			failedIndexes = ptr.To(s.failedIndexes.String())
		}
		if !ptr.Equal(st.FailedIndexes, failedIndexes) {
			st.FailedIndexes = failedIndexes
			needsFlush = true
		}
	}
	// The interim condition goes in before any finalizer comes off: it is
	// what a restarted loop decides from.
	if fc := s.finishedCondition; fc != nil && fc.Type == batchv1.JobFailureTarget {
		st.Conditions = append(st.Conditions, *fc)
		needsFlush = true
		s.finishedCondition = newCondition(batchv1.JobFailed, fc.Reason, fc.Message, now)
	}
	if fc := s.finishedCondition; fc != nil && fc.Type == batchv1.JobSuccessCriteriaMet {
		if condition(job, batchv1.JobSuccessCriteriaMet) == nil {
			st.Conditions = append(st.Conditions, *fc)
			needsFlush = true
		}
		s.finishedCondition = newCondition(batchv1.JobComplete, fc.Reason, fc.Message, now)
	}
	if needsFlush {
		if err := c.updateStatus(ctx, s); err != nil {
			return fmt.Errorf("adding uncounted pods to status: %w", err)
		}
		needsFlush = false
	}
	c.mu.Lock()
	c.backoff[s.key] = s.backoff
	c.mu.Unlock()
	rmErr := c.unfinalize(ctx, s, unfinalize, withFinalizer)
	if countUncounted(&job.Status, withFinalizer) {
		needsFlush = true
	}
	if rmErr != nil {
		if needsFlush {
			if err := c.updateStatus(ctx, s); err != nil {
				return fmt.Errorf("counting pods: %w", err)
			}
		}
		return rmErr
	}
	done := !full && s.enactFinished(now)
	if done || needsFlush {
		if err := c.updateStatus(ctx, s); err != nil {
			return fmt.Errorf("counting pods: %w", err)
		}
	}
	if done {
		fc := s.finishedCondition
		if fc.Type == batchv1.JobComplete {
			if job.Spec.Completions != nil && job.Status.Succeeded > *job.Spec.Completions {
				c.recorder.Eventf(job, nil, corev1.EventTypeWarning, "TooManySucceededPods", "Complete", "Too many succeeded pods running after completion count reached")
			}
			c.recorder.Eventf(job, nil, corev1.EventTypeNormal, "Completed", "Complete", "Job completed")
		} else {
			c.recorder.Eventf(job, nil, corev1.EventTypeWarning, fc.Reason, "Fail", "%s", fc.Message)
		}
	}
	return nil
}

// canUnfinalize: a pod's finalizer comes off once it succeeded, failed (but
// for a failed pod whose index waits to be retried: its replacement
// inherits its failure count), or its Job is deleted or decided.
func (s *state) canUnfinalize(p *corev1.Pod, failed bool) bool {
	if s.job.DeletionTimestamp != nil || s.finishedCondition != nil || p.Status.Phase == corev1.PodSucceeded {
		return true
	}
	if !failed {
		return false
	}
	if s.job.Spec.BackoffLimitPerIndex != nil {
		if d := s.delayed[completionIndex(p)]; d != nil && d.UID == p.UID {
			return false
		}
	}
	return true
}

// unfinalize removes the tracking finalizer from pods; each one removed
// (or gone) leaves withFinalizer, and is remembered until the informer
// shows it.
func (c *Controller) unfinalize(ctx context.Context, s *state, pods []*corev1.Pod, withFinalizer map[types.UID]bool) error {
	var firstErr error
	for _, p := range pods {
		err := c.removeFinalizer(ctx, p)
		if err != nil && !apierrors.IsNotFound(err) {
			if firstErr == nil {
				firstErr = fmt.Errorf("removing the tracking finalizer of %s: %w", p.Name, err)
			}
			continue
		}
		delete(withFinalizer, p.UID)
		c.mu.Lock()
		if c.unfinalized[s.key] == nil {
			c.unfinalized[s.key] = map[types.UID]bool{}
		}
		c.unfinalized[s.key][p.UID] = true
		c.mu.Unlock()
	}
	return firstErr
}

// countUncounted moves the uncounted pods whose finalizer is off into the
// counters; it reports whether the status changed.
func countUncounted(st *batchv1.JobStatus, withFinalizer map[types.UID]bool) bool {
	u := st.UncountedTerminatedPods
	keep := func(uids []types.UID) []types.UID {
		var out []types.UID
		for _, uid := range uids {
			if withFinalizer[uid] {
				out = append(out, uid)
			}
		}
		return out
	}
	succeeded, failed := keep(u.Succeeded), keep(u.Failed)
	changed := len(succeeded) != len(u.Succeeded) || len(failed) != len(u.Failed)
	st.Succeeded += int32(len(u.Succeeded) - len(succeeded))
	st.Failed += int32(len(u.Failed) - len(failed))
	u.Succeeded, u.Failed = succeeded, failed
	return changed
}

// enactFinished sets the Job's Complete or Failed condition once its end is
// decided and no pod is left uncounted or terminating.
func (s *state) enactFinished(now time.Time) bool {
	fc := s.finishedCondition
	st := &s.job.Status
	if fc == nil || len(st.UncountedTerminatedPods.Succeeded)+len(st.UncountedTerminatedPods.Failed) > 0 || s.terminating > 0 {
		return false
	}
	setCondition(st, fc.Type, corev1.ConditionTrue, fc.Reason, fc.Message, now)
	if fc.Type == batchv1.JobComplete {
		st.CompletionTime = &metav1.Time{Time: now}
	}
	return true
}

// updateStatus writes the Job's status; the sync goes on with its own copy
// at the version written, for its next write.
func (c *Controller) updateStatus(ctx context.Context, s *state) error {
	out, err := c.client.Jobs(s.job.Namespace).UpdateStatus(ctx, s.job, metav1.UpdateOptions{})
	if err != nil {
		return err
	}
	s.job.ResourceVersion = out.ResourceVersion
	return nil
}
