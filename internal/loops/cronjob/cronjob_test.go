package cronjob

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/loops/controller"
	"github.com/orch-dev/orch/internal/loops/controllertest"
	"github.com/robfig/cron/v3"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
)

// created is when the test CronJobs were made: a Monday, 10:00:30 UTC.
var created = time.Date(2026, 11, 23, 10, 0, 30, 0, time.UTC)

func start(t testing.TB, now time.Time, objs ...runtime.Object) (*Controller, *controllertest.Fake) {
	t.Helper()
	f := controllertest.New(t, objs...)
	c, err := New(f.Client, f.Informers, f.Events, controller.Env{Clock: clocktesting.NewFakeClock(now)}.WithDefaults())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.queue.ShutDown)
	f.Start()
	return c, f
}

func cronJob(schedule string, change ...func(*batchv1.CronJob)) *batchv1.CronJob {
	cj := &batchv1.CronJob{
		ObjectMeta: metav1.ObjectMeta{Name: "backup", Namespace: "default", UID: "cj-uid", CreationTimestamp: metav1.NewTime(created)},
		Spec: batchv1.CronJobSpec{Schedule: schedule, ConcurrencyPolicy: batchv1.AllowConcurrent, Suspend: ptr.To(false),
			SuccessfulJobsHistoryLimit: ptr.To[int32](3), FailedJobsHistoryLimit: ptr.To[int32](1),
			JobTemplate: batchv1.JobTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "backup"}},
				Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyOnFailure,
					Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}}}},
	}
	for _, f := range change {
		f(cj)
	}
	return cj
}

// ownedJob is a Job of cj's scheduled at the given time, finished as cond
// says ("" for running).
func ownedJob(cj *batchv1.CronJob, at time.Time, cond batchv1.JobConditionType) *batchv1.Job {
	j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: jobName(cj, at), Namespace: cj.Namespace, UID: types.UID("uid-" + jobName(cj, at)),
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(cj, batchv1.SchemeGroupVersion.WithKind("CronJob"))}},
		Status: batchv1.JobStatus{StartTime: &metav1.Time{Time: at}}}
	if cond != "" {
		j.Status.Conditions = []batchv1.JobCondition{{Type: cond, Status: corev1.ConditionTrue}}
		j.Status.CompletionTime = &metav1.Time{Time: at.Add(10 * time.Second)}
	}
	return j
}

func active(jobs ...*batchv1.Job) func(*batchv1.CronJob) {
	return func(cj *batchv1.CronJob) {
		for _, j := range jobs {
			cj.Status.Active = append(cj.Status.Active, corev1.ObjectReference{Kind: "Job", Namespace: j.Namespace, Name: j.Name, UID: j.UID})
		}
	}
}

func (c *Controller) syncAt(t *testing.T) {
	t.Helper()
	if err := c.sync(context.Background(), "default/backup"); err != nil {
		t.Fatal(err)
	}
}

func stored(t *testing.T, f *controllertest.Fake) *batchv1.CronJob {
	t.Helper()
	cj, ok := f.Get(batchv1.SchemeGroupVersion.WithResource("cronjobs"), "default", "backup").(*batchv1.CronJob)
	if !ok {
		t.Fatal("the CronJob is gone")
	}
	return cj
}

func hasEvent(f *controllertest.Fake, prefix string) bool {
	return slices.ContainsFunc(f.Events.List(), func(e string) bool { return strings.HasPrefix(e, prefix) })
}

// TestJobAtScheduledTime: once the schedule's time has come, one Job
// named after the minute, from the template, owned by the CronJob, with
// Kubernetes' scheduled-timestamp annotation; the status lists it and
// the time; the next sync is queued for the next time.
func TestJobAtScheduledTime(t *testing.T) {
	c, f := start(t, created.Add(40*time.Second), cronJob("*/5 * * * *"))
	c.syncAt(t)
	if got := controllertest.Only(f.Writes(), "create", "jobs.batch"); len(got) != 0 {
		t.Fatalf("a Job before its time: %v", got)
	}
	due := time.Date(2026, 11, 23, 10, 5, 0, 0, time.UTC)
	c.clock.(*clocktesting.FakeClock).SetTime(due.Add(2 * time.Second))
	c.syncAt(t)
	creates := controllertest.Only(f.Writes(), "create", "jobs.batch")
	if len(creates) != 1 {
		t.Fatalf("%d Jobs made, want 1", len(creates))
	}
	job := creates[0].Object.(*batchv1.Job)
	if want := fmt.Sprintf("backup-%d", due.Unix()/60); job.Name != want {
		t.Errorf("job name %s, want %s", job.Name, want)
	}
	if ref := metav1.GetControllerOf(job); ref == nil || ref.UID != "cj-uid" || job.Labels["app"] != "backup" ||
		job.Annotations[batchv1.CronJobScheduledTimestampAnnotation] != "2026-11-23T10:05:00Z" {
		t.Errorf("job made: owner %+v, labels %v, annotations %v", ref, job.Labels, job.Annotations)
	}
	cj := stored(t, f)
	if len(cj.Status.Active) != 1 || cj.Status.Active[0].Name != job.Name || !cj.Status.LastScheduleTime.Time.Equal(due) {
		t.Errorf("status %+v", cj.Status)
	}
	if !hasEvent(f, "Normal SuccessfulCreate Created job "+job.Name) {
		t.Errorf("events %v", f.Events.List())
	}
	// The same time again makes nothing more.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if seen, _ := c.cronJobs.CronJobs("default").Get("backup"); seen.ResourceVersion == cj.ResourceVersion || time.Now().After(deadline) {
			break
		}
	}
	c.syncAt(t)
	if got := controllertest.Only(f.Writes(), "create", "jobs.batch"); len(got) != 0 {
		t.Fatalf("a second Job for one time: %v", got)
	}
}

// TestConcurrencyPolicy: Forbid starts nothing while a Job runs (and says
// so), Replace deletes the running one and starts the new, Allow runs
// both.
func TestConcurrencyPolicy(t *testing.T) {
	first := time.Date(2026, 11, 23, 10, 5, 0, 0, time.UTC)
	for _, tc := range []struct {
		policy        batchv1.ConcurrencyPolicy
		created, gone int
		event         string
	}{
		{batchv1.ForbidConcurrent, 0, 0, "Normal JobAlreadyActive"},
		{batchv1.ReplaceConcurrent, 1, 1, "Normal SuccessfulDelete Deleted job backup-"},
		{batchv1.AllowConcurrent, 1, 0, "Normal SuccessfulCreate"},
	} {
		t.Run(string(tc.policy), func(t *testing.T) {
			base := cronJob("*/5 * * * *")
			running := ownedJob(base, first, "")
			cj := cronJob("*/5 * * * *", active(running), func(cj *batchv1.CronJob) {
				cj.Spec.ConcurrencyPolicy = tc.policy
				cj.Status.LastScheduleTime = &metav1.Time{Time: first}
			})
			c, f := start(t, first.Add(5*time.Minute+time.Second), cj, running)
			c.syncAt(t)
			writes := f.Writes()
			if n := len(controllertest.Only(writes, "create", "jobs.batch")); n != tc.created {
				t.Errorf("%d Jobs made, want %d", n, tc.created)
			}
			if n := len(controllertest.Only(writes, "delete", "jobs.batch")); n != tc.gone {
				t.Errorf("%d Jobs deleted, want %d", n, tc.gone)
			}
			if !hasEvent(f, tc.event) {
				t.Errorf("no %q in %v", tc.event, f.Events.List())
			}
			if want := tc.created + 1 - tc.gone; len(stored(t, f).Status.Active) != want {
				t.Errorf("active %v, want %d", stored(t, f).Status.Active, want)
			}
		})
	}
}

// TestMissedTimes: a start later than startingDeadlineSeconds is skipped;
// without a deadline a controller down for hours
// starts only the latest missed time, and past 100 missed says
// TooManyMissedTimes, as Kubernetes does.
func TestMissedTimes(t *testing.T) {
	t.Run("past the deadline", func(t *testing.T) {
		// As in Kubernetes, a time older than the deadline is not even
		// looked at: nothing starts, and the next look is at the next time.
		due := time.Date(2026, 11, 23, 11, 0, 0, 0, time.UTC)
		now := due.Add(2 * time.Minute)
		c, f := start(t, now, cronJob("0 * * * *", func(cj *batchv1.CronJob) { cj.Spec.StartingDeadlineSeconds = ptr.To[int64](60) }))
		c.syncAt(t)
		if n := len(controllertest.Only(f.Writes(), "create", "jobs.batch")); n != 0 {
			t.Errorf("%d Jobs made; events %v", n, f.Events.List())
		}
		sched, _ := cron.ParseStandard("0 * * * *")
		if next := nextIn(stored(t, f), now, sched); next == nil || now.Add(*next).Sub(due.Add(time.Hour)) != nextScheduleDelta {
			t.Errorf("next look in %v, want at 12:00", next)
		}
	})
	t.Run("within the deadline", func(t *testing.T) {
		due := time.Date(2026, 11, 23, 11, 0, 0, 0, time.UTC)
		c, f := start(t, due.Add(30*time.Second), cronJob("0 * * * *", func(cj *batchv1.CronJob) { cj.Spec.StartingDeadlineSeconds = ptr.To[int64](60) }))
		c.syncAt(t)
		if n := len(controllertest.Only(f.Writes(), "create", "jobs.batch")); n != 1 {
			t.Errorf("%d Jobs made, want 1; events %v", n, f.Events.List())
		}
	})
	t.Run("many missed", func(t *testing.T) {
		now := created.Add(200 * time.Minute).Add(10 * time.Second)
		c, f := start(t, now, cronJob("* * * * *"))
		c.syncAt(t)
		creates := controllertest.Only(f.Writes(), "create", "jobs.batch")
		latest := now.Truncate(time.Minute)
		if len(creates) != 1 || creates[0].Name != jobName(stored(t, f), latest) {
			t.Errorf("Jobs made %v, want only the latest time's", creates)
		}
		if !hasEvent(f, "Warning TooManyMissedTimes") {
			t.Errorf("events %v", f.Events.List())
		}
	})
}

// TestHistoryLimits: finished Jobs beyond successfulJobsHistoryLimit and
// failedJobsHistoryLimit are deleted, oldest first; running ones stay.
func TestHistoryLimits(t *testing.T) {
	base := cronJob("0 * * * *")
	objs := []runtime.Object{}
	var jobs []*batchv1.Job
	for i := range 5 {
		jobs = append(jobs, ownedJob(base, created.Add(time.Duration(i)*time.Hour), batchv1.JobComplete))
	}
	for i := 5; i < 8; i++ {
		jobs = append(jobs, ownedJob(base, created.Add(time.Duration(i)*time.Hour), batchv1.JobFailed))
	}
	running := ownedJob(base, created.Add(8*time.Hour), "")
	jobs = append(jobs, running)
	for _, j := range jobs {
		objs = append(objs, j)
	}
	cj := cronJob("0 * * * *", active(running), func(cj *batchv1.CronJob) {
		cj.Status.LastScheduleTime = &metav1.Time{Time: running.Status.StartTime.Time}
	})
	c, f := start(t, running.Status.StartTime.Add(time.Minute), append(objs, cj)...)
	c.syncAt(t)
	var deleted []string
	for _, w := range controllertest.Only(f.Writes(), "delete", "jobs.batch") {
		deleted = append(deleted, w.Name)
	}
	slices.Sort(deleted)
	want := []string{jobs[0].Name, jobs[1].Name, jobs[5].Name, jobs[6].Name}
	slices.Sort(want)
	if !slices.Equal(deleted, want) {
		t.Errorf("deleted %v, want %v", deleted, want)
	}
	if got := stored(t, f).Status.LastSuccessfulTime; got == nil || !got.Equal(jobs[4].Status.CompletionTime) {
		t.Errorf("lastSuccessfulTime %v, want the newest success's %v", got, jobs[4].Status.CompletionTime)
	}
}

// TestFinishedJobLeavesActive: a listed Job that finished is taken off
// status.active with SawCompletedJob; one deleted behind the
// controller's back with MissingJob.
func TestFinishedJobLeavesActive(t *testing.T) {
	base := cronJob("0 0 1 1 *")
	done := ownedJob(base, created, batchv1.JobComplete)
	gone := ownedJob(base, created.Add(time.Minute), "")
	cj := cronJob("0 0 1 1 *", active(done, gone))
	c, f := start(t, created.Add(time.Hour), cj, done)
	c.syncAt(t)
	if a := stored(t, f).Status.Active; len(a) != 0 {
		t.Errorf("active %v", a)
	}
	for _, e := range []string{"Normal SawCompletedJob Saw completed job: " + done.Name, "Normal MissingJob Active job went missing: " + gone.Name} {
		if !hasEvent(f, e) {
			t.Errorf("no %q in %v", e, f.Events.List())
		}
	}
}

// TestSuspendAndTimeZone: a suspended CronJob starts nothing; timeZone
// places the schedule's times in that zone (and the annotation says the
// time there).
func TestSuspendAndTimeZone(t *testing.T) {
	berlin9 := time.Date(2026, 11, 23, 8, 0, 0, 0, time.UTC) // 09:00 in Berlin (CET)
	c, f := start(t, berlin9.Add(time.Second), cronJob("0 9 * * *", func(cj *batchv1.CronJob) { cj.Spec.Suspend = ptr.To(true) }))
	c.syncAt(t)
	if n := len(controllertest.Only(f.Writes(), "create", "jobs.batch")); n != 0 {
		t.Fatalf("a suspended CronJob made %d Jobs", n)
	}
	c, f = start(t, created.Add(time.Minute), cronJob("0 9 * * *", func(cj *batchv1.CronJob) {
		cj.Spec.TimeZone = ptr.To("Europe/Berlin")
		cj.CreationTimestamp = metav1.NewTime(berlin9.Add(-time.Hour))
	}))
	c.clock.(*clocktesting.FakeClock).SetTime(berlin9.Add(-time.Minute))
	c.syncAt(t)
	if n := len(controllertest.Only(f.Writes(), "create", "jobs.batch")); n != 0 {
		t.Fatalf("a Job before 09:00 Berlin")
	}
	c.clock.(*clocktesting.FakeClock).SetTime(berlin9.Add(time.Second))
	c.syncAt(t)
	creates := controllertest.Only(f.Writes(), "create", "jobs.batch")
	if len(creates) != 1 || creates[0].Object.(*batchv1.Job).Annotations[batchv1.CronJobScheduledTimestampAnnotation] != "2026-11-23T09:00:00+01:00" {
		t.Fatalf("Jobs made at 09:00 Berlin: %v", creates)
	}
}

// TestMostRecent: the latest due time for regular, irregular and @every
// schedules, and a schedule that parses but names no day.
func TestMostRecent(t *testing.T) {
	for _, tc := range []struct {
		schedule string
		now      time.Time
		want     string // RFC3339, "" for none
		err      bool
	}{
		{"*/15 * * * *", created.Add(14 * time.Minute), "", false}, // 10:00 is before the creation
		{"*/15 * * * *", created.Add(16 * time.Minute), "2026-11-23T10:15:00Z", false},
		{"*/15 * * * *", created.Add(3 * time.Hour), "2026-11-23T13:00:00Z", false},
		{"30 6-16/4 * * 1-5", created.Add(50 * time.Hour), "2026-11-25T10:30:00Z", false},
		{"@hourly", created.Add(90 * time.Minute), "2026-11-23T11:00:00Z", false},
		{"@every 2h", created.Add(5 * time.Hour), "2026-11-23T14:00:30Z", false},
		{"59 23 31 2 *", created.Add(1000 * time.Hour), "", false},
	} {
		sched, err := cron.ParseStandard(tc.schedule)
		if err != nil {
			t.Fatal(err)
		}
		due, _, err := mostRecent(cronJob(tc.schedule), tc.now, sched, true)
		if (err != nil) != tc.err {
			t.Errorf("%s: err %v", tc.schedule, err)
			continue
		}
		got := ""
		if due != nil {
			got = due.UTC().Format(time.RFC3339)
		}
		if got != tc.want {
			t.Errorf("%s at %s: due %q, want %q", tc.schedule, tc.now.Format(time.RFC3339), got, tc.want)
		}
	}
}
