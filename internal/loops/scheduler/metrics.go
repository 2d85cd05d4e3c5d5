package scheduler

import (
	"time"

	"github.com/orch-dev/orch/internal/metrics"
	"github.com/prometheus/client_golang/prometheus"
)

// Attempt results, as kube-scheduler labels them.
const (
	resultScheduled     = "scheduled"
	resultUnschedulable = "unschedulable"
	resultError         = "error"
)

// schedulerMetrics are kube-scheduler's attempt counter and latency, for
// its one profile.
type schedulerMetrics struct {
	attempts *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newSchedulerMetrics(reg prometheus.Registerer) *schedulerMetrics {
	m := &schedulerMetrics{
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "scheduler_schedule_attempts_total",
			Help: "Number of attempts to schedule pods, by the result. 'unschedulable' means a pod could not be scheduled, while 'error' means an internal scheduler problem."},
			[]string{"result", "profile"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "scheduler_scheduling_attempt_duration_seconds",
			Help: "Scheduling attempt latency in seconds (scheduling algorithm + binding)", Buckets: metrics.Buckets},
			[]string{"result", "profile"}),
	}
	if reg != nil {
		reg.MustRegister(m.attempts, m.duration)
	}
	return m
}

// attempt records one attempt begun at start.
func (m *schedulerMetrics) attempt(result string, start time.Time) {
	m.attempts.WithLabelValues(result, Name).Inc()
	m.duration.WithLabelValues(result, Name).Observe(time.Since(start).Seconds())
}
