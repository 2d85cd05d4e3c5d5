// Package job runs Jobs to completion, as Kubernetes' Job controller does
// for non-indexed jobs: it keeps up to parallelism pods running until
// completions pods have succeeded, counts failures against backoffLimit,
// stops at activeDeadlineSeconds, marks the job Complete or Failed (with
// the SuccessCriteriaMet and FailureTarget conditions before them, as in
// Kubernetes 1.31+), and deletes finished jobs after
// ttlSecondsAfterFinished.
package job

import (
	"context"
	"fmt"
	"log/slog"
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
	batchlisters "k8s.io/client-go/listers/batch/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

// Controller is the Job loop.
type Controller struct {
	client   *kube.Client
	jobs     batchlisters.JobLister
	pods     corelisters.PodLister
	synced   []toolscache.InformerSynced
	queue    *controller.Queue[string]
	recorder kube.EventRecorder
	log      *slog.Logger
	clock    clock.PassiveClock

	mu sync.Mutex
	// creating counts pods created but not yet seen, per job, so a sync
	// never creates them twice.
	creating map[string]int
}

// New registers the controller on the factory's informers.
func New(client *kube.Client, factory *kube.Informers, recorder kube.EventRecorder, env controller.Env) (*Controller, error) {
	jobs, pods := factory.Jobs(), factory.Pods()
	c := &Controller{
		client: client, jobs: jobs.Lister(), pods: pods.Lister(), recorder: recorder, log: env.Log.With("loop", "job"), clock: env.Clock,
		synced:   []toolscache.InformerSynced{jobs.Informer().HasSynced, pods.Informer().HasSynced},
		queue:    controller.NewQueue[string]("job", env),
		creating: map[string]int{},
	}
	if err := c.queue.EnqueueObjects(jobs.Informer(), controller.NamespacedKey); err != nil {
		return nil, err
	}
	podChanged := func(obj any, added bool) {
		if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		pod, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		ref := metav1.GetControllerOf(pod)
		if ref == nil || ref.Kind != "Job" {
			return
		}
		k := pod.Namespace + "/" + ref.Name
		if added {
			c.mu.Lock()
			if c.creating[k] > 0 {
				c.creating[k]--
			}
			c.mu.Unlock()
		}
		c.queue.Add(k)
	}
	if _, err := pods.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { podChanged(obj, true) },
		UpdateFunc: func(_, obj any) { podChanged(obj, false) },
		DeleteFunc: func(obj any) { podChanged(obj, false) },
	}); err != nil {
		return nil, err
	}
	return c, nil
}

// Run syncs Jobs until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	c.queue.Run(ctx, workers, c.synced, c.sync)
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

func (c *Controller) sync(ctx context.Context, k string) error {
	ns, name, _ := strings.Cut(k, "/")
	shared, err := c.jobs.Jobs(ns).Get(name)
	if apierrors.IsNotFound(err) {
		c.mu.Lock()
		delete(c.creating, k)
		c.mu.Unlock()
		return nil
	}
	if err != nil {
		return err
	}
	job := shared.DeepCopy()
	now := c.clock.Now()
	if done, cond := finished(job); done {
		return c.expire(ctx, job, cond, now)
	}
	if job.DeletionTimestamp != nil {
		return nil
	}
	all, err := c.pods.Pods(ns).List(labels.Everything())
	if err != nil {
		return err
	}
	var active []*corev1.Pod
	var succeeded, failed, ready int32
	for _, p := range all {
		if ref := metav1.GetControllerOf(p); ref == nil || ref.UID != job.UID {
			continue
		}
		switch {
		case p.Status.Phase == corev1.PodSucceeded:
			succeeded++
		case p.Status.Phase == corev1.PodFailed:
			failed++
		case p.DeletionTimestamp == nil:
			active = append(active, p)
			if podReady(p) {
				ready++
			}
		}
	}
	status := job.Status.DeepCopy()
	status.Succeeded, status.Failed, status.Ready = succeeded, failed, ptr.To(ready)
	if status.StartTime == nil && !ptr.Deref(job.Spec.Suspend, false) {
		status.StartTime = &metav1.Time{Time: now}
	}
	completions := job.Spec.Completions
	var failure, failureMessage string
	switch {
	case failed > ptr.Deref(job.Spec.BackoffLimit, 6):
		failure, failureMessage = batchv1.JobReasonBackoffLimitExceeded, "Job has reached the specified backoff limit"
	case job.Spec.ActiveDeadlineSeconds != nil && status.StartTime != nil &&
		now.Sub(status.StartTime.Time) >= time.Duration(*job.Spec.ActiveDeadlineSeconds)*time.Second:
		failure, failureMessage = batchv1.JobReasonDeadlineExceeded, "Job was active longer than specified deadline"
	}
	complete := completions != nil && succeeded >= *completions || completions == nil && succeeded > 0 && len(active) == 0
	switch {
	case failure != "":
		for _, p := range active {
			if err := c.deletePod(ctx, p); err != nil {
				return err
			}
		}
		active = nil
		status.Conditions = setCondition(status.Conditions, batchv1.JobFailureTarget, failure, failureMessage, now)
		status.Conditions = setCondition(status.Conditions, batchv1.JobFailed, failure, failureMessage, now)
		c.recorder.Eventf(job, nil, corev1.EventTypeWarning, failure, "Fail", "%s", failureMessage)
	case complete:
		status.Conditions = setCondition(status.Conditions, batchv1.JobSuccessCriteriaMet, batchv1.JobReasonCompletionsReached, "Reached expected number of succeeded pods", now)
		status.Conditions = setCondition(status.Conditions, batchv1.JobComplete, "", "", now)
		status.CompletionTime = &metav1.Time{Time: now}
		c.recorder.Eventf(job, nil, corev1.EventTypeNormal, "Completed", "Complete", "Job completed")
	case ptr.Deref(job.Spec.Suspend, false):
		for _, p := range active {
			if err := c.deletePod(ctx, p); err != nil {
				return err
			}
		}
		active = nil
	default:
		if err := c.manage(ctx, job, k, active, succeeded); err != nil {
			return err
		}
		if d := job.Spec.ActiveDeadlineSeconds; d != nil && status.StartTime != nil {
			c.queue.AddAfter(k, status.StartTime.Add(time.Duration(*d)*time.Second).Sub(c.clock.Now()))
		}
	}
	status.Active = int32(len(active))
	if status.Active == job.Status.Active && status.Succeeded == job.Status.Succeeded && status.Failed == job.Status.Failed &&
		ptr.Deref(status.Ready, 0) == ptr.Deref(job.Status.Ready, 0) && len(status.Conditions) == len(job.Status.Conditions) &&
		status.StartTime.Equal(job.Status.StartTime) {
		return nil
	}
	job.Status = *status
	if _, err := c.client.Jobs(ns).UpdateStatus(ctx, job, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}

// manage creates the pods the job still needs running.
func (c *Controller) manage(ctx context.Context, job *batchv1.Job, k string, active []*corev1.Pod, succeeded int32) error {
	parallelism := ptr.Deref(job.Spec.Parallelism, 1)
	want := parallelism
	if job.Spec.Completions != nil {
		want = min(parallelism, *job.Spec.Completions-succeeded)
	} else if succeeded > 0 {
		want = 0
	}
	c.mu.Lock()
	inFlight := c.creating[k]
	missing := int(want) - len(active) - inFlight
	if missing > 0 {
		c.creating[k] += missing
	}
	c.mu.Unlock()
	for i := 0; i < missing; i++ {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{
				GenerateName: job.Name + "-", Namespace: job.Namespace, Labels: job.Spec.Template.Labels, Annotations: job.Spec.Template.Annotations,
				OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(job, batchv1.SchemeGroupVersion.WithKind("Job"))},
			},
			Spec: *job.Spec.Template.Spec.DeepCopy(),
		}
		if _, err := c.client.Pods(job.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			c.mu.Lock()
			c.creating[k] -= missing - i
			c.mu.Unlock()
			if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
				return nil
			}
			c.recorder.Eventf(job, nil, corev1.EventTypeWarning, "FailedCreate", "Create", "Error creating: %v", err)
			return err
		}
		c.recorder.Eventf(job, nil, corev1.EventTypeNormal, "SuccessfulCreate", "Create", "Created pod: %s", pod.GenerateName)
	}
	return nil
}

func (c *Controller) deletePod(ctx context.Context, p *corev1.Pod) error {
	err := c.client.Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
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
		c.queue.AddAfter(job.Namespace+"/"+job.Name, at.Sub(now))
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

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func setCondition(conds []batchv1.JobCondition, t batchv1.JobConditionType, reason, message string, now time.Time) []batchv1.JobCondition {
	for _, c := range conds {
		if c.Type == t {
			return conds
		}
	}
	return append(conds, batchv1.JobCondition{Type: t, Status: corev1.ConditionTrue, Reason: reason, Message: message,
		LastProbeTime: metav1.NewTime(now), LastTransitionTime: metav1.NewTime(now)})
}
