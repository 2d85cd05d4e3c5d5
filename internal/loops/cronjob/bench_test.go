package cronjob

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// resyncEvery is the loops' default informer resync: on an idle cluster
// each CronJob is synced once per resync and once per time it is due.
const resyncEvery = 10 * time.Minute

// BenchmarkCronJobs1000: 1,000 CronJobs none of which is due (an idle
// cluster), each synced as a resync does: the cost of one sync, and what
// that makes of a core per minute at one resync per 10 minutes plus one
// look per CronJob per hour ("@hourly" being the busiest schedule here).
func BenchmarkCronJobs1000(b *testing.B) {
	const n = 1000
	var objs []runtime.Object
	schedules := []string{"@hourly", "0 3 * * *", "15 2 * * 1-5", "0 0 1 * *"}
	for i := range n {
		cj := cronJob(schedules[i%len(schedules)])
		cj.Name, cj.UID = fmt.Sprintf("cj-%04d", i), ""
		cj.CreationTimestamp = metav1.NewTime(created)
		objs = append(objs, cj)
	}
	c, _ := start(b, created.Add(10*time.Second), objs...)
	ctx := context.Background()
	b.ResetTimer()
	start := time.Now()
	for range b.N { // one op: every CronJob synced once, as one resync
		for i := range n {
			if err := c.sync(ctx, fmt.Sprintf("default/cj-%04d", i)); err != nil {
				b.Fatal(err)
			}
		}
	}
	perSync := time.Since(start) / time.Duration(b.N*n)
	syncsPerMinute := float64(n)/resyncEvery.Minutes() + float64(n)/60
	b.ReportMetric(float64(perSync.Microseconds()), "µs/sync")
	b.ReportMetric(100*syncsPerMinute*perSync.Seconds()/60, "%core-idle")
}
