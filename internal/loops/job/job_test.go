package job_test

import (
	"context"
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
