package agent

import (
	"net/http"

	"github.com/orch-dev/orch/internal/agent/pods"
	"github.com/orch-dev/orch/internal/agent/usage"
	"github.com/orch-dev/orch/internal/metrics"
	"github.com/prometheus/client_golang/prometheus"
)

// metricsHandlers are the kubelet's three metrics endpoints on :10250:
// /metrics (the agent process and its pods), /metrics/resource (what
// metrics-server, and orch's server for `kubectl top`, scrape: CPU and
// memory of the node, pods and containers) and /metrics/cadvisor (the
// containers' cgroup figures under cadvisor's names, for Prometheus).
// Each is a registry of its own, read when scraped: nothing is sampled
// in the background.
func (a *kubeletAPI) metricsHandlers(mux *http.ServeMux) {
	own := metrics.NewRegistry()
	own.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kubelet_running_pods", Help: "Number of pods that have a running pod sandbox"},
		func() float64 { pods, _ := a.running(); return float64(pods) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kubelet_running_containers", Help: "Number of containers currently running",
			ConstLabels: prometheus.Labels{"container_state": "running"}},
			func() float64 { _, containers := a.running(); return float64(containers) }))
	resource := prometheus.NewRegistry()
	resource.MustRegister(resourceCollector{a})
	cadvisor := prometheus.NewRegistry()
	cadvisor.MustRegister(cadvisorCollector{a})
	mux.Handle("GET /metrics", metrics.Handler(own))
	mux.Handle("GET /metrics/resource", metrics.Handler(resource))
	mux.Handle("GET /metrics/cadvisor", metrics.Handler(cadvisor))
}

func (a *kubeletAPI) usage() []pods.ContainerUsage {
	if m := a.pods.Load(); m != nil {
		return m.Usage()
	}
	return nil
}

// running counts running pods and containers from the pod manager's
// state: no cgroup is read for a count.
func (a *kubeletAPI) running() (pods, containers int) {
	if m := a.pods.Load(); m != nil {
		return m.Running()
	}
	return 0, 0
}

// The kubelet's resource metrics (its /metrics/resource), names, help
// and labels as it has them.
var (
	nodeCPUDesc        = prometheus.NewDesc("node_cpu_usage_seconds_total", "Cumulative cpu time consumed by the node in core-seconds", nil, nil)
	nodeMemoryDesc     = prometheus.NewDesc("node_memory_working_set_bytes", "Current working set of the node in bytes", nil, nil)
	podCPUDesc         = prometheus.NewDesc("pod_cpu_usage_seconds_total", "Cumulative cpu time consumed by the pod in core-seconds", []string{"namespace", "pod"}, nil)
	podMemoryDesc      = prometheus.NewDesc("pod_memory_working_set_bytes", "Current working set of the pod in bytes", []string{"namespace", "pod"}, nil)
	containerCPUDesc   = prometheus.NewDesc("container_cpu_usage_seconds_total", "Cumulative cpu time consumed by the container in core-seconds", []string{"container", "namespace", "pod"}, nil)
	containerMemDesc   = prometheus.NewDesc("container_memory_working_set_bytes", "Current working set of the container in bytes", []string{"container", "namespace", "pod"}, nil)
	containerStartDesc = prometheus.NewDesc("container_start_time_seconds", "Start time of the container since unix epoch in seconds", []string{"container", "namespace", "pod"}, nil)
	scrapeErrorDesc    = prometheus.NewDesc("scrape_error", "1 if there was an error while getting container metrics, 0 otherwise", nil, nil)
)

type resourceCollector struct{ a *kubeletAPI }

func (resourceCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{nodeCPUDesc, nodeMemoryDesc, podCPUDesc, podMemoryDesc, containerCPUDesc, containerMemDesc, containerStartDesc, scrapeErrorDesc} {
		ch <- d
	}
}

func (c resourceCollector) Collect(ch chan<- prometheus.Metric) {
	stamped := func(s usage.Sample, desc *prometheus.Desc, kind prometheus.ValueType, v float64, labels ...string) {
		ch <- prometheus.NewMetricWithTimestamp(s.Time, prometheus.MustNewConstMetric(desc, kind, v, labels...))
	}
	failed := 0.0
	if node, err := usage.Node(); err == nil {
		stamped(node, nodeCPUDesc, prometheus.CounterValue, seconds(node.CPUNanos))
		stamped(node, nodeMemoryDesc, prometheus.GaugeValue, float64(node.WorkingSetBytes))
	} else {
		failed = 1
	}
	containers := c.a.usage()
	var pod usage.Sample
	for i, u := range containers {
		stamped(u.Sample, containerCPUDesc, prometheus.CounterValue, seconds(u.CPUNanos), u.Container, u.Namespace, u.Pod)
		stamped(u.Sample, containerMemDesc, prometheus.GaugeValue, float64(u.WorkingSetBytes), u.Container, u.Namespace, u.Pod)
		ch <- prometheus.MustNewConstMetric(containerStartDesc, prometheus.GaugeValue, float64(u.Started.UnixNano())/1e9, u.Container, u.Namespace, u.Pod)
		pod.Time = u.Time
		pod.CPUNanos += u.CPUNanos
		pod.WorkingSetBytes += u.WorkingSetBytes
		if i == len(containers)-1 || containers[i+1].Namespace != u.Namespace || containers[i+1].Pod != u.Pod {
			stamped(pod, podCPUDesc, prometheus.CounterValue, seconds(pod.CPUNanos), u.Namespace, u.Pod)
			stamped(pod, podMemoryDesc, prometheus.GaugeValue, float64(pod.WorkingSetBytes), u.Namespace, u.Pod)
			pod = usage.Sample{}
		}
	}
	ch <- prometheus.MustNewConstMetric(scrapeErrorDesc, prometheus.GaugeValue, failed)
}

// cadvisor's container metrics, with its labels (id is the cgroup).
var (
	cadvisorLabels   = []string{"container", "id", "namespace", "pod"}
	cadvisorCPUDesc  = prometheus.NewDesc("container_cpu_usage_seconds_total", "Cumulative cpu time consumed in seconds.", cadvisorLabels, nil)
	cadvisorMemDesc  = prometheus.NewDesc("container_memory_usage_bytes", "Current memory usage in bytes, including all memory regardless of when it was accessed", cadvisorLabels, nil)
	cadvisorWSDesc   = prometheus.NewDesc("container_memory_working_set_bytes", "Current working set in bytes.", cadvisorLabels, nil)
	cadvisorRSSDesc  = prometheus.NewDesc("container_memory_rss", "Size of RSS in bytes.", cadvisorLabels, nil)
	cadvisorTimeDesc = prometheus.NewDesc("container_start_time_seconds", "Start time of the container since unix epoch in seconds.", cadvisorLabels, nil)
)

type cadvisorCollector struct{ a *kubeletAPI }

func (cadvisorCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{cadvisorCPUDesc, cadvisorMemDesc, cadvisorWSDesc, cadvisorRSSDesc, cadvisorTimeDesc} {
		ch <- d
	}
}

func (c cadvisorCollector) Collect(ch chan<- prometheus.Metric) {
	for _, u := range c.a.usage() {
		labels := []string{u.Container, "/orch/" + u.ID, u.Namespace, u.Pod}
		for _, m := range []struct {
			desc *prometheus.Desc
			kind prometheus.ValueType
			v    float64
		}{
			{cadvisorCPUDesc, prometheus.CounterValue, seconds(u.CPUNanos)},
			{cadvisorMemDesc, prometheus.GaugeValue, float64(u.MemoryBytes)},
			{cadvisorWSDesc, prometheus.GaugeValue, float64(u.WorkingSetBytes)},
			{cadvisorRSSDesc, prometheus.GaugeValue, float64(u.RSSBytes)},
		} {
			ch <- prometheus.NewMetricWithTimestamp(u.Time, prometheus.MustNewConstMetric(m.desc, m.kind, m.v, labels...))
		}
		ch <- prometheus.MustNewConstMetric(cadvisorTimeDesc, prometheus.GaugeValue, float64(u.Started.UnixNano())/1e9, labels...)
	}
}

func seconds(nanos uint64) float64 { return float64(nanos) / 1e9 }
