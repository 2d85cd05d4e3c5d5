package job_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/loops/hollow"
	"github.com/orch-dev/orch/internal/loops/loopstest"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func job(name string, exitCode string) *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: batchv1.JobSpec{
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{hollow.RunForAnnotation: "100ms", hollow.ExitCodeAnnotation: exitCode}},
				Spec:       corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
			},
		},
	}
}

func condition(j *batchv1.Job, t batchv1.JobConditionType) *batchv1.JobCondition {
	for i := range j.Status.Conditions {
		if j.Status.Conditions[i].Type == t && j.Status.Conditions[i].Status == corev1.ConditionTrue {
			return &j.Status.Conditions[i]
		}
	}
	return nil
}

func TestJobs(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out failing pods' back-offs (10 s): not in the unit tier")
	}
	c := loopstest.Start(t, map[string]hollow.NodeOptions{"n1": {}, "n2": {}}, hollow.Options{LeaseEvery: -1})
	jobs := c.Client.BatchV1().Jobs("default")

	ok := job("ok", "0")
	ok.Spec.Completions, ok.Spec.Parallelism = ptr.To[int32](4), ptr.To[int32](2)
	ok.Spec.TTLSecondsAfterFinished = ptr.To[int32](1)
	if _, err := jobs.Create(c.Ctx, ok, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bad := job("bad", "1")
	bad.Spec.BackoffLimit = ptr.To[int32](1)
	if _, err := jobs.Create(c.Ctx, bad, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("ok completes 4 of 4", 30*time.Second, func(ctx context.Context) (bool, error) {
		j, err := jobs.Get(ctx, "ok", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			t.Fatal("the job went before anyone saw it complete")
		}
		return err == nil && condition(j, batchv1.JobComplete) != nil && j.Status.Succeeded == 4 && j.Status.Active == 0 && j.Status.CompletionTime != nil, nil
	})
	c.Eventually("bad fails after its backoff limit", 30*time.Second, func(ctx context.Context) (bool, error) {
		j, err := jobs.Get(ctx, "bad", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		f := condition(j, batchv1.JobFailed)
		return f != nil && f.Reason == batchv1.JobReasonBackoffLimitExceeded && j.Status.Failed == 2, nil
	})
	c.Eventually("ok deleted with its pods a second after finishing", 30*time.Second, func(ctx context.Context) (bool, error) {
		_, err := jobs.Get(ctx, "ok", metav1.GetOptions{})
		pods, lerr := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "job-name=ok"})
		return apierrors.IsNotFound(err) && lerr == nil && len(pods.Items) == 0, nil
	})

	slow := job("slow", "0")
	slow.Spec.Template.Annotations[hollow.RunForAnnotation] = "1h"
	slow.Spec.ActiveDeadlineSeconds = ptr.To[int64](1)
	if _, err := jobs.Create(c.Ctx, slow, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("slow fails at its deadline", 30*time.Second, func(ctx context.Context) (bool, error) {
		j, err := jobs.Get(ctx, "slow", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		f := condition(j, batchv1.JobFailed)
		return f != nil && f.Reason == batchv1.JobReasonDeadlineExceeded && j.Status.Active == 0, nil
	})
}

// exit ends a running pod's containers with code, as a kubelet reports it.
func exit(ctx context.Context, t *testing.T, c *loopstest.Cluster, pod corev1.Pod, code int32) {
	t.Helper()
	p, err := c.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	p.Status.Phase = corev1.PodSucceeded
	if code != 0 {
		p.Status.Phase = corev1.PodFailed
	}
	for i := range p.Status.ContainerStatuses {
		p.Status.ContainerStatuses[i].Ready = false
		p.Status.ContainerStatuses[i].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, FinishedAt: now}}
	}
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == corev1.PodReady {
			p.Status.Conditions[i].Status, p.Status.Conditions[i].LastTransitionTime = corev1.ConditionFalse, now
		}
	}
	if _, err := c.Client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// running waits for n running pods of the job, and returns them by
// completion index (or in any order for a NonIndexed job).
func running(t *testing.T, c *loopstest.Cluster, name string, n int) map[string]corev1.Pod {
	t.Helper()
	var out map[string]corev1.Pod
	c.Eventually(fmt.Sprintf("%d running pods of %s", n, name), 30*time.Second, func(ctx context.Context) (bool, error) {
		pods, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + name})
		if err != nil {
			return false, err
		}
		out = map[string]corev1.Pod{}
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				k := p.Annotations[batchv1.JobCompletionIndexAnnotation]
				if k == "" {
					k = p.Name
				}
				out[k] = p
			}
		}
		return len(out) == n, nil
	})
	return out
}

func waitJob(t *testing.T, c *loopstest.Cluster, name, what string, cond func(j *batchv1.Job) bool) *batchv1.Job {
	t.Helper()
	var j *batchv1.Job
	c.Eventually(name+": "+what, 30*time.Second, func(ctx context.Context) (bool, error) {
		var err error
		j, err = c.Client.BatchV1().Jobs("default").Get(ctx, name, metav1.GetOptions{})
		return err == nil && cond(j), err
	})
	return j
}

func forever(name string) *batchv1.Job {
	j := job(name, "0")
	j.Spec.Template.Annotations = nil // run until the test ends them
	return j
}

// TestIndexedJob: an Indexed Job gives each pod its index (annotation,
// label, JOB_COMPLETION_INDEX, hostname <job>-<index>, generateName
// <job>-<index>-), runs the lowest pending indexes first and completes
// with every index in status.completedIndexes; its pods carry the tracking
// finalizer while they count and lose it once counted, as on Kubernetes.
func TestIndexedJob(t *testing.T) {
	c := loopstest.Start(t, map[string]hollow.NodeOptions{"n1": {}}, hollow.Options{LeaseEvery: -1})
	j := forever("idx")
	j.Spec.CompletionMode = ptr.To(batchv1.IndexedCompletion)
	j.Spec.Completions, j.Spec.Parallelism = ptr.To[int32](4), ptr.To[int32](2)
	if _, err := c.Client.BatchV1().Jobs("default").Create(c.Ctx, j, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	first := running(t, c, "idx", 2)
	for _, ix := range []string{"0", "1"} {
		p, ok := first[ix]
		if !ok {
			t.Fatalf("running indexes %v, want 0 and 1", first)
		}
		env := p.Spec.Containers[0].Env
		if p.Spec.Hostname != "idx-"+ix || p.Labels[batchv1.JobCompletionIndexAnnotation] != ix || !strings.HasPrefix(p.Name, "idx-"+ix+"-") ||
			len(env) != 1 || env[0].Name != "JOB_COMPLETION_INDEX" || env[0].ValueFrom.FieldRef.FieldPath != "metadata.labels['batch.kubernetes.io/job-completion-index']" ||
			!slices.Contains(p.Finalizers, batchv1.JobTrackingFinalizer) {
			t.Fatalf("index %s: pod %s hostname %q labels %v env %+v finalizers %v", ix, p.Name, p.Spec.Hostname, p.Labels, env, p.Finalizers)
		}
		exit(c.Ctx, t, c, p, 0)
	}
	waitJob(t, c, "idx", "indexes 0 and 1 counted", func(j *batchv1.Job) bool { return j.Status.CompletedIndexes == "0,1" && j.Status.Succeeded == 2 })
	for _, p := range running(t, c, "idx", 2) {
		exit(c.Ctx, t, c, p, 0)
	}
	done := waitJob(t, c, "idx", "complete", func(j *batchv1.Job) bool { return condition(j, batchv1.JobComplete) != nil })
	if done.Status.CompletedIndexes != "0-3" || done.Status.Succeeded != 4 || condition(done, batchv1.JobSuccessCriteriaMet) == nil ||
		condition(done, batchv1.JobComplete).Reason != batchv1.JobReasonCompletionsReached {
		t.Fatalf("finished status: %+v", done.Status)
	}
	pods, err := c.Client.CoreV1().Pods("default").List(c.Ctx, metav1.ListOptions{LabelSelector: "job-name=idx"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if len(p.Finalizers) > 0 {
			t.Errorf("pod %s of the finished job keeps finalizers %v", p.Name, p.Finalizers)
		}
	}
	if len(pods.Items) != 4 {
		t.Errorf("%d pods for 4 indexes", len(pods.Items))
	}
}

// TestPodFailurePolicy: a FailJob rule fails the Job at the first matching
// exit code (FailureTarget, then Failed once its other pod is gone, which
// counts as failed); an Ignore rule's failures do not count against a
// backoffLimit of 0, and the pod is replaced.
func TestPodFailurePolicy(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out a pod failure's 10 s back-off: not in the unit tier")
	}
	c := loopstest.Start(t, map[string]hollow.NodeOptions{"n1": {}}, hollow.Options{LeaseEvery: -1})
	jobs := c.Client.BatchV1().Jobs("default")
	failJob := forever("failjob")
	failJob.Spec.Completions, failJob.Spec.Parallelism = ptr.To[int32](2), ptr.To[int32](2)
	failJob.Spec.PodFailurePolicy = &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{
		Action: batchv1.PodFailurePolicyActionFailJob, OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{Operator: batchv1.PodFailurePolicyOnExitCodesOpIn, Values: []int32{3}}}}}
	ignore := forever("ignore")
	ignore.Spec.BackoffLimit = ptr.To[int32](0)
	ignore.Spec.PodFailurePolicy = &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{
		Action: batchv1.PodFailurePolicyActionIgnore, OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{Operator: batchv1.PodFailurePolicyOnExitCodesOpIn, Values: []int32{42}}}}}
	for _, j := range []*batchv1.Job{failJob, ignore} {
		if _, err := jobs.Create(c.Ctx, j, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range running(t, c, "failjob", 2) {
		exit(c.Ctx, t, c, p, 3)
		break
	}
	failed := waitJob(t, c, "failjob", "failed", func(j *batchv1.Job) bool { return condition(j, batchv1.JobFailed) != nil })
	if f := condition(failed, batchv1.JobFailed); f.Reason != batchv1.JobReasonPodFailurePolicy || !strings.Contains(f.Message, "failed with exit code 3 matching FailJob rule at index 0") ||
		condition(failed, batchv1.JobFailureTarget) == nil || failed.Status.Failed != 2 || failed.Status.Active != 0 {
		t.Fatalf("status: %+v", failed.Status)
	}

	for _, p := range running(t, c, "ignore", 1) {
		exit(c.Ctx, t, c, p, 42)
	}
	// The replacement comes after the back-off (10 s) of the failure.
	c.Eventually("the ignored failure's pod replaced", 30*time.Second, func(ctx context.Context) (bool, error) {
		pods, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "job-name=ignore"})
		return err == nil && len(pods.Items) == 2, err
	})
	for _, p := range running(t, c, "ignore", 1) {
		exit(c.Ctx, t, c, p, 0)
	}
	done := waitJob(t, c, "ignore", "complete", func(j *batchv1.Job) bool { return condition(j, batchv1.JobComplete) != nil })
	if done.Status.Failed != 0 || done.Status.Succeeded != 1 {
		t.Fatalf("an ignored failure counted: %+v", done.Status)
	}
}

// TestIndexesFailAndSucceed: backoffLimitPerIndex fails an index, not the
// Job, until more than maxFailedIndexes failed; a successPolicy completes
// an Indexed Job before all its indexes ran, ending the others.
func TestIndexesFailAndSucceed(t *testing.T) {
	c := loopstest.Start(t, map[string]hollow.NodeOptions{"n1": {}}, hollow.Options{LeaseEvery: -1})
	jobs := c.Client.BatchV1().Jobs("default")
	perIndex := forever("perindex")
	perIndex.Spec.CompletionMode = ptr.To(batchv1.IndexedCompletion)
	perIndex.Spec.Completions, perIndex.Spec.Parallelism = ptr.To[int32](3), ptr.To[int32](3)
	perIndex.Spec.BackoffLimitPerIndex, perIndex.Spec.MaxFailedIndexes = ptr.To[int32](0), ptr.To[int32](1)
	perIndex.Spec.BackoffLimit = nil
	policy := forever("policy")
	policy.Spec.CompletionMode = ptr.To(batchv1.IndexedCompletion)
	policy.Spec.Completions, policy.Spec.Parallelism = ptr.To[int32](3), ptr.To[int32](3)
	policy.Spec.SuccessPolicy = &batchv1.SuccessPolicy{Rules: []batchv1.SuccessPolicyRule{{SucceededIndexes: ptr.To("0")}}}
	for _, j := range []*batchv1.Job{perIndex, policy} {
		if _, err := jobs.Create(c.Ctx, j, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pods := running(t, c, "perindex", 3)
	exit(c.Ctx, t, c, pods["1"], 1)
	// The failed pod is first recorded as uncounted, then counted (as on
	// Kubernetes): wait for the counted state.
	one := waitJob(t, c, "perindex", "index 1 failed", func(j *batchv1.Job) bool {
		return ptr.Deref(j.Status.FailedIndexes, "") == "1" && j.Status.Failed == 1
	})
	if finishedNow, _ := jobFinished(one); finishedNow {
		t.Fatalf("one failed index of at most 1: %+v", one.Status)
	}
	exit(c.Ctx, t, c, pods["2"], 1)
	failed := waitJob(t, c, "perindex", "failed", func(j *batchv1.Job) bool { return condition(j, batchv1.JobFailed) != nil })
	if f := condition(failed, batchv1.JobFailed); f.Reason != batchv1.JobReasonMaxFailedIndexesExceeded || ptr.Deref(failed.Status.FailedIndexes, "") != "1,2" {
		t.Fatalf("status: %+v", failed.Status)
	}

	pods = running(t, c, "policy", 3)
	exit(c.Ctx, t, c, pods["0"], 0)
	done := waitJob(t, c, "policy", "complete", func(j *batchv1.Job) bool { return condition(j, batchv1.JobComplete) != nil })
	if met := condition(done, batchv1.JobSuccessCriteriaMet); met == nil || met.Reason != batchv1.JobReasonSuccessPolicy || met.Message != "Matched rules at index 0" ||
		done.Status.CompletedIndexes != "0" || done.Status.Active != 0 || condition(done, batchv1.JobComplete).Reason != batchv1.JobReasonSuccessPolicy {
		t.Fatalf("status: %+v", done.Status)
	}
}

func jobFinished(j *batchv1.Job) (bool, string) {
	for _, t := range []batchv1.JobConditionType{batchv1.JobComplete, batchv1.JobFailed} {
		if condition(j, t) != nil {
			return true, string(t)
		}
	}
	return false, ""
}

// TestJobCountsDeletedPodsAndAdopts: a pod deleted right after it
// succeeded still counts once (its tracking finalizer keeps it until it
// is counted); a pod orphaned by hand is adopted again, and one whose
// labels stop matching is released without its finalizer, as on
// Kubernetes.
func TestJobCountsDeletedPodsAndAdopts(t *testing.T) {
	c := loopstest.Start(t, map[string]hollow.NodeOptions{"n1": {}}, hollow.Options{LeaseEvery: -1})
	pods := c.Client.CoreV1().Pods("default")
	j := forever("counted")
	j.Spec.Completions, j.Spec.Parallelism = ptr.To[int32](2), ptr.To[int32](1)
	if _, err := c.Client.BatchV1().Jobs("default").Create(c.Ctx, j, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range running(t, c, "counted", 1) {
		exit(c.Ctx, t, c, p, 0)
		if err := pods.Delete(c.Ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			t.Fatal(err)
		}
	}
	waitJob(t, c, "counted", "the deleted pod counted", func(j *batchv1.Job) bool { return j.Status.Succeeded == 1 })

	var p corev1.Pod
	for _, p = range running(t, c, "counted", 1) {
	}
	p.OwnerReferences = nil
	if _, err := pods.Update(c.Ctx, &p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("the orphan adopted again", 30*time.Second, func(ctx context.Context) (bool, error) {
		got, err := pods.Get(ctx, p.Name, metav1.GetOptions{})
		return err == nil && metav1.GetControllerOf(got) != nil && metav1.GetControllerOf(got).Name == "counted", err
	})
	got, err := pods.Get(c.Ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got.Labels = nil
	if _, err := pods.Update(c.Ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("the pod released, without the tracking finalizer", 30*time.Second, func(ctx context.Context) (bool, error) {
		got, err := pods.Get(ctx, p.Name, metav1.GetOptions{})
		return err == nil && metav1.GetControllerOf(got) == nil && len(got.Finalizers) == 0, err
	})
	// The job replaces the released pod.
	running(t, c, "counted", 1)
	waitJob(t, c, "counted", "one active, one succeeded", func(j *batchv1.Job) bool { return j.Status.Active == 1 && j.Status.Succeeded == 1 })
}
