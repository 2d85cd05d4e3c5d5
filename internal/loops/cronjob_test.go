package loops_test

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api/apitest"
	"github.com/orch-dev/orch/internal/loops"
	"github.com/orch-dev/orch/internal/loops/hollow"
	"github.com/orch-dev/orch/internal/loops/loopstest"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	clocktesting "k8s.io/utils/clock/testing"
)

const cronJobManifest = `apiVersion: batch/v1
kind: CronJob
metadata:
  name: tick
spec:
  schedule: "* * * * *"
  successfulJobsHistoryLimit: 2
  jobTemplate:
    spec:
      template:
        metadata:
          annotations:
            hollow.orch.dev/run-for: 0s
        spec:
          restartPolicy: OnFailure
          containers:
          - name: tick
            image: busybox
`

// TestCronJobWithKubectl: a CronJob every minute, on the loops' fake
// clock, as a user drives it with stock kubectl: each minute one Job
// runs to completion and the history keeps the last two; Forbid starts
// nothing while the Job before still runs; `kubectl create job
// --from=cronjob/` makes one by hand; a malformed schedule is 422 with
// the field and robfig/cron's reason, as in Kubernetes.
func TestCronJobWithKubectl(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kubectl")
	}
	fake := clocktesting.NewFakeClock(time.Now())
	c := loopstest.StartWith(t, map[string]hollow.NodeOptions{"n1": {}}, hollow.Options{LeaseEvery: 100 * time.Millisecond, Clock: fake}, loops.Options{Clock: fake})
	k := apitest.NewKubectl(t, c.Server.Kubeconfig)
	if out, err := k.Try("create", "cronjob", "bad", "--image=busybox", "--schedule=61 * * * *"); err == nil ||
		!strings.Contains(out, `spec.schedule: Invalid value: "61 * * * *": end of range (61) above maximum (59): 61`) {
		t.Errorf("a malformed schedule: %v\n%s", err, out)
	}
	if out, err := k.Try("create", "cronjob", "bad", "--image=busybox", "--schedule=@daily", "--dry-run=server", "-o", "jsonpath={.spec.timeZone}"); err != nil {
		t.Errorf("a macro schedule refused: %v\n%s", err, out)
	}
	manifest := t.TempDir() + "/cj.yaml"
	if err := writeFile(manifest, cronJobManifest); err != nil {
		t.Fatal(err)
	}
	k.Run("apply", "-f", manifest)
	cronJob := func(ctx context.Context) *batchv1.CronJob {
		cj, err := c.Client.BatchV1().CronJobs("default").Get(ctx, "tick", metav1.GetOptions{})
		if err != nil {
			return &batchv1.CronJob{}
		}
		return cj
	}
	// A minute on the fake clock, in steps the hollow nodes' leases keep
	// up with (a lease renewed every 100 ms of real time; eight steps
	// without one before a node looks gone), so that no node looks gone.
	// Each step comes after a pause, so that a change the test just made
	// reaches the controllers' informers before a schedule time passes.
	minute := func() {
		for range 12 {
			time.Sleep(150 * time.Millisecond)
			fake.Step(5 * time.Second)
		}
	}
	// The next scheduled time: a minute or two on the fake clock (the
	// CronJob was made at the server's real time, a moment after the fake
	// clock's start, so the first minute may hold no time of its).
	scheduledAfter := func(prev time.Time) time.Time {
		t.Helper()
		for range 2 {
			minute()
			var last time.Time
			err := wait.PollUntilContextTimeout(c.Ctx, 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
				if cj := cronJob(ctx); cj.Status.LastScheduleTime != nil {
					last = cj.Status.LastScheduleTime.Time
				}
				return last.After(prev), nil
			})
			if err == nil {
				return last
			}
		}
		t.Fatalf("no time scheduled after %v", prev)
		return time.Time{}
	}
	defer func() {
		if !t.Failed() {
			return
		}
		// What the controller saw and did, to tell a Job of a stale
		// template from a status that went missing.
		cj := cronJob(context.Background())
		t.Logf("cronjob status: %+v", cj.Status)
		jobs, err := c.Client.BatchV1().Jobs("default").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Logf("jobs: %v", err)
			return
		}
		for _, j := range jobs.Items {
			t.Logf("job %s run-for %q: %+v", j.Name, j.Spec.Template.Annotations[hollow.RunForAnnotation], j.Status.Conditions)
		}
	}()
	var last time.Time
	for i := range 4 {
		last = scheduledAfter(last)
		due := last
		c.Eventually("minute "+string(rune('1'+i))+"'s Job complete", 30*time.Second, func(ctx context.Context) (bool, error) {
			cj := cronJob(ctx)
			return cj.Status.LastScheduleTime != nil && cj.Status.LastScheduleTime.Time.Equal(due) && len(cj.Status.Active) == 0 &&
				cj.Status.LastSuccessfulTime != nil, nil
		})
	}
	c.Eventually("the last two Jobs kept", 30*time.Second, func(ctx context.Context) (bool, error) {
		jobs, err := c.Client.BatchV1().Jobs("default").List(ctx, metav1.ListOptions{})
		return err == nil && len(jobs.Items) == 2, nil
	})
	if out := k.Run("get", "cronjob", "tick"); !regexp.MustCompile(`(?m)^tick\s+\* \* \* \* \*\s+<none>\s+False\s+0\s+\S+\s+\S+$`).MatchString(out) {
		t.Errorf("kubectl get cronjob:\n%s", out)
	}

	k.Run("patch", "cronjob", "tick", "--type=merge", "-p",
		`{"spec":{"concurrencyPolicy":"Forbid","jobTemplate":{"spec":{"template":{"metadata":{"annotations":{"hollow.orch.dev/run-for":"1h"}}}}}}}`)
	// The controller reads the CronJob from its informer: a schedule time
	// passed before the patch reaches it starts a Job of the old template
	// (seen in CI under load). The watch cache, which feeds the informers,
	// has it first.
	c.Eventually("the patch in the watch cache", 10*time.Second, func(ctx context.Context) (bool, error) {
		cj, err := c.Client.BatchV1().CronJobs("default").Get(ctx, "tick", metav1.GetOptions{ResourceVersion: "0"})
		return err == nil && cj.Spec.ConcurrencyPolicy == batchv1.ForbidConcurrent, nil
	})
	due := scheduledAfter(last)
	c.Eventually("a long Job running", 30*time.Second, func(ctx context.Context) (bool, error) {
		cj := cronJob(ctx)
		return cj.Status.LastScheduleTime.Time.Equal(due) && len(cj.Status.Active) == 1, nil
	})
	minute()
	c.Eventually("Forbid saying why it starts nothing", 30*time.Second, func(ctx context.Context) (bool, error) {
		evs, err := c.Client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "reason=JobAlreadyActive"})
		return err == nil && len(evs.Items) > 0, nil
	})
	if cj := cronJob(c.Ctx); len(cj.Status.Active) != 1 || !cj.Status.LastScheduleTime.Time.Equal(due) {
		t.Errorf("under Forbid: active %v, last scheduled %v (want %v)", cj.Status.Active, cj.Status.LastScheduleTime, due)
	}

	k.Run("create", "job", "--from=cronjob/tick", "by-hand")
	job, err := c.Client.BatchV1().Jobs("default").Get(c.Ctx, "by-hand", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ref := metav1.GetControllerOf(job); ref == nil || ref.Kind != "CronJob" || ref.Name != "tick" ||
		job.Spec.Template.Annotations[hollow.RunForAnnotation] != "1h" || job.Spec.Template.Spec.RestartPolicy != corev1.RestartPolicyOnFailure {
		t.Errorf("job from the CronJob: owner %+v, template %+v", ref, job.Spec.Template)
	}
}
