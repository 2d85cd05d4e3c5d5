package job

import (
	"context"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/loops/controller"
	"github.com/orch-dev/orch/internal/loops/controllertest"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

func start(t *testing.T, objs ...runtime.Object) (*Controller, *controllertest.Fake) {
	t.Helper()
	f := controllertest.New(t, objs...)
	c, err := New(f.Client, f.Informers, f.Events, controller.Env{}.WithDefaults())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.queue.ShutDown) // the queue's delaying goroutine, which Run would end
	f.Start()
	return c, f
}

func job(parallelism, completions int32) *batchv1.Job {
	labels := map[string]string{batchv1.ControllerUidLabel: "job-uid"}
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "batch", Namespace: "default", UID: "job-uid"},
		Spec: batchv1.JobSpec{Parallelism: ptr.To(parallelism), Completions: ptr.To(completions), BackoffLimit: ptr.To[int32](6),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}},
	}
}

// TestSyncStartsParallelism: a new Job of 5 completions, 2 at a time,
// starts 2 pods from its template, owned by it, and records its start.
func TestSyncStartsParallelism(t *testing.T) {
	j := job(2, 5)
	c, f := start(t, j)
	if err := c.sync(context.Background(), key{namespace: "default", name: "batch"}); err != nil {
		t.Fatal(err)
	}
	writes := f.Writes()
	creates := controllertest.Only(writes, "create", "pods")
	if len(creates) != 2 {
		t.Fatalf("%d pods created, want 2: %v", len(creates), writes)
	}
	for _, w := range creates {
		p := w.Object.(*corev1.Pod)
		if ref := metav1.GetControllerOf(p); ref == nil || ref.UID != j.UID || p.Spec.RestartPolicy != corev1.RestartPolicyNever {
			t.Errorf("pod made: owner %+v, restartPolicy %s", ref, p.Spec.RestartPolicy)
		}
	}
	got, ok := f.Get(batchv1.SchemeGroupVersion.WithResource("jobs"), "default", "batch").(*batchv1.Job)
	if !ok || got.Status.StartTime == nil {
		t.Fatalf("the job's status after its first sync: %+v", got)
	}
}

// TestSyncCompletes: with every completion done by succeeded pods (made by
// this loop, so carrying its tracking finalizer), the Job counts them,
// takes their finalizers off, is Complete and starts nothing more.
func TestSyncCompletes(t *testing.T) {
	j := job(2, 2)
	now := metav1.Now()
	j.Status.StartTime = &now
	var objs []runtime.Object
	objs = append(objs, j)
	for _, name := range []string{"batch-a", "batch-b"} {
		objs = append(objs, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: j.Spec.Template.Labels,
			Finalizers:      []string{batchv1.JobTrackingFinalizer},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(j, batchv1.SchemeGroupVersion.WithKind("Job"))}},
			Spec: j.Spec.Template.Spec, Status: corev1.PodStatus{Phase: corev1.PodSucceeded}})
	}
	c, f := start(t, objs...)
	if err := c.sync(context.Background(), key{namespace: "default", name: "batch"}); err != nil {
		t.Fatal(err)
	}
	if creates := controllertest.Only(f.Writes(), "create", "pods"); len(creates) != 0 {
		t.Fatalf("a finished job started %d pods", len(creates))
	}
	got := f.Get(batchv1.SchemeGroupVersion.WithResource("jobs"), "default", "batch").(*batchv1.Job)
	complete := false
	for _, cond := range got.Status.Conditions {
		complete = complete || cond.Type == batchv1.JobComplete && cond.Status == corev1.ConditionTrue
	}
	if !complete || got.Status.Succeeded != 2 {
		t.Fatalf("job status: %+v", got.Status)
	}
}

// TestSyncFailsWithTerminatingPod: a sync that deleted a Job's other pod
// after a FailJob exit but could not write its status leaves that pod
// terminating, held by its tracking finalizer. The next sync must still
// decide the failure and let the pod go: the deletion counts as seen once
// the pod is marked, as in Kubernetes' Job controller; waiting for the pod
// to be gone would wait on itself until the expectations expire (5 min).
func TestSyncFailsWithTerminatingPod(t *testing.T) {
	j := job(2, 2)
	j.Spec.PodFailurePolicy = &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{Action: batchv1.PodFailurePolicyActionFailJob,
		OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{Operator: batchv1.PodFailurePolicyOnExitCodesOpIn, Values: []int32{3}}}}}
	now := metav1.Now()
	j.Status.StartTime = &now
	pod := func(name string, st corev1.PodStatus) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name), Labels: j.Spec.Template.Labels,
			Finalizers:      []string{batchv1.JobTrackingFinalizer},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(j, batchv1.SchemeGroupVersion.WithKind("Job"))}},
			Spec: j.Spec.Template.Spec, Status: st}
	}
	failed := pod("batch-a", corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{{Name: "c",
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 3}}}}})
	other := pod("batch-b", corev1.PodStatus{Phase: corev1.PodRunning})
	other.Spec.NodeName = "n1"
	c, f := start(t, j, failed, other)
	ctx := context.Background()
	k := key{namespace: "default", name: "batch"}
	// The earlier sync's delete, whose status write was lost.
	c.expect.Raise(k.String(), other.UID)
	if err := f.Client.Pods("default").Delete(ctx, other.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	// The informer's cache holds the mark before its handlers run, and the
	// handler is what lowers the expectation: wait for both.
	for !c.expect.Satisfied(k.String()) {
		if time.Now().After(deadline) {
			t.Fatal("the pod's deletion mark was never seen by the loop's handler")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := c.sync(ctx, k); err != nil {
		t.Fatal(err)
	}
	got := f.Get(batchv1.SchemeGroupVersion.WithResource("jobs"), "default", "batch").(*batchv1.Job)
	if condition(got, batchv1.JobFailureTarget) == nil {
		t.Fatalf("no FailureTarget with the failing pod seen: %+v", got.Status)
	}
	if p := f.Get(corev1.SchemeGroupVersion.WithResource("pods"), "default", other.Name); p != nil && hasTrackingFinalizer(p.(*corev1.Pod)) {
		t.Fatal("the terminating pod of a failed Job keeps its tracking finalizer")
	}
}
