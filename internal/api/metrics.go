package api

import (
	"bufio"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/orch-dev/orch/internal/api/rest"
	"github.com/orch-dev/orch/internal/metrics"
	"github.com/orch-dev/orch/internal/store/boltstore"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// apiMetrics are kube-apiserver's request metrics, under its names and
// labels, and what orch's store and watch caches hold. Labels come from
// bounded sets only: a resource the server does not serve, or a verb or
// method it does not know, is recorded as "" or "other", so that no client
// (nor an anonymous one) can grow the series without end.
type apiMetrics struct {
	registry    *prometheus.Registry
	requests    *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	longRunning *prometheus.GaugeVec
}

func newAPIMetrics(s *Server) *apiMetrics {
	m := newRequestMetrics()
	m.registry = metrics.NewRegistry()
	m.registry.MustRegister(m.requests, m.duration, m.longRunning, storageCollector{s})
	return m
}

// newRequestMetrics makes the request metrics, not yet registered.
func newRequestMetrics() *apiMetrics {
	labels := []string{"verb", "group", "version", "resource", "subresource", "scope", "component"}
	return &apiMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "apiserver_request_total",
			Help: "Counter of apiserver requests broken out for each verb, dry run value, group, version, resource, scope, component, and HTTP response code."},
			append(labels, "code")),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "apiserver_request_duration_seconds",
			Help: "Response latency distribution in seconds for each verb, group, version, resource, subresource, scope and component (watches and connections left out).", Buckets: metrics.Buckets},
			labels),
		longRunning: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "apiserver_longrunning_requests",
			Help: "Gauge of all active long-running apiserver requests broken out by verb, group, version, resource, scope and component."},
			labels),
	}
}

// observe wraps a request: it counts it, times it (or, while a watch or a
// stream lasts, counts it as long-running) and records its answer's code.
func (m *apiMetrics) observe(s *Server, w http.ResponseWriter, r *http.Request, info rest.RequestInfo, serve func(http.ResponseWriter)) {
	labels := m.labels(s, r, info)
	rec := &statusRecorder{ResponseWriter: w}
	start := time.Now()
	long := longRunning(info) && info.IsResource
	if long {
		g := m.longRunning.WithLabelValues(labels...)
		g.Inc()
		defer g.Dec()
	}
	serve(rec)
	code := rec.code
	if code == 0 {
		code = http.StatusOK
	}
	m.requests.WithLabelValues(append(labels, strconv.Itoa(code))...).Inc()
	if !long {
		m.duration.WithLabelValues(labels...).Observe(time.Since(start).Seconds())
	}
}

// labels are kube-apiserver's for the request: the verb as it reports it
// (GET, LIST, WATCH, POST, PUT, PATCH, APPLY, DELETE, DELETECOLLECTION,
// CONNECT), the resource only when served, and the scope.
func (m *apiMetrics) labels(s *Server, r *http.Request, info rest.RequestInfo) []string {
	if !info.IsResource {
		method := r.Method
		switch method {
		case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions:
		default:
			method = "other"
		}
		return []string{method, "", "", "", "", "", "apiserver"}
	}
	verb := reportedVerbs[info.Verb]
	if verb == "" {
		verb = "other"
	}
	if verb == "PATCH" && strings.HasPrefix(r.Header.Get("Content-Type"), "application/apply-patch") {
		verb = "APPLY"
	}
	group, version, resource, subresource := "", "", "", ""
	if st := s.catalog.Load().Storage(schema.GroupVersionResource{Group: info.Group, Version: info.Version, Resource: info.Resource}); st != nil {
		group, version, resource = info.Group, info.Version, info.Resource
		if info.Subresource != "" && st.Resource.HasSubresource(info.Subresource) {
			subresource = info.Subresource
			switch subresource {
			case "exec", "attach", "portforward", "proxy":
				verb = "CONNECT"
			}
		}
	}
	return []string{verb, group, version, resource, subresource, scopeOf(info), "apiserver"}
}

// scopeOf is kube-apiserver's scope label: one object, a namespace's, or
// the cluster's.
func scopeOf(info rest.RequestInfo) string {
	switch {
	case info.Name != "":
		return "resource"
	case info.Namespace != "":
		return "namespace"
	}
	return "cluster"
}

// reportedVerbs are kube-apiserver's verb labels for the request verbs.
var reportedVerbs = map[string]string{"get": "GET", "list": "LIST", "watch": "WATCH", "create": "POST", "update": "PUT", "patch": "PATCH",
	"delete": "DELETE", "deletecollection": "DELETECOLLECTION"}

// statusRecorder notes the status code a handler answers with, passing
// flushes and hijacks (watches, streams) through.
type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

func (r *statusRecorder) Flush() { _ = http.NewResponseController(r.ResponseWriter).Flush() }

func (r *statusRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if r.code == 0 {
		r.code = http.StatusSwitchingProtocols
	}
	return http.NewResponseController(r.ResponseWriter).Hijack()
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// What the store and the watch caches hold, read when scraped.
var (
	storageObjectsDesc = prometheus.NewDesc("apiserver_storage_objects",
		"Number of stored objects at the time of last check split by kind (from the resource's watch cache, once it runs).", []string{"resource"}, nil)
	watchersDesc = prometheus.NewDesc("apiserver_registered_watchers",
		"Number of currently registered watchers for a given resources", []string{"group", "version", "kind"}, nil)
	storageSizeDesc = prometheus.NewDesc("apiserver_storage_size_bytes",
		"Size of the storage database file physically allocated in bytes.", []string{"storage_cluster_id"}, nil)
	storeWritesDesc = prometheus.NewDesc("orch_store_writes_total",
		"Writes the store acknowledged since it opened.", nil, nil)
	storeCommitsDesc = prometheus.NewDesc("orch_store_commits_total",
		"Disk commits the store made since it opened (writes share commits; what wears an SD card).", nil, nil)
)

type storageCollector struct{ s *Server }

func (storageCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{storageObjectsDesc, watchersDesc, storageSizeDesc, storeWritesDesc, storeCommitsDesc} {
		ch <- d
	}
}

func (c storageCollector) Collect(ch chan<- prometheus.Metric) {
	for _, st := range c.s.catalog.Load().Storages {
		objects, watchers, ok := st.CacheSize()
		if !ok {
			continue
		}
		gr := st.Resource.GroupResource()
		ch <- prometheus.MustNewConstMetric(storageObjectsDesc, prometheus.GaugeValue, float64(objects), gr.String())
		ch <- prometheus.MustNewConstMetric(watchersDesc, prometheus.GaugeValue, float64(watchers), gr.Group, st.Resource.Version, st.Resource.Kind)
	}
	if st, ok := c.s.store.(interface{ Stats() boltstore.Stats }); ok {
		stats := st.Stats()
		ch <- prometheus.MustNewConstMetric(storageSizeDesc, prometheus.GaugeValue, float64(stats.FileBytes), "orch")
		ch <- prometheus.MustNewConstMetric(storeWritesDesc, prometheus.CounterValue, float64(stats.Writes))
		ch <- prometheus.MustNewConstMetric(storeCommitsDesc, prometheus.CounterValue, float64(stats.Commits))
	}
}
