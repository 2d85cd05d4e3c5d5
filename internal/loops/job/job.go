// Package job runs Jobs to completion as Kubernetes' Job controller does.
// Pods are tracked with the batch.kubernetes.io/job-tracking finalizer: a
// finished pod is first recorded in status.uncountedTerminatedPods, then
// its finalizer removed, then counted, so a pod deleted (evicted, garbage
// collected) before the loop saw it finish is still counted, once.
//
// Both completion modes: NonIndexed, and Indexed (each pod's index in an
// annotation, a label, JOB_COMPLETION_INDEX and its hostname;
// status.completedIndexes and failedIndexes). Failures count against
// backoffLimit, or per index against backoffLimitPerIndex and
// maxFailedIndexes, after the podFailurePolicy (FailJob, FailIndex, Ignore,
// Count on exit codes and pod conditions) had its say; replacements wait
// out an exponential back-off. A successPolicy, completions or a pod's
// success (without completions) make a Job SuccessCriteriaMet then
// Complete; a failure makes it FailureTarget then Failed once its pods
// have stopped. It also suspends and resumes Jobs, adopts and releases
// pods by the Job's selector, honours podReplacementPolicy and
// activeDeadlineSeconds, and deletes finished Jobs after
// ttlSecondsAfterFinished.
package job

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/loops/controller"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	batchlisters "k8s.io/client-go/listers/batch/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

const (
	// maxUncounted caps the pods one sync moves through
	// uncountedTerminatedPods, keeping the status small (Kubernetes' 500).
	maxUncounted = 500
	// maxPodChanges caps the pods one sync creates or deletes.
	maxPodChanges = 500
	// jobControllerName is the managedBy value this loop answers to.
	jobControllerName = "kubernetes.io/job-controller"
)

var jobKind = batchv1.SchemeGroupVersion.WithKind("Job")

// key is a Job to sync, or (orphanPod) a pod whose tracking finalizer may
// have nobody left to remove it.
type key struct {
	namespace, name string
	orphanPod       bool
}

func (k key) String() string { return k.namespace + "/" + k.name }

// Controller is the Job loop.
type Controller struct {
	client   *kube.Client
	jobs     batchlisters.JobLister
	pods     corelisters.PodLister
	synced   []toolscache.InformerSynced
	queue    *controller.Queue[key]
	recorder kube.EventRecorder
	log      *slog.Logger
	clock    clock.PassiveClock
	// expect holds the pod creates and deletes issued but not yet seen.
	expect *controller.Expectations

	mu sync.Mutex
	// backoff is each Job's failure history, for the replacement back-off.
	backoff map[string]backoffRecord
	// unfinalized holds, per Job, the pods whose tracking finalizer this
	// loop removed but the informer still shows: they are counted already.
	unfinalized map[string]map[types.UID]bool
}

// New registers the controller on the factory's informers.
func New(client *kube.Client, factory *kube.Informers, recorder kube.EventRecorder, env controller.Env) (*Controller, error) {
	env = env.WithDefaults()
	jobs, pods := factory.Jobs(), factory.Pods()
	c := &Controller{
		client: client, jobs: jobs.Lister(), pods: pods.Lister(), recorder: recorder, log: env.Log.With("loop", "job"), clock: env.Clock,
		synced:  []toolscache.InformerSynced{jobs.Informer().HasSynced, pods.Informer().HasSynced},
		queue:   controller.NewQueue[key]("job", env),
		expect:  controller.NewExpectations(env.Clock),
		backoff: map[string]backoffRecord{}, unfinalized: map[string]map[types.UID]bool{},
	}
	if err := c.queue.EnqueueObjects(jobs.Informer(), func(ns, name string) key { return key{namespace: ns, name: name} }); err != nil {
		return nil, err
	}
	if _, err := jobs.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		UpdateFunc: func(old, cur any) {
			// A changed selector may match orphans now.
			if o, n := old.(*batchv1.Job), cur.(*batchv1.Job); !equalSelector(o, n) {
				c.queue.Add(key{namespace: n.Namespace, name: n.Name})
			}
		},
	}); err != nil {
		return nil, err
	}
	if _, err := pods.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if p, ok := obj.(*corev1.Pod); ok {
				if k, ok := ownerKey(p); ok {
					c.expect.Created(k.String())
				}
				c.podChanged(p)
			}
		},
		UpdateFunc: func(old, cur any) {
			o, n := old.(*corev1.Pod), cur.(*corev1.Pod)
			if k, ok := ownerKey(o); ok && ptrUID(metav1.GetControllerOf(o)) != ptrUID(metav1.GetControllerOf(n)) {
				c.queue.Add(k) // released: its old owner counts again
			}
			// A deletion is seen once the pod is marked, as Kubernetes'
			// Job controller sees it: a pod held by its tracking finalizer
			// may only go once a sync waiting on this removes it.
			if k, ok := ownerKey(n); ok && n.DeletionTimestamp != nil {
				c.expect.Deleted(k.String(), n.UID)
			}
			if !hasTrackingFinalizer(n) {
				c.finalizerGone(n)
			}
			c.podChanged(n)
		},
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				if k, ok := ownerKey(p); ok {
					c.expect.Deleted(k.String(), p.UID)
				}
				c.finalizerGone(p)
				c.podChanged(p)
			}
		},
	}); err != nil {
		return nil, err
	}
	return c, nil
}

func ptrUID(ref *metav1.OwnerReference) types.UID {
	if ref == nil {
		return ""
	}
	return ref.UID
}

func equalSelector(a, b *batchv1.Job) bool {
	return a.Spec.Selector.String() == b.Spec.Selector.String()
}

// ownerKey is the key of the Job controlling p.
func ownerKey(p *corev1.Pod) (key, bool) {
	ref := metav1.GetControllerOf(p)
	if ref == nil || ref.Kind != jobKind.Kind || !strings.HasPrefix(ref.APIVersion, "batch/") {
		return key{}, false
	}
	return key{namespace: p.Namespace, name: ref.Name}, true
}

// podChanged syncs the pod's Job, or the Jobs that could adopt an orphan,
// and looks after a tracking finalizer its Job may no longer remove.
func (c *Controller) podChanged(p *corev1.Pod) {
	if k, ok := ownerKey(p); ok {
		c.queue.Add(k)
	} else if p.DeletionTimestamp == nil {
		jobs, _ := c.jobs.Jobs(p.Namespace).List(labels.Everything())
		for _, j := range jobs {
			if sel, err := metav1.LabelSelectorAsSelector(j.Spec.Selector); err == nil && !sel.Empty() && sel.Matches(labels.Set(p.Labels)) {
				c.queue.Add(key{namespace: j.Namespace, name: j.Name})
			}
		}
	}
	if hasTrackingFinalizer(p) {
		c.queue.Add(key{namespace: p.Namespace, name: p.Name, orphanPod: true})
	}
}

// finalizerGone forgets an expected finalizer removal once it is seen.
func (c *Controller) finalizerGone(p *corev1.Pod) {
	k, ok := ownerKey(p)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if m := c.unfinalized[k.String()]; m != nil {
		delete(m, p.UID)
		if len(m) == 0 {
			delete(c.unfinalized, k.String())
		}
	}
}

// Run syncs Jobs until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	c.queue.Run(ctx, workers, c.synced, c.sync)
}

func (c *Controller) sync(ctx context.Context, k key) error {
	if k.orphanPod {
		return c.syncOrphanPod(ctx, k)
	}
	shared, err := c.jobs.Jobs(k.namespace).Get(k.name)
	if apierrors.IsNotFound(err) {
		c.forget(k.String())
		return nil
	}
	if err != nil {
		return err
	}
	job := shared.DeepCopy()
	if done, cond := finished(job); done {
		c.forget(k.String())
		// Pods created by a sync that never saw them keep a finalizer.
		c.enqueueFinalizedPods(job)
		return c.expire(ctx, job, cond, c.clock.Now())
	}
	if m := job.Spec.ManagedBy; m != nil && *m != jobControllerName {
		return nil // another controller's
	}
	if mode := job.Spec.CompletionMode; mode != nil && *mode != batchv1.NonIndexedCompletion && *mode != batchv1.IndexedCompletion {
		c.recorder.Eventf(job, nil, corev1.EventTypeWarning, "UnknownCompletionMode", "Sync", "Skipped Job sync because completion mode is unknown")
		return nil
	}
	return c.syncJob(ctx, k.String(), job)
}

// state is one sync's view of a Job and its pods.
type state struct {
	key         string
	job         *batchv1.Job
	pods        []*corev1.Pod // the pods the Job controls
	active      []*corev1.Pod
	ready       int32
	terminating int32
	succeeded   int32
	failed      int32
	// uncountedSucceeded and uncountedFailed are the status' uncounted pods.
	uncountedSucceeded, uncountedFailed map[types.UID]bool
	// unfinalized are pods counted already whose finalizer removal is unseen.
	unfinalized map[types.UID]bool
	backoff     backoffRecord

	// Indexed Jobs.
	prevSucceededIndexes, succeededIndexes intervals
	failedIndexes                          *intervals
	// delayed holds, per index, the failed pod whose replacement inherits
	// its failure count: its finalizer stays until the replacement exists.
	delayed map[int]*corev1.Pod

	// finishedCondition is the Job's end, once one is decided.
	finishedCondition *batchv1.JobCondition
}

func (c *Controller) syncJob(ctx context.Context, k string, job *batchv1.Job) error {
	now := c.clock.Now()
	st := &job.Status
	if st.UncountedTerminatedPods == nil {
		st.UncountedTerminatedPods = &batchv1.UncountedTerminatedPods{}
	}
	// Expectations first: a pod arriving after the list is then caught by
	// the next sync rather than created twice.
	satisfied := c.expect.Satisfied(k)
	pods, err := c.claim(ctx, job)
	if err != nil {
		return err
	}
	s := &state{key: k, job: job, pods: pods, uncountedSucceeded: uidSet(st.UncountedTerminatedPods.Succeeded),
		uncountedFailed: uidSet(st.UncountedTerminatedPods.Failed)}
	c.mu.Lock()
	s.unfinalized = maps.Clone(c.unfinalized[k])
	s.backoff = c.backoff[k]
	c.mu.Unlock()
	for _, p := range pods {
		switch {
		case podActive(p):
			s.active = append(s.active, p)
			if podReady(p) {
				s.ready++
			}
		case podTerminating(p):
			s.terminating++
		}
	}
	active := int32(len(s.active))
	newSucceeded := s.newlyFinished(s.uncountedSucceeded, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded })
	newFailed := s.newlyFinished(s.uncountedFailed, func(p *corev1.Pod) bool { return podFailed(p, job) })
	s.succeeded = st.Succeeded + int32(len(newSucceeded)+len(s.uncountedSucceeded))
	s.failed = st.Failed + int32(len(s.uncountedFailed))
	for _, p := range newFailed {
		if judgeFailure(job, p).counts() {
			s.failed++
		}
	}
	startTimeSet := false
	if st.StartTime == nil && !suspended(job) {
		st.StartTime = &metav1.Time{Time: now}
		startTimeSet = true
	}
	s.backoff = s.backoff.next(newSucceeded, newFailed)

	// The Job's end: a condition decided earlier stands; then failures
	// (the pod failure policy, the back-off limit, the deadline), then
	// success.
	s.finishedCondition = condition(job, batchv1.JobSuccessCriteriaMet)
	if s.finishedCondition == nil {
		if target := condition(job, batchv1.JobFailureTarget); target != nil {
			s.finishedCondition = newCondition(batchv1.JobFailed, target.Reason, target.Message, now)
		} else if msg := failJobMessage(job, pods); msg != "" {
			s.finishedCondition = newCondition(batchv1.JobFailureTarget, batchv1.JobReasonPodFailurePolicy, msg, now)
		}
	}
	if s.finishedCondition == nil {
		switch {
		case s.failed > ptr.Deref(job.Spec.BackoffLimit, 6) || pastBackoffLimitOnFailure(job, pods):
			s.finishedCondition = newCondition(batchv1.JobFailureTarget, batchv1.JobReasonBackoffLimitExceeded, "Job has reached the specified backoff limit", now)
		case pastDeadline(job, now):
			s.finishedCondition = newCondition(batchv1.JobFailureTarget, batchv1.JobReasonDeadlineExceeded, "Job was active longer than specified deadline", now)
		case job.Spec.ActiveDeadlineSeconds != nil && !suspended(job):
			c.queue.AddAfter(key{namespace: job.Namespace, name: job.Name}, st.StartTime.Add(time.Duration(*job.Spec.ActiveDeadlineSeconds)*time.Second).Sub(now))
		}
	}
	if indexed(job) {
		s.indexes()
		if s.finishedCondition == nil && job.Spec.BackoffLimitPerIndex != nil {
			switch failed := s.failedIndexes.total(); {
			case job.Spec.MaxFailedIndexes != nil && failed > int(*job.Spec.MaxFailedIndexes):
				s.finishedCondition = newCondition(batchv1.JobFailureTarget, batchv1.JobReasonMaxFailedIndexesExceeded, "Job has exceeded the specified maximal number of failed indexes", now)
			case failed > 0 && failed+s.succeededIndexes.total() >= int(*job.Spec.Completions):
				s.finishedCondition = newCondition(batchv1.JobFailureTarget, batchv1.JobReasonFailedIndexes, "Job has failed indexes", now)
			}
		}
		if s.finishedCondition == nil {
			if msg, met := matchSuccessPolicy(job, s.succeededIndexes); met {
				s.finishedCondition = newCondition(batchv1.JobSuccessCriteriaMet, batchv1.JobReasonSuccessPolicy, msg, now)
			}
		}
	}

	suspendChanged := false
	var manageErr error
	if s.finishedCondition != nil {
		deleted, deletedReady, err := c.deletePods(ctx, s, s.active, false)
		if deleted != active || !satisfied {
			// Not finished while pods may still run or be unseen.
			s.finishedCondition = nil
		}
		active -= deleted
		s.terminating += deleted
		s.ready -= deletedReady
		manageErr = err
	} else {
		managed := false
		if satisfied && job.DeletionTimestamp == nil {
			active, manageErr = c.manage(ctx, s, now)
			managed = true
		}
		complete := false
		if job.Spec.Completions == nil {
			// Any success ends the Job once the pods still running are done.
			complete = s.succeeded > 0 && active == 0
		} else {
			complete = s.succeeded >= *job.Spec.Completions && active == 0
		}
		switch {
		case complete:
			s.finishedCondition = newCondition(batchv1.JobSuccessCriteriaMet, batchv1.JobReasonCompletionsReached, "Reached expected number of succeeded pods", now)
		case managed && suspended(job):
			if setCondition(st, batchv1.JobSuspended, corev1.ConditionTrue, "JobSuspended", "Job suspended", now) {
				suspendChanged = true
				c.recorder.Eventf(job, nil, corev1.EventTypeNormal, "Suspended", "Suspend", "Job suspended")
			}
		case managed:
			if setCondition(st, batchv1.JobSuspended, corev1.ConditionFalse, "JobResumed", "Job resumed", now) {
				suspendChanged = true
				c.recorder.Eventf(job, nil, corev1.EventTypeNormal, "Resumed", "Resume", "Job resumed")
				// activeDeadlineSeconds counts from the resumption.
				st.StartTime = &metav1.Time{Time: now}
			}
		}
	}
	needsFlush := suspendChanged || startTimeSet || active != st.Active || !ptr.Equal(&s.ready, st.Ready) || !ptr.Equal(&s.terminating, st.Terminating)
	st.Active, st.Ready, st.Terminating = active, ptr.To(s.ready), ptr.To(s.terminating)
	if err := c.track(ctx, s, needsFlush, now); err != nil {
		return fmt.Errorf("tracking status: %w", err)
	}
	return manageErr
}

// newlyFinished are the pods matching done that still carry the tracking
// finalizer and are not in the status' uncounted list yet.
func (s *state) newlyFinished(uncounted map[types.UID]bool, done func(*corev1.Pod) bool) []*corev1.Pod {
	var out []*corev1.Pod
	for _, p := range s.pods {
		if !hasTrackingFinalizer(p) || uncounted[p.UID] || s.unfinalized[p.UID] {
			continue
		}
		if indexed(s.job) && !validIndex(s.job, p) {
			continue
		}
		if done(p) {
			out = append(out, p)
		}
	}
	return out
}

// indexes works out an Indexed Job's succeeded and failed indexes, and the
// failed pods whose index is to be retried.
func (s *state) indexes() {
	job := s.job
	completions := int(*job.Spec.Completions)
	s.prevSucceededIndexes = parseIntervals(job.Status.CompletedIndexes, completions)
	var succeeded, failed []int
	for _, p := range s.pods {
		if !hasTrackingFinalizer(p) || !validIndex(job, p) {
			continue
		}
		if p.Status.Phase == corev1.PodSucceeded {
			succeeded = append(succeeded, completionIndex(p))
		}
		if job.Spec.BackoffLimitPerIndex != nil && indexFailed(job, p) {
			failed = append(failed, completionIndex(p))
		}
	}
	s.succeededIndexes = s.prevSucceededIndexes.with(succeeded...)
	s.succeeded = int32(s.succeededIndexes.total())
	if job.Spec.BackoffLimitPerIndex == nil {
		return
	}
	prevFailed := intervals(nil)
	if job.Status.FailedIndexes != nil {
		prevFailed = parseIntervals(*job.Status.FailedIndexes, completions)
	}
	f := prevFailed.with(failed...)
	s.failedIndexes = &f
	activeIndexes := map[int]bool{}
	for _, p := range s.active {
		activeIndexes[completionIndex(p)] = true
	}
	s.delayed = map[int]*corev1.Pod{}
	for _, p := range s.pods {
		if !hasTrackingFinalizer(p) || s.unfinalized[p.UID] || !validIndex(job, p) || !podFailed(p, job) {
			continue
		}
		ix := completionIndex(p)
		if s.succeededIndexes.has(ix) || s.failedIndexes.has(ix) || activeIndexes[ix] {
			continue
		}
		if last, ok := s.delayed[ix]; !ok || absoluteFailures(last) <= absoluteFailures(p) && !finishedAt(p).Before(finishedAt(last)) {
			s.delayed[ix] = p
		}
	}
}

// indexFailed reports whether a pod's failure fails its index: a FailIndex
// rule matched, or the index has used up backoffLimitPerIndex.
func indexFailed(job *batchv1.Job, p *corev1.Pod) bool {
	if !podFailed(p, job) {
		return false
	}
	v := judgeFailure(job, p)
	if v.action == batchv1.PodFailurePolicyActionFailIndex {
		return true
	}
	return v.counts() && annotationCount(p, batchv1.JobIndexFailureCountAnnotation) >= *job.Spec.BackoffLimitPerIndex
}

func absoluteFailures(p *corev1.Pod) int32 {
	return annotationCount(p, batchv1.JobIndexFailureCountAnnotation) + annotationCount(p, batchv1.JobIndexIgnoredFailureCountAnnotation)
}

// manage creates or deletes pods to reach the parallelism the Job wants;
// it returns the active count after.
func (c *Controller) manage(ctx context.Context, s *state, now time.Time) (int32, error) {
	job := s.job
	active := int32(len(s.active))
	if suspended(job) {
		deleted, deletedReady, err := c.deletePods(ctx, s, podsForRemoval(job, s.active, len(s.active)), true)
		s.terminating += deleted
		s.ready -= deletedReady
		return active - deleted, err
	}
	parallelism := ptr.Deref(job.Spec.Parallelism, 1)
	want := parallelism
	switch {
	case job.Spec.Completions != nil:
		want = max(0, min(parallelism, *job.Spec.Completions-s.succeeded))
	case s.succeeded > 0:
		want = active // leave what runs running
	}
	if rm := podsForRemoval(job, s.active, int(max(0, active-want))); len(rm) > 0 {
		// Creating and deleting in one sync is never needed: deleting first.
		deleted, deletedReady, err := c.deletePods(ctx, s, rm[:min(len(rm), maxPodChanges)], true)
		s.terminating += deleted
		s.ready -= deletedReady
		return active - deleted, err
	}
	terminating := int32(0)
	if onlyReplaceFailed(job) {
		terminating = s.terminating
	}
	missing := min(want-terminating-active, maxPodChanges)
	if missing <= 0 {
		return active, nil
	}
	jk := key{namespace: job.Namespace, name: job.Name}
	if job.Spec.BackoffLimitPerIndex == nil {
		if wait := s.backoff.remaining(now); wait > 0 {
			c.queue.AddAfter(jk, wait)
			return active, nil
		}
	}
	var indexes []int
	if indexed(job) {
		indexes = s.pendingIndexes(int(missing))
		if job.Spec.BackoffLimitPerIndex != nil {
			var wait time.Duration
			if indexes, wait = s.readyIndexes(indexes, now); len(indexes) == 0 {
				if wait > 0 {
					c.queue.AddAfter(jk, wait)
				}
				return active, nil
			}
		}
		missing = int32(len(indexes))
	}
	template := job.Spec.Template.DeepCopy()
	if !slices.Contains(template.Finalizers, batchv1.JobTrackingFinalizer) {
		template.Finalizers = append(template.Finalizers, batchv1.JobTrackingFinalizer)
	}
	for range missing {
		c.expect.Raise(s.key, "")
	}
	created := int32(0)
	var err error
	for i := range missing {
		pod := &corev1.Pod{ObjectMeta: *template.ObjectMeta.DeepCopy(), Spec: *template.Spec.DeepCopy()}
		pod.Namespace, pod.GenerateName, pod.Name = job.Namespace, job.Name+"-", ""
		pod.OwnerReferences = append(pod.OwnerReferences, *metav1.NewControllerRef(job, jobKind))
		if indexes != nil {
			ix := indexes[i]
			t := corev1.PodTemplateSpec{ObjectMeta: pod.ObjectMeta, Spec: pod.Spec}
			withCompletionIndex(job, &t, ix)
			if job.Spec.BackoffLimitPerIndex != nil {
				inheritFailureCounts(job, &t, s.delayed[ix])
			}
			pod.ObjectMeta, pod.Spec = t.ObjectMeta, t.Spec
			pod.GenerateName = indexedGenerateName(job.Name, ix)
		}
		var made *corev1.Pod
		if made, err = c.client.Pods(job.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			break
		}
		created++
		c.recorder.Eventf(job, nil, corev1.EventTypeNormal, "SuccessfulCreate", "Create", "Created pod: %s", made.Name)
	}
	for range missing - created {
		c.expect.Created(s.key) // never to be seen
	}
	if err != nil {
		if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
			return active + created, nil
		}
		c.recorder.Eventf(job, nil, corev1.EventTypeWarning, "FailedCreate", "Create", "Error creating: %v", err)
		return active + created, err
	}
	return active + created, nil
}

// pendingIndexes is up to n of the lowest indexes that neither succeeded,
// failed, run nor (with podReplacementPolicy Failed) still terminate.
func (s *state) pendingIndexes(n int) []int {
	busy := s.succeededIndexes
	var taken []int
	for _, p := range s.active {
		if ix := completionIndex(p); ix != noIndex {
			taken = append(taken, ix)
		}
	}
	if onlyReplaceFailed(s.job) {
		for _, p := range s.pods {
			if ix := completionIndex(p); podTerminating(p) && ix != noIndex {
				taken = append(taken, ix)
			}
		}
	}
	busy = busy.with(taken...)
	if s.failedIndexes != nil {
		busy = busy.merge(*s.failedIndexes)
	}
	var out []int
	for ix := 0; ix < int(*s.job.Spec.Completions) && len(out) < n; ix++ {
		if !busy.has(ix) {
			out = append(out, ix)
		}
	}
	return out
}

// readyIndexes keeps the indexes whose per-index back-off is over; with
// none, it says how long until the first is.
func (s *state) readyIndexes(indexes []int, now time.Time) ([]int, time.Duration) {
	var ready []int
	var soonest time.Duration
	for _, ix := range indexes {
		wait := time.Duration(0)
		if p := s.delayed[ix]; p != nil {
			wait = backoffLeft(absoluteFailures(p)+1, finishedAt(p), now)
		}
		if wait == 0 {
			ready = append(ready, ix)
		} else if soonest == 0 || wait < soonest {
			soonest = wait
		}
	}
	if len(ready) > 0 {
		return ready, 0
	}
	return nil, soonest
}

// inheritFailureCounts carries an index's failure counts to the pod that
// retries it.
func inheritFailureCounts(job *batchv1.Job, t *corev1.PodTemplateSpec, replaced *corev1.Pod) {
	failures, ignored := int32(0), int32(0)
	if replaced != nil {
		failures = annotationCount(replaced, batchv1.JobIndexFailureCountAnnotation)
		ignored = annotationCount(replaced, batchv1.JobIndexIgnoredFailureCountAnnotation)
		if judgeFailure(job, replaced).counts() {
			failures++
		} else {
			ignored++
		}
	}
	t.Annotations[batchv1.JobIndexFailureCountAnnotation] = fmt.Sprint(failures)
	if ignored > 0 {
		t.Annotations[batchv1.JobIndexIgnoredFailureCountAnnotation] = fmt.Sprint(ignored)
	}
}

// podsForRemoval picks at least n active pods to delete, and for an Indexed
// Job every pod beyond its completions, without an index, or repeating
// another's index; the least advanced go first.
func podsForRemoval(job *batchv1.Job, active []*corev1.Pod, n int) []*corev1.Pod {
	var rm, left []*corev1.Pod
	if indexed(job) {
		byIndex := map[int][]*corev1.Pod{}
		for _, p := range active {
			if !validIndex(job, p) {
				rm = append(rm, p)
				continue
			}
			byIndex[completionIndex(p)] = append(byIndex[completionIndex(p)], p)
		}
		for _, same := range byIndex {
			sortForDeletion(same)
			rm = append(rm, same[:len(same)-1]...)
			left = append(left, same[len(same)-1])
		}
	} else {
		left = slices.Clone(active)
	}
	if len(rm) < n {
		sortForDeletion(left)
		rm = append(rm, left[:min(len(left), n-len(rm))]...)
	}
	return rm
}

// sortForDeletion orders pods as Kubernetes' ActivePods: unscheduled before
// scheduled, pending before running, not ready before ready, newer first.
func sortForDeletion(pods []*corev1.Pod) {
	rank := func(p *corev1.Pod) [3]bool {
		return [3]bool{p.Spec.NodeName != "", p.Status.Phase == corev1.PodRunning, podReady(p)}
	}
	sort.SliceStable(pods, func(i, j int) bool {
		a, b := rank(pods[i]), rank(pods[j])
		for k := range a {
			if a[k] != b[k] {
				return !a[k]
			}
		}
		return pods[i].CreationTimestamp.After(pods[j].CreationTimestamp.Time)
	})
}

// deletePods deletes pods of the Job; with dropFinalizer (pods removed for
// being too many, not for failing) their tracking finalizer goes first, so
// they never count. It returns how many it deleted, and of them how many
// were ready.
func (c *Controller) deletePods(ctx context.Context, s *state, pods []*corev1.Pod, dropFinalizer bool) (int32, int32, error) {
	var deleted, deletedReady int32
	var firstErr error
	for _, p := range pods {
		c.expect.Raise(s.key, p.UID)
		err := error(nil)
		if dropFinalizer && hasTrackingFinalizer(p) {
			err = c.removeFinalizer(ctx, p)
		}
		if err == nil {
			err = c.client.Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}})
		}
		if err != nil && !apierrors.IsNotFound(err) {
			c.expect.Deleted(s.key, p.UID)
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		if err != nil {
			c.expect.Deleted(s.key, p.UID)
		}
		deleted++
		if podReady(p) {
			deletedReady++
		}
	}
	return deleted, deletedReady, firstErr
}

// claim adopts and releases pods by the Job's selector; it returns the
// pods the Job controls. A released pod keeps no tracking finalizer.
func (c *Controller) claim(ctx context.Context, job *batchv1.Job) ([]*corev1.Pod, error) {
	selector, err := metav1.LabelSelectorAsSelector(job.Spec.Selector)
	if err != nil || selector.Empty() {
		return nil, nil // validation forbids it
	}
	all, err := c.pods.Pods(job.Namespace).List(labels.Everything())
	if err != nil {
		return nil, err
	}
	owned, released, err := controller.ClaimPods(ctx, c.client, job, jobKind, selector, all)
	if err != nil {
		return nil, err
	}
	for _, p := range released {
		if hasTrackingFinalizer(p) {
			if err := c.removeFinalizer(ctx, p); err != nil && !apierrors.IsNotFound(err) {
				return nil, err
			}
		}
	}
	return owned, nil
}

// removeFinalizer takes the tracking finalizer off a pod.
func (c *Controller) removeFinalizer(ctx context.Context, p *corev1.Pod) error {
	patch := fmt.Sprintf(`{"metadata":{"$deleteFromPrimitiveList/finalizers":[%q],"uid":%q}}`, batchv1.JobTrackingFinalizer, p.UID)
	_, err := c.client.Pods(p.Namespace).Patch(ctx, p.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
	if apierrors.IsInvalid(err) {
		return nil // replaced under the same name
	}
	return err
}

// syncOrphanPod removes the tracking finalizer from a pod no live Job will
// count: its Job is gone or finished, or it has none and none would adopt
// it. Without this a namespace holding it could never be deleted.
func (c *Controller) syncOrphanPod(ctx context.Context, k key) error {
	p, err := c.pods.Pods(k.namespace).Get(k.name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil || !hasTrackingFinalizer(p) {
		return err
	}
	if ref := metav1.GetControllerOf(p); ref != nil {
		if ok := ref.Kind == jobKind.Kind && strings.HasPrefix(ref.APIVersion, "batch/"); ok {
			if j, err := c.jobs.Jobs(p.Namespace).Get(ref.Name); err == nil && j.UID == ref.UID {
				if done, _ := finished(j); !done {
					return nil // its Job counts it
				}
			}
		}
	} else if p.DeletionTimestamp == nil {
		jobs, err := c.jobs.Jobs(p.Namespace).List(labels.Everything())
		if err != nil {
			return err
		}
		for _, j := range jobs {
			sel, err := metav1.LabelSelectorAsSelector(j.Spec.Selector)
			if done, _ := finished(j); err == nil && !done && !sel.Empty() && sel.Matches(labels.Set(p.Labels)) {
				return nil // to be adopted
			}
		}
	}
	if err := c.removeFinalizer(ctx, p); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove the tracking finalizer of orphan pod %s: %w", p.Name, err)
	}
	return nil
}

// enqueueFinalizedPods has the orphan check look at a finished Job's pods
// that still carry the tracking finalizer.
func (c *Controller) enqueueFinalizedPods(job *batchv1.Job) {
	pods, _ := c.pods.Pods(job.Namespace).List(labels.Everything())
	for _, p := range pods {
		if metav1.IsControlledBy(p, job) && hasTrackingFinalizer(p) {
			c.queue.Add(key{namespace: p.Namespace, name: p.Name, orphanPod: true})
		}
	}
}

// forget drops what the loop kept for a Job.
func (c *Controller) forget(k string) {
	c.expect.Forget(k)
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.backoff, k)
	delete(c.unfinalized, k)
}

// expire deletes a finished job once ttlSecondsAfterFinished has passed,
// with its pods (foreground, as Kubernetes' TTL controller does).
func (c *Controller) expire(ctx context.Context, job *batchv1.Job, cond *batchv1.JobCondition, now time.Time) error {
	ttl := job.Spec.TTLSecondsAfterFinished
	if ttl == nil || job.DeletionTimestamp != nil {
		return nil
	}
	at := cond.LastTransitionTime.Add(time.Duration(*ttl) * time.Second)
	if now.Before(at) {
		c.queue.AddAfter(key{namespace: job.Namespace, name: job.Name}, at.Sub(now))
		return nil
	}
	policy := metav1.DeletePropagationForeground
	err := c.client.Jobs(job.Namespace).Delete(ctx, job.Name, metav1.DeleteOptions{PropagationPolicy: &policy, Preconditions: &metav1.Preconditions{UID: &job.UID}})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete finished job: %w", err)
	}
	return nil
}

func finished(j *batchv1.Job) (bool, *batchv1.JobCondition) {
	for i := range j.Status.Conditions {
		c := &j.Status.Conditions[i]
		if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
			return true, c
		}
	}
	return false, nil
}

func suspended(job *batchv1.Job) bool { return ptr.Deref(job.Spec.Suspend, false) }

// onlyReplaceFailed: podReplacementPolicy Failed (the default with a pod
// failure policy) waits for a pod to have failed, not merely to be
// terminating, before replacing it.
func onlyReplaceFailed(job *batchv1.Job) bool {
	if p := job.Spec.PodReplacementPolicy; p != nil {
		return *p == batchv1.Failed
	}
	return job.Spec.PodFailurePolicy != nil
}

// podFailed: a Failed pod, or one deleted before it succeeded (unless the
// Job only replaces failed pods, when it waits for the phase).
func podFailed(p *corev1.Pod, job *batchv1.Job) bool {
	if p.Status.Phase == corev1.PodFailed {
		return true
	}
	return !onlyReplaceFailed(job) && p.DeletionTimestamp != nil && p.Status.Phase != corev1.PodSucceeded
}

func podActive(p *corev1.Pod) bool {
	return p.DeletionTimestamp == nil && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

func podTerminating(p *corev1.Pod) bool {
	return p.DeletionTimestamp != nil && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func hasTrackingFinalizer(p *corev1.Pod) bool {
	return slices.Contains(p.Finalizers, batchv1.JobTrackingFinalizer)
}

// failJobMessage is the message of the first failed pod a FailJob rule
// matches.
func failJobMessage(job *batchv1.Job, pods []*corev1.Pod) string {
	if job.Spec.PodFailurePolicy == nil {
		return ""
	}
	for _, p := range pods {
		if podFailed(p, job) {
			if v := judgeFailure(job, p); v.failJob != "" {
				return v.failJob
			}
		}
	}
	return ""
}

// pastBackoffLimitOnFailure: with restartPolicy OnFailure, the containers'
// restarts of running pods count against backoffLimit.
func pastBackoffLimitOnFailure(job *batchv1.Job, pods []*corev1.Pod) bool {
	if job.Spec.Template.Spec.RestartPolicy != corev1.RestartPolicyOnFailure {
		return false
	}
	restarts := int32(0)
	for _, p := range pods {
		if p.Status.Phase != corev1.PodRunning && p.Status.Phase != corev1.PodPending {
			continue
		}
		for _, cs := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
			restarts += cs.RestartCount
		}
	}
	limit := ptr.Deref(job.Spec.BackoffLimit, 6)
	if limit == 0 {
		return restarts > 0
	}
	return restarts >= limit
}

func pastDeadline(job *batchv1.Job, now time.Time) bool {
	d := job.Spec.ActiveDeadlineSeconds
	return d != nil && job.Status.StartTime != nil && !suspended(job) && now.Sub(job.Status.StartTime.Time) >= time.Duration(*d)*time.Second
}

// condition is the Job's condition of type t when it is True.
func condition(job *batchv1.Job, t batchv1.JobConditionType) *batchv1.JobCondition {
	for i := range job.Status.Conditions {
		if c := &job.Status.Conditions[i]; c.Type == t && c.Status == corev1.ConditionTrue {
			return c
		}
	}
	return nil
}

func newCondition(t batchv1.JobConditionType, reason, message string, now time.Time) *batchv1.JobCondition {
	return &batchv1.JobCondition{Type: t, Status: corev1.ConditionTrue, Reason: reason, Message: message,
		LastProbeTime: metav1.NewTime(now), LastTransitionTime: metav1.NewTime(now)}
}

// setCondition makes the condition of type t say status, reason and
// message; a False one is only added over an existing condition. It
// reports whether anything changed.
func setCondition(st *batchv1.JobStatus, t batchv1.JobConditionType, status corev1.ConditionStatus, reason, message string, now time.Time) bool {
	for i := range st.Conditions {
		c := &st.Conditions[i]
		if c.Type != t {
			continue
		}
		if c.Status == status && c.Reason == reason && c.Message == message {
			return false
		}
		*c = *newCondition(t, reason, message, now)
		c.Status = status
		return true
	}
	if status == corev1.ConditionFalse {
		return false
	}
	cond := newCondition(t, reason, message, now)
	cond.Status = status
	st.Conditions = append(st.Conditions, *cond)
	return true
}

func uidSet(uids []types.UID) map[types.UID]bool {
	m := make(map[types.UID]bool, len(uids))
	for _, u := range uids {
		m[u] = true
	}
	return m
}
