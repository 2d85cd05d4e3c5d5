// Package cronjob makes Jobs on a schedule, as Kubernetes' CronJob
// controller (v2) does: at each time the cron schedule names (in the
// CronJob's timeZone), a Job named <cronjob>-<minutes since the epoch>
// from the job template, unless the start is later than
// startingDeadlineSeconds allows, the CronJob is suspended, or
// concurrencyPolicy Forbid finds one still running (Replace deletes it
// first). Finished Jobs beyond the history limits are deleted. A CronJob
// waits on the work queue until its next time, not on a poll.
package cronjob

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"
	_ "time/tzdata" // timeZone means the same on a board whose OS has no zoneinfo

	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/loops/controller"
	"github.com/robfig/cron/v3"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	batchlisters "k8s.io/client-go/listers/batch/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

// Controller is the CronJob loop.
type Controller struct {
	client   *kube.Client
	cronJobs batchlisters.CronJobLister
	jobs     batchlisters.JobLister
	synced   []toolscache.InformerSynced
	queue    *controller.Queue[string]
	recorder kube.EventRecorder
	log      *slog.Logger
	clock    clock.PassiveClock
}

// nextScheduleDelta is how long after its time a CronJob is looked at, so
// that the time has surely come on the clock the sync reads.
const nextScheduleDelta = 100 * time.Millisecond

// New registers the controller on the factory's informers.
func New(client *kube.Client, factory *kube.Informers, recorder kube.EventRecorder, env controller.Env) (*Controller, error) {
	cronJobs, jobs := factory.CronJobs(), factory.Jobs()
	c := &Controller{
		client: client, cronJobs: cronJobs.Lister(), jobs: jobs.Lister(), recorder: recorder,
		log: env.Log.With("loop", "cronjob"), clock: env.Clock,
		synced: []toolscache.InformerSynced{cronJobs.Informer().HasSynced, jobs.Informer().HasSynced},
		queue:  controller.NewQueue[string]("cronjob", env),
	}
	if err := c.queue.EnqueueObjects(cronJobs.Informer(), controller.NamespacedKey); err != nil {
		return nil, err
	}
	if err := c.queue.EnqueueControllers(jobs.Informer(), "CronJob", controller.NamespacedKey); err != nil {
		return nil, err
	}
	return c, nil
}

// Run syncs CronJobs until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	c.queue.Run(ctx, workers, c.synced, c.sync)
}

func (c *Controller) sync(ctx context.Context, k string) error {
	ns, name, _ := strings.Cut(k, "/")
	shared, err := c.cronJobs.CronJobs(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	cj := shared.DeepCopy()
	all, err := c.jobs.Jobs(ns).List(labels.Everything())
	if err != nil {
		return err
	}
	var owned []*batchv1.Job
	for _, j := range all {
		if metav1.IsControlledBy(j, cj) {
			owned = append(owned, j)
		}
	}
	now := c.clock.Now()
	statusChanged, err := c.reconcileActive(ctx, cj, owned)
	if err != nil {
		return err
	}
	next, scheduled, err := c.schedule(ctx, cj, now)
	statusChanged = statusChanged || scheduled
	if statusChanged {
		if _, uerr := c.client.CronJobs(ns).UpdateStatus(ctx, cj, metav1.UpdateOptions{}); uerr != nil && !apierrors.IsNotFound(uerr) {
			return fmt.Errorf("cronjob status: %w", uerr)
		}
	}
	if err != nil {
		return err
	}
	if err := c.cleanupFinished(ctx, cj, owned); err != nil {
		return err
	}
	if next != nil {
		c.queue.AddAfter(k, *next)
	}
	return nil
}

// reconcileActive brings status.active and lastSuccessfulTime up to date
// with the CronJob's Jobs, as Kubernetes' controller words what it sees.
func (c *Controller) reconcileActive(ctx context.Context, cj *batchv1.CronJob, owned []*batchv1.Job) (bool, error) {
	changed := false
	children := map[types.UID]bool{}
	for _, j := range owned {
		children[j.UID] = true
		listed := activeIndex(cj, j.UID) >= 0
		done, cond := finished(j)
		switch {
		case !listed && !done:
			c.recorder.Eventf(cj, j, corev1.EventTypeWarning, "UnexpectedJob", "Sync", "Saw a job that the controller did not create or forgot: %s", j.Name)
		case listed && done:
			removeActive(cj, j.UID)
			c.recorder.Eventf(cj, j, corev1.EventTypeNormal, "SawCompletedJob", "Sync", "Saw completed job: %s, condition: %v", j.Name, cond)
			changed = true
		}
		if done && cond == batchv1.JobComplete && j.Status.CompletionTime != nil &&
			(cj.Status.LastSuccessfulTime == nil || j.Status.CompletionTime.After(cj.Status.LastSuccessfulTime.Time)) {
			cj.Status.LastSuccessfulTime = j.Status.CompletionTime
			changed = true
		}
	}
	for _, ref := range slices.Clone(cj.Status.Active) {
		if children[ref.UID] {
			continue
		}
		// The cache may be behind a Job just made: only the API says
		// it is gone.
		_, err := c.client.Jobs(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			c.recorder.Eventf(cj, nil, corev1.EventTypeNormal, "MissingJob", "Sync", "Active job went missing: %v", ref.Name)
			removeActive(cj, ref.UID)
			changed = true
		case err != nil:
			return changed, err
		}
	}
	return changed, nil
}

// schedule starts the Job of the latest time due, if any, and returns
// when the CronJob is next due and whether its status changed.
func (c *Controller) schedule(ctx context.Context, cj *batchv1.CronJob, now time.Time) (*time.Duration, bool, error) {
	if cj.DeletionTimestamp != nil {
		return nil, false, nil
	}
	loc, err := timeZone(cj.Spec.TimeZone)
	if err != nil {
		c.recorder.Eventf(cj, nil, corev1.EventTypeWarning, "UnknownTimeZone", "Schedule", "invalid timeZone: %q: %s", ptr.Deref(cj.Spec.TimeZone, ""), err)
		return nil, false, nil
	}
	sched, err := cron.ParseStandard(cj.Spec.Schedule)
	if err != nil {
		c.recorder.Eventf(cj, nil, corev1.EventTypeWarning, "UnparseableSchedule", "Schedule", "unparseable schedule: %q : %s", cj.Spec.Schedule, err)
		return nil, false, nil
	}
	if spec, ok := sched.(*cron.SpecSchedule); ok {
		spec.Location = loc
	}
	if ptr.Deref(cj.Spec.Suspend, false) {
		return nil, false, nil
	}
	due, missed, err := mostRecent(cj, now, sched, true)
	if err != nil {
		c.recorder.Eventf(cj, nil, corev1.EventTypeWarning, "InvalidSchedule", "Schedule", "invalid schedule: %s : %s", cj.Spec.Schedule, err)
		return nil, false, nil
	}
	next := nextIn(cj, now, sched)
	if due == nil {
		return next, false, nil
	}
	if missed > manyMissed {
		c.recorder.Eventf(cj, nil, corev1.EventTypeWarning, "TooManyMissedTimes", "Schedule", "too many missed start times. Set or decrease .spec.startingDeadlineSeconds or check clock skew")
	}
	if d := cj.Spec.StartingDeadlineSeconds; d != nil && due.Add(time.Duration(*d)*time.Second).Before(now) {
		c.recorder.Eventf(cj, nil, corev1.EventTypeWarning, "MissSchedule", "Schedule", "Missed scheduled time to start a job: %s", due.UTC().Format(time.RFC1123Z))
		return next, false, nil
	}
	name := jobName(cj, *due)
	if cj.Status.LastScheduleTime.Equal(&metav1.Time{Time: *due}) || slices.ContainsFunc(cj.Status.Active, func(r corev1.ObjectReference) bool { return r.Name == name }) {
		return next, false, nil
	}
	if cj.Spec.ConcurrencyPolicy == batchv1.ForbidConcurrent && len(cj.Status.Active) > 0 {
		c.recorder.Eventf(cj, nil, corev1.EventTypeNormal, "JobAlreadyActive", "Schedule", "Not starting job because prior execution is running and concurrency policy is Forbid")
		return next, false, nil
	}
	changed := false
	if cj.Spec.ConcurrencyPolicy == batchv1.ReplaceConcurrent {
		for _, ref := range slices.Clone(cj.Status.Active) {
			if err := c.deleteJob(ctx, cj, ref.Name, ref.UID); err != nil {
				return nil, changed, err
			}
			changed = true
		}
	}
	job := jobFrom(cj, *due, loc)
	made, err := c.client.Jobs(cj.Namespace).Create(ctx, job, metav1.CreateOptions{})
	switch {
	case apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause):
		return nil, changed, nil
	case apierrors.IsAlreadyExists(err):
		// Made before a restart that lost the status write: taken as this
		// time's Job if it is ours and not yet listed.
		if made, err = c.client.Jobs(cj.Namespace).Get(ctx, job.Name, metav1.GetOptions{}); err != nil {
			return nil, changed, err
		}
		if !metav1.IsControlledBy(made, cj) || activeIndex(cj, made.UID) >= 0 {
			return next, changed, nil
		}
	case err != nil:
		c.recorder.Eventf(cj, nil, corev1.EventTypeWarning, "FailedCreate", "Schedule", "Error creating job: %v", err)
		return nil, changed, err
	default:
		c.recorder.Eventf(cj, made, corev1.EventTypeNormal, "SuccessfulCreate", "Schedule", "Created job %v", made.Name)
	}
	cj.Status.Active = append(cj.Status.Active, corev1.ObjectReference{Kind: "Job", Namespace: made.Namespace, Name: made.Name,
		UID: made.UID, APIVersion: batchv1.SchemeGroupVersion.String(), ResourceVersion: made.ResourceVersion})
	cj.Status.LastScheduleTime = &metav1.Time{Time: *due}
	return nextIn(cj, now, sched), true, nil
}

// jobFrom is the Job for the time due: its name is fixed by the time, so
// that no time makes two.
func jobFrom(cj *batchv1.CronJob, due time.Time, loc *time.Location) *batchv1.Job {
	tmpl := &cj.Spec.JobTemplate
	lbls := map[string]string{}
	for k, v := range tmpl.Labels {
		lbls[k] = v
	}
	annotations := map[string]string{}
	for k, v := range tmpl.Annotations {
		annotations[k] = v
	}
	annotations[batchv1.CronJobScheduledTimestampAnnotation] = due.In(loc).Format(time.RFC3339)
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{
		Name: jobName(cj, due), Namespace: cj.Namespace, Labels: lbls, Annotations: annotations,
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(cj, batchv1.SchemeGroupVersion.WithKind("CronJob"))},
	}}
	tmpl.Spec.DeepCopyInto(&job.Spec)
	return job
}

func jobName(cj *batchv1.CronJob, due time.Time) string {
	return fmt.Sprintf("%s-%d", cj.Name, due.Unix()/60)
}

// cleanupFinished deletes the oldest finished Jobs beyond the history
// limits, successful and failed counted apart.
func (c *Controller) cleanupFinished(ctx context.Context, cj *batchv1.CronJob, owned []*batchv1.Job) error {
	var succeeded, failed []*batchv1.Job
	for _, j := range owned {
		switch _, cond := finished(j); cond {
		case batchv1.JobComplete:
			succeeded = append(succeeded, j)
		case batchv1.JobFailed:
			failed = append(failed, j)
		}
	}
	for _, set := range []struct {
		jobs  []*batchv1.Job
		limit *int32
	}{{succeeded, cj.Spec.SuccessfulJobsHistoryLimit}, {failed, cj.Spec.FailedJobsHistoryLimit}} {
		if set.limit == nil || len(set.jobs) <= int(*set.limit) {
			continue
		}
		slices.SortFunc(set.jobs, func(a, b *batchv1.Job) int { return started(a).Compare(started(b)) })
		for _, j := range set.jobs[:len(set.jobs)-int(*set.limit)] {
			if err := c.deleteJob(ctx, cj, j.Name, j.UID); err != nil {
				return err
			}
		}
	}
	return nil
}

func started(j *batchv1.Job) time.Time {
	if j.Status.StartTime != nil {
		return j.Status.StartTime.Time
	}
	return j.CreationTimestamp.Time
}

// deleteJob deletes a Job of the CronJob's, its pods after it
// (background), and takes it off the active list.
func (c *Controller) deleteJob(ctx context.Context, cj *batchv1.CronJob, name string, uid types.UID) error {
	policy := metav1.DeletePropagationBackground
	err := c.client.Jobs(cj.Namespace).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &policy, Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		c.recorder.Eventf(cj, nil, corev1.EventTypeWarning, "FailedDelete", "Delete", "Deleted job: %v", err)
		return fmt.Errorf("delete job %s: %w", name, err)
	}
	removeActive(cj, uid)
	c.recorder.Eventf(cj, nil, corev1.EventTypeNormal, "SuccessfulDelete", "Delete", "Deleted job %v", name)
	return nil
}

func activeIndex(cj *batchv1.CronJob, uid types.UID) int {
	return slices.IndexFunc(cj.Status.Active, func(r corev1.ObjectReference) bool { return r.UID == uid })
}

func removeActive(cj *batchv1.CronJob, uid types.UID) {
	cj.Status.Active = slices.DeleteFunc(cj.Status.Active, func(r corev1.ObjectReference) bool { return r.UID == uid })
}

// finished reports whether the Job is done and its Complete or Failed
// condition type.
func finished(j *batchv1.Job) (bool, batchv1.JobConditionType) {
	for _, c := range j.Status.Conditions {
		if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
			return true, c.Type
		}
	}
	return false, ""
}

// timeZone is where the schedule is read: UTC unless timeZone names an
// IANA zone.
func timeZone(tz *string) (*time.Location, error) {
	if tz == nil {
		return time.UTC, nil
	}
	if *tz == "" || strings.EqualFold(*tz, "Local") {
		return nil, fmt.Errorf("timeZone must be an explicit time zone as defined in https://www.iana.org/time-zones")
	}
	return time.LoadLocation(*tz)
}
