// Package metrics is what orch's processes tell Prometheus: a registry
// with the Go runtime's and the process's collectors, the handler that
// serves it, and client-go's work-queue metrics under the names
// Kubernetes' controller manager gives them (workqueue_depth,
// workqueue_queue_duration_seconds, ... labelled by queue name). Each
// server has registries of its own, so tests can run several in one
// process.
package metrics

import (
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/util/workqueue"
)

// NewRegistry is a registry holding the Go runtime's and the process's
// metrics (memory, goroutines, CPU seconds, open files).
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Handler serves g in Prometheus' text format (or OpenMetrics when asked),
// serving what it can when a collector fails. It never compresses: a gzip
// writer costs about a megabyte of memory, made again at each scrape once
// the collector has freed the last, for a few kilobytes of text that
// crosses a LAN.
func Handler(g prometheus.Gatherer) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError, DisableCompression: true})
}

// Buckets are the latency buckets orch's histograms share: a subset of
// Kubernetes' (5 ms to 60 s), fewer so that each series costs less memory
// on a small board.
var Buckets = []float64{0.005, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// Workqueues gives client-go's work queues their metrics in reg.
func Workqueues(reg prometheus.Registerer) workqueue.MetricsProvider {
	p := &workqueues{
		depth:      prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "workqueue_depth", Help: "Current depth of workqueue"}, []string{"name"}),
		adds:       prometheus.NewCounterVec(prometheus.CounterOpts{Name: "workqueue_adds_total", Help: "Total number of adds handled by workqueue"}, []string{"name"}),
		latency:    prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "workqueue_queue_duration_seconds", Help: "How long in seconds an item stays in workqueue before being requested.", Buckets: Buckets}, []string{"name"}),
		work:       prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "workqueue_work_duration_seconds", Help: "How long in seconds processing an item from workqueue takes.", Buckets: Buckets}, []string{"name"}),
		unfinished: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "workqueue_unfinished_work_seconds", Help: "How many seconds of work has done that is in progress and hasn't been observed by work_duration. Large values indicate stuck threads. One can deduce the number of stuck threads by observing the rate at which this increases."}, []string{"name"}),
		longest:    prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "workqueue_longest_running_processor_seconds", Help: "How many seconds has the longest running processor for workqueue been running."}, []string{"name"}),
		retries:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "workqueue_retries_total", Help: "Total number of retries handled by workqueue"}, []string{"name"}),
	}
	reg.MustRegister(p.depth, p.adds, p.latency, p.work, p.unfinished, p.longest, p.retries)
	return p
}

type workqueues struct {
	depth, unfinished, longest *prometheus.GaugeVec
	adds, retries              *prometheus.CounterVec
	latency, work              *prometheus.HistogramVec
}

func (p *workqueues) NewDepthMetric(name string) workqueue.GaugeMetric {
	return p.depth.WithLabelValues(name)
}

func (p *workqueues) NewAddsMetric(name string) workqueue.CounterMetric {
	return p.adds.WithLabelValues(name)
}

func (p *workqueues) NewLatencyMetric(name string) workqueue.HistogramMetric {
	return p.latency.WithLabelValues(name)
}

func (p *workqueues) NewWorkDurationMetric(name string) workqueue.HistogramMetric {
	return p.work.WithLabelValues(name)
}

func (p *workqueues) NewUnfinishedWorkSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return p.unfinished.WithLabelValues(name)
}

func (p *workqueues) NewLongestRunningProcessorSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return p.longest.WithLabelValues(name)
}

func (p *workqueues) NewRetriesMetric(name string) workqueue.CounterMetric {
	return p.retries.WithLabelValues(name)
}

// Scope registers in a registry what a part of a process registers while it
// runs, and takes it all out again on Close. The control loops run once per
// term of leadership: a server that loses the lead and wins it back starts
// them again, and their collectors must find their names free.
type Scope struct {
	reg        prometheus.Registerer
	mu         sync.Mutex
	registered []prometheus.Collector
}

// NewScope is a Scope over reg.
func NewScope(reg prometheus.Registerer) *Scope { return &Scope{reg: reg} }

// Register registers c in the registry and remembers it for Close.
func (s *Scope) Register(c prometheus.Collector) error {
	if err := s.reg.Register(c); err != nil {
		return err
	}
	s.mu.Lock()
	s.registered = append(s.registered, c)
	s.mu.Unlock()
	return nil
}

// MustRegister registers cs, panicking on a clash as prometheus does: two
// collectors of one name in one term is a programming error.
func (s *Scope) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := s.Register(c); err != nil {
			panic(err)
		}
	}
}

// Unregister takes c out of the registry.
func (s *Scope) Unregister(c prometheus.Collector) bool {
	s.mu.Lock()
	for i, r := range s.registered {
		if r == c {
			s.registered = append(s.registered[:i], s.registered[i+1:]...)
			break
		}
	}
	s.mu.Unlock()
	return s.reg.Unregister(c)
}

// Close takes every collector registered through s out of the registry.
func (s *Scope) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.registered {
		s.reg.Unregister(c)
	}
	s.registered = nil
}
