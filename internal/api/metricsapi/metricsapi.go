// Package metricsapi serves metrics.k8s.io as metrics-server does, inside
// the API server and with no pod of its own: every resolution (15 s) it
// scrapes each ready node's /metrics/resource (the kubelet's resource
// metrics, which orch's agent serves from cgroups), keeps the last two
// readings, and answers NodeMetrics and PodMetrics with the CPU rate
// between them and the latest memory working set. `kubectl top` and
// autoscalers read them.
package metricsapi

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/orch-dev/orch/internal/api/kubelet"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"
)

// DefaultResolution is how often nodes are scraped: metrics-server's
// default, which kubectl top and the autoscaler are tuned for.
const DefaultResolution = 15 * time.Second

// maxScrapeBytes bounds one node's answer: 30 pods' metrics are ~10 KB.
const maxScrapeBytes = 4 << 20

// Kubelets reads a path of a node's kubelet API.
type Kubelets interface {
	Get(ctx context.Context, node *corev1.Node, path string, limit int64) ([]byte, error)
}

// Objects reads the nodes or the pods the metrics are of, for their
// labels and to select them.
type Objects interface {
	Get(ctx context.Context, namespace, name string) (runtime.Object, error)
	List(ctx context.Context, namespace string, opts *metav1.ListOptions) (runtime.Object, error)
}

// Source keeps the nodes' latest metrics.
type Source struct {
	nodes, pods Objects
	kubelets    Kubelets
	resolution  time.Duration
	log         *slog.Logger

	mu     sync.RWMutex
	byNode map[string]*reading
}

// reading is what one node's last two scrapes gave.
type reading struct {
	node point
	// containers are by pod ("namespace/name"), then container name.
	containers map[string]map[string]point
}

// point is a cumulative CPU counter and a memory figure at a time, with
// the CPU rate over window, the time since the point before it (zero for
// a first reading, which has no rate).
type point struct {
	at        time.Time
	cpuNanos  float64 // cumulative core-nanoseconds
	memory    uint64
	rate      uint64 // nanocores since prev
	window    time.Duration
	startedAt float64 // container start, unix seconds: a restart resets the counter
}

// rated reports whether the point has a CPU rate.
func (p point) rated() bool { return p.window > 0 }

// New reads nodes and pods from their objects and their figures through
// kubelets; resolution 0 is DefaultResolution.
func New(nodes, pods Objects, kubelets Kubelets, resolution time.Duration, log *slog.Logger) *Source {
	if resolution <= 0 {
		resolution = DefaultResolution
	}
	return &Source{nodes: nodes, pods: pods, kubelets: kubelets, resolution: resolution, log: log, byNode: map[string]*reading{}}
}

// Run scrapes every resolution until ctx ends.
func (s *Source) Run(ctx context.Context) {
	t := time.NewTicker(s.resolution)
	defer t.Stop()
	for {
		s.scrapeAll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// scrapeAll reads every ready node at once (a few at a time), and forgets
// the nodes that are gone or not ready.
func (s *Source) scrapeAll(ctx context.Context) {
	obj, err := s.nodes.List(ctx, "", &metav1.ListOptions{})
	if err != nil {
		s.log.Warn("metrics: listing nodes", "err", err)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, min(s.resolution, 10*time.Second))
	defer cancel()
	var wg sync.WaitGroup
	seats := make(chan struct{}, 8)
	ready := map[string]bool{}
	for i := range obj.(*corev1.NodeList).Items {
		node := &obj.(*corev1.NodeList).Items[i]
		if !kubelet.NodeReady(node) {
			continue
		}
		ready[node.Name] = true
		wg.Add(1)
		seats <- struct{}{}
		go func() {
			defer func() { <-seats; wg.Done() }()
			data, err := s.kubelets.Get(ctx, node, "/metrics/resource", maxScrapeBytes)
			if err == nil {
				err = s.record(node.Name, data, time.Now())
			}
			if err != nil {
				s.log.Debug("metrics: scraping a node", "node", node.Name, "err", err)
			}
		}()
	}
	wg.Wait()
	s.mu.Lock()
	for name := range s.byNode {
		if !ready[name] {
			delete(s.byNode, name)
		}
	}
	s.mu.Unlock()
}

// record parses a node's resource metrics, read at now, and rates them
// against the node's previous reading.
func (s *Source) record(node string, data []byte, now time.Time) error {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("parse resource metrics: %w", err)
	}
	at := func(m *dto.Metric) time.Time {
		if m.TimestampMs != nil {
			return time.UnixMilli(m.GetTimestampMs())
		}
		return now
	}
	label := func(m *dto.Metric, name string) string {
		for _, l := range m.GetLabel() {
			if l.GetName() == name {
				return l.GetValue()
			}
		}
		return ""
	}
	value := func(m *dto.Metric) float64 {
		if c := m.GetCounter(); c != nil {
			return c.GetValue()
		}
		if g := m.GetGauge(); g != nil {
			return g.GetValue()
		}
		return m.GetUntyped().GetValue()
	}
	next := &reading{containers: map[string]map[string]point{}}
	if f := families["node_cpu_usage_seconds_total"]; f != nil && len(f.Metric) > 0 {
		next.node.at, next.node.cpuNanos = at(f.Metric[0]), value(f.Metric[0])*1e9
	}
	if f := families["node_memory_working_set_bytes"]; f != nil && len(f.Metric) > 0 {
		next.node.memory = uint64(value(f.Metric[0]))
	}
	container := func(m *dto.Metric) (map[string]point, string) {
		pod := label(m, "namespace") + "/" + label(m, "pod")
		if next.containers[pod] == nil {
			next.containers[pod] = map[string]point{}
		}
		return next.containers[pod], label(m, "container")
	}
	for _, m := range families["container_cpu_usage_seconds_total"].GetMetric() {
		byName, name := container(m)
		p := byName[name]
		p.at, p.cpuNanos = at(m), value(m)*1e9
		byName[name] = p
	}
	for _, m := range families["container_memory_working_set_bytes"].GetMetric() {
		byName, name := container(m)
		p := byName[name]
		p.memory = uint64(value(m))
		byName[name] = p
	}
	for _, m := range families["container_start_time_seconds"].GetMetric() {
		byName, name := container(m)
		p := byName[name]
		p.startedAt = value(m)
		byName[name] = p
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	prev := s.byNode[node]
	if prev != nil {
		next.node.rateFrom(prev.node)
		for pod, byName := range next.containers {
			for name, p := range byName {
				if old, ok := prev.containers[pod][name]; ok && old.startedAt == p.startedAt {
					p.rateFrom(old)
					byName[name] = p
				}
			}
		}
	}
	s.byNode[node] = next
	return nil
}

// rateFrom sets p's CPU rate since old, if the counter moved forward.
func (p *point) rateFrom(old point) {
	window := p.at.Sub(old.at)
	if window <= 0 || p.cpuNanos < old.cpuNanos {
		return
	}
	p.rate, p.window = uint64((p.cpuNanos-old.cpuNanos)/window.Seconds()), window
}

// Nodes serves metrics.k8s.io's nodes.
func (s *Source) Nodes() *Nodes { return &Nodes{s} }

// Pods serves metrics.k8s.io's pods.
func (s *Source) Pods() *Pods { return &Pods{s} }

// Nodes is the NodeMetrics view of a Source.
type Nodes struct{ s *Source }

// Get is one node's metrics; NotFound until it has two readings.
func (n *Nodes) Get(ctx context.Context, _ string, name string) (runtime.Object, error) {
	obj, err := n.s.nodes.Get(ctx, "", name)
	if err != nil {
		return nil, err
	}
	m, ok := n.s.nodeMetrics(obj.(*corev1.Node))
	if !ok {
		return nil, apierrors.NewNotFound(metricsv1beta1.Resource("nodes"), name)
	}
	return m, nil
}

// List is the metrics of the nodes opts selects, those that have them.
func (n *Nodes) List(ctx context.Context, _ string, opts *metav1.ListOptions) (runtime.Object, error) {
	obj, err := n.s.nodes.List(ctx, "", &metav1.ListOptions{LabelSelector: opts.LabelSelector, FieldSelector: opts.FieldSelector})
	if err != nil {
		return nil, err
	}
	out := &metricsv1beta1.NodeMetricsList{}
	for i := range obj.(*corev1.NodeList).Items {
		if m, ok := n.s.nodeMetrics(&obj.(*corev1.NodeList).Items[i]); ok {
			out.Items = append(out.Items, *m)
		}
	}
	return out, nil
}

func (s *Source) nodeMetrics(node *corev1.Node) (*metricsv1beta1.NodeMetrics, bool) {
	s.mu.RLock()
	r := s.byNode[node.Name]
	s.mu.RUnlock()
	if r == nil || !r.node.rated() {
		return nil, false
	}
	return &metricsv1beta1.NodeMetrics{
		ObjectMeta: metav1.ObjectMeta{Name: node.Name, Labels: node.Labels, CreationTimestamp: metav1.Now()},
		Timestamp:  metav1.NewTime(r.node.at), Window: metav1.Duration{Duration: r.node.window},
		Usage: usage(r.node),
	}, true
}

// Pods is the PodMetrics view of a Source.
type Pods struct{ s *Source }

// Get is one pod's metrics; NotFound until its containers have two
// readings.
func (p *Pods) Get(ctx context.Context, namespace, name string) (runtime.Object, error) {
	obj, err := p.s.pods.Get(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	m, ok := p.s.podMetrics(obj.(*corev1.Pod))
	if !ok {
		return nil, apierrors.NewNotFound(metricsv1beta1.Resource("pods"), name)
	}
	return m, nil
}

// List is the metrics of the pods in namespace (all with "") that opts
// selects, those that have them.
func (p *Pods) List(ctx context.Context, namespace string, opts *metav1.ListOptions) (runtime.Object, error) {
	// The pods' own field selectors (spec.nodeName...) do not apply to
	// their metrics: metrics-server takes metadata.name and
	// metadata.namespace only.
	fieldSel, err := fields.ParseSelector(opts.FieldSelector)
	if err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	obj, err := p.s.pods.List(ctx, namespace, &metav1.ListOptions{LabelSelector: opts.LabelSelector})
	if err != nil {
		return nil, err
	}
	out := &metricsv1beta1.PodMetricsList{}
	for i := range obj.(*corev1.PodList).Items {
		pod := &obj.(*corev1.PodList).Items[i]
		if !fieldSel.Matches(fields.Set{"metadata.name": pod.Name, "metadata.namespace": pod.Namespace}) {
			continue
		}
		if m, ok := p.s.podMetrics(pod); ok {
			out.Items = append(out.Items, *m)
		}
	}
	return out, nil
}

func (s *Source) podMetrics(pod *corev1.Pod) (*metricsv1beta1.PodMetrics, bool) {
	if pod.Spec.NodeName == "" {
		return nil, false
	}
	s.mu.RLock()
	var byName map[string]point
	if r := s.byNode[pod.Spec.NodeName]; r != nil {
		byName = r.containers[pod.Namespace+"/"+pod.Name]
	}
	s.mu.RUnlock()
	out := &metricsv1beta1.PodMetrics{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, Labels: pod.Labels, CreationTimestamp: metav1.Now()}}
	for name, c := range byName {
		if !c.rated() {
			continue
		}
		out.Containers = append(out.Containers, metricsv1beta1.ContainerMetrics{Name: name, Usage: usage(c)})
		if c.at.After(out.Timestamp.Time) {
			out.Timestamp, out.Window = metav1.NewTime(c.at), metav1.Duration{Duration: c.window}
		}
	}
	if len(out.Containers) == 0 {
		return nil, false
	}
	sort.Slice(out.Containers, func(i, j int) bool { return out.Containers[i].Name < out.Containers[j].Name })
	return out, true
}

// usage is CPU in nanocores and memory in bytes, in the units
// metrics-server gives them.
func usage(p point) corev1.ResourceList {
	return corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewScaledQuantity(int64(p.rate), resource.Nano),
		corev1.ResourceMemory: *resource.NewQuantity(int64(p.memory), resource.BinarySI),
	}
}
