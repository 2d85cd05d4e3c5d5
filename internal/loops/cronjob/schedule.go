package cronjob

import (
	"errors"
	"time"

	"github.com/robfig/cron/v3"
	batchv1 "k8s.io/api/batch/v1"
)

// manyMissed is how many missed times make the controller say so: more
// than a long weekend of an hourly job, as in Kubernetes, which then
// still starts only the latest.
const manyMissed = 100

// mostRecent is the latest time the schedule names after the CronJob's
// last scheduled time (or its creation) and not after now, nil if none;
// with the deadline, no earlier than startingDeadlineSeconds before now.
// missed counts, roughly, the times passed since; counting them is
// arithmetic over the schedule's interval, not a walk over each, so a
// clock off by years costs nothing.
func mostRecent(cj *batchv1.CronJob, now time.Time, sched cron.Schedule, withDeadline bool) (due *time.Time, missed int64, err error) {
	earliest := earliestTime(cj, now, withDeadline)
	t1 := sched.Next(earliest)
	t2 := sched.Next(t1)
	switch {
	case t1.IsZero() || now.Before(t1):
		return nil, 0, nil
	case now.Before(t2):
		return &t1, 1, nil
	}
	interval := int64(t2.Sub(t1).Round(time.Second).Seconds())
	if interval < 1 {
		// A schedule such as "59 23 31 2 *" parses but names no time.
		return nil, 0, errors.New("time difference between two schedules is less than 1 second")
	}
	missed = int64(now.Sub(t1).Seconds())/interval + 1
	// From one interval before the estimate, the schedule itself says
	// which times fall before now: irregular schedules ("30 6-16/4 * *
	// 1-5") are not multiples of one interval.
	var latest time.Time
	for t := sched.Next(t1.Add(time.Duration((missed-2)*interval) * time.Second)); !t.IsZero() && !t.After(now); t = sched.Next(t) {
		latest = t
	}
	if latest.IsZero() {
		return nil, missed, nil
	}
	return &latest, missed, nil
}

func earliestTime(cj *batchv1.CronJob, now time.Time, withDeadline bool) time.Time {
	earliest := cj.CreationTimestamp.Time
	if cj.Status.LastScheduleTime != nil {
		earliest = cj.Status.LastScheduleTime.Time
	}
	if d := cj.Spec.StartingDeadlineSeconds; withDeadline && d != nil {
		if deadline := now.Add(-time.Duration(*d) * time.Second); deadline.After(earliest) {
			earliest = deadline
		}
	}
	return earliest
}

// nextIn is how long until the CronJob is next due, a little after its
// time.
func nextIn(cj *batchv1.CronJob, now time.Time, sched cron.Schedule) *time.Duration {
	from := earliestTime(cj, now, false)
	if due, _, err := mostRecent(cj, now, sched, false); err != nil {
		from = now
	} else if due != nil {
		from = *due
	}
	next := sched.Next(from)
	if next.IsZero() {
		return nil
	}
	d := next.Add(nextScheduleDelta).Sub(now)
	return &d
}
