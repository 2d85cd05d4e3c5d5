package api

import (
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api/resources/builtin"
	"github.com/orch-dev/orch/internal/api/rest"
)

// BenchmarkRequestMetricsMemory measures what the request metrics cost
// at their worst: every built-in resource seen with every verb, scope and
// four answer codes (a bound no real cluster reaches: most verbs meet one
// or two scopes and codes). It reports the series made, the heap they
// hold, per series, and the time one observation takes.
func BenchmarkRequestMetricsMemory(b *testing.B) {
	verbs := []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
	scopes := []rest.RequestInfo{{}, {Namespace: "default"}, {Namespace: "default", Name: "x"}}
	codes := []int{200, 404, 409, 422}
	all := builtin.Resources()
	for b.Loop() {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		m := newRequestMetrics()
		series := 0
		start := time.Now()
		observations := 0
		for _, r := range all {
			for _, verb := range verbs {
				for _, scope := range scopes {
					labels := []string{verb, r.Group, r.Version, r.Plural, "", scopeOf(scope), "apiserver"}
					m.duration.WithLabelValues(labels...).Observe(0.01)
					series++
					for _, code := range codes {
						m.requests.WithLabelValues(append(labels, strconv.Itoa(code))...).Inc()
						series++
						observations++
					}
				}
			}
		}
		elapsed := time.Since(start)
		runtime.GC()
		runtime.ReadMemStats(&after)
		heap := float64(after.HeapInuse) - float64(before.HeapInuse)
		b.ReportMetric(float64(series), "series")
		b.ReportMetric(heap/(1<<20), "heap-MB")
		b.ReportMetric(heap/float64(series), "B/series")
		b.ReportMetric(float64(elapsed.Nanoseconds())/float64(observations), "ns/first-observation")
		runtime.KeepAlive(m)
	}
}
