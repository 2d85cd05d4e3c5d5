package metricsapi

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"
)

// objects is a fake of the API server's node or pod storage.
type objects struct{ items []runtime.Object }

func (o *objects) Get(_ context.Context, namespace, name string) (runtime.Object, error) {
	for _, it := range o.items {
		m := it.(metav1.Object)
		if m.GetNamespace() == namespace && m.GetName() == name {
			return it, nil
		}
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "things"}, name)
}

func (o *objects) List(_ context.Context, namespace string, opts *metav1.ListOptions) (runtime.Object, error) {
	sel, err := labels.Parse(opts.LabelSelector)
	if err != nil {
		return nil, err
	}
	var nodes corev1.NodeList
	var pods corev1.PodList
	for _, it := range o.items {
		m := it.(metav1.Object)
		if namespace != "" && m.GetNamespace() != namespace || !sel.Matches(labels.Set(m.GetLabels())) {
			continue
		}
		switch v := it.(type) {
		case *corev1.Node:
			nodes.Items = append(nodes.Items, *v)
		case *corev1.Pod:
			pods.Items = append(pods.Items, *v)
		}
	}
	if len(o.items) > 0 {
		if _, ok := o.items[0].(*corev1.Pod); ok {
			return &pods, nil
		}
	}
	return &nodes, nil
}

// kubelets answers each node's /metrics/resource with what the test set.
type kubelets struct {
	mu      sync.Mutex
	answers map[string]string
	asked   []string
}

func (k *kubelets) Get(_ context.Context, node *corev1.Node, path string, _ int64) ([]byte, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.asked = append(k.asked, node.Name+path)
	a, ok := k.answers[node.Name]
	if !ok {
		return nil, fmt.Errorf("node %s unreachable", node.Name)
	}
	return []byte(a), nil
}

func node(name string, ready corev1.ConditionStatus, labels map[string]string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready}}}}
}

func pod(ns, name, node string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}, Spec: corev1.PodSpec{NodeName: node}}
}

// resourceMetrics is a node's /metrics/resource as the kubelet writes it;
// each container is "namespace pod name cpu-seconds memory-bytes
// start-seconds".
func resourceMetrics(at time.Time, nodeCPU float64, containers ...string) string {
	ms := at.UnixMilli()
	var b strings.Builder
	fmt.Fprintf(&b, "# HELP node_cpu_usage_seconds_total x\n# TYPE node_cpu_usage_seconds_total counter\nnode_cpu_usage_seconds_total %g %d\n", nodeCPU, ms)
	fmt.Fprintf(&b, "# HELP node_memory_working_set_bytes x\n# TYPE node_memory_working_set_bytes gauge\nnode_memory_working_set_bytes 1.073741824e+09 %d\n", ms)
	for i, family := range []struct{ name, kind, stamp string }{
		{"container_cpu_usage_seconds_total", "counter", fmt.Sprint(" ", ms)},
		{"container_memory_working_set_bytes", "gauge", fmt.Sprint(" ", ms)},
		{"container_start_time_seconds", "gauge", ""},
	} {
		fmt.Fprintf(&b, "# HELP %s x\n# TYPE %s %s\n", family.name, family.name, family.kind)
		for _, c := range containers {
			f := strings.Fields(c)
			fmt.Fprintf(&b, "%s{container=%q,namespace=%q,pod=%q} %s%s\n", family.name, f[2], f[0], f[1], f[3+i], family.stamp)
		}
	}
	return b.String()
}

// TestNodeAndPodMetrics: as metrics-server, the CPU is the rate between a
// node's last two scrapes and memory the latest working set; nothing is
// served before two scrapes, nor for a container that restarted between
// them; nodes not ready are not scraped and their metrics go; lists
// select by the objects' labels and by name.
func TestNodeAndPodMetrics(t *testing.T) {
	ctx := context.Background()
	nodes := &objects{items: []runtime.Object{
		node("pi-1", corev1.ConditionTrue, map[string]string{"zone": "a"}),
		node("pi-2", corev1.ConditionFalse, nil),
	}}
	pods := &objects{items: []runtime.Object{
		pod("default", "web", "pi-1", map[string]string{"app": "web"}),
		pod("default", "db", "pi-1", map[string]string{"app": "db"}),
		pod("kube-system", "dns", "pi-1", nil),
		pod("default", "pending", "", nil),
	}}
	k := &kubelets{answers: map[string]string{}}
	s := New(nodes, pods, k, time.Second, slog.New(slog.NewTextHandler(io.Discard, nil)))
	t0 := time.Unix(1_700_000_000, 0)
	k.answers["pi-1"] = resourceMetrics(t0, 100,
		"default web nginx 10 1000 1", "default web sidecar 1 2000 1", "default db postgres 50 4000 1", "kube-system dns coredns 5 100 1")
	s.scrapeAll(ctx)
	if len(k.asked) != 1 || k.asked[0] != "pi-1/metrics/resource" {
		t.Errorf("scraped %v, want only the ready node", k.asked)
	}
	if _, err := s.Nodes().Get(ctx, "", "pi-1"); !apierrors.IsNotFound(err) {
		t.Errorf("after one scrape: %v, want NotFound (no rate yet)", err)
	}
	// 15 s later: the node used 3 more core-seconds (200m); web's nginx
	// 1.5 (100m), its sidecar nothing; postgres restarted.
	t1 := t0.Add(15 * time.Second)
	k.answers["pi-1"] = resourceMetrics(t1, 103,
		"default web nginx 11.5 1500 1", "default web sidecar 1 2048 1", "default db postgres 0.1 4000 99", "kube-system dns coredns 5.15 128 1")
	s.scrapeAll(ctx)

	obj, err := s.Nodes().Get(ctx, "", "pi-1")
	if err != nil {
		t.Fatal(err)
	}
	nm := obj.(*metricsv1beta1.NodeMetrics)
	if cpu, mem := nm.Usage.Cpu().MilliValue(), nm.Usage.Memory().Value(); cpu != 200 || mem != 1<<30 || nm.Window.Duration != 15*time.Second ||
		!nm.Timestamp.Time.Equal(t1) || nm.Labels["zone"] != "a" {
		t.Errorf("node metrics: cpu %dm memory %d window %v at %v labels %v", cpu, mem, nm.Window, nm.Timestamp, nm.Labels)
	}
	if _, err := s.Nodes().Get(ctx, "", "pi-2"); !apierrors.IsNotFound(err) {
		t.Errorf("a node not ready: %v, want NotFound", err)
	}

	obj, err = s.Pods().Get(ctx, "default", "web")
	if err != nil {
		t.Fatal(err)
	}
	pm := obj.(*metricsv1beta1.PodMetrics)
	if len(pm.Containers) != 2 || pm.Containers[0].Name != "nginx" || pm.Containers[1].Name != "sidecar" {
		t.Fatalf("web's containers: %+v", pm.Containers)
	}
	if cpu, mem := pm.Containers[0].Usage.Cpu().MilliValue(), pm.Containers[0].Usage.Memory().Value(); cpu != 100 || mem != 1500 {
		t.Errorf("nginx: %dm %d bytes", cpu, mem)
	}
	if cpu := pm.Containers[1].Usage.Cpu().MilliValue(); cpu != 0 || pm.Labels["app"] != "web" || pm.Window.Duration != 15*time.Second {
		t.Errorf("sidecar: %dm, labels %v, window %v", cpu, pm.Labels, pm.Window)
	}
	for _, name := range []string{"db", "pending", "missing"} {
		if _, err := s.Pods().Get(ctx, "default", name); !apierrors.IsNotFound(err) {
			t.Errorf("pod %s (restarted, unscheduled, absent): %v, want NotFound", name, err)
		}
	}

	names := func(obj runtime.Object) (out []string) {
		for _, m := range obj.(*metricsv1beta1.PodMetricsList).Items {
			out = append(out, m.Namespace+"/"+m.Name)
		}
		return out
	}
	for _, tc := range []struct {
		namespace string
		opts      metav1.ListOptions
		want      string
	}{
		{"", metav1.ListOptions{}, "default/web kube-system/dns"},
		{"default", metav1.ListOptions{}, "default/web"},
		{"", metav1.ListOptions{LabelSelector: "app=web"}, "default/web"},
		{"", metav1.ListOptions{LabelSelector: "app!=web"}, "kube-system/dns"},
		{"", metav1.ListOptions{FieldSelector: "metadata.name=dns"}, "kube-system/dns"},
		{"", metav1.ListOptions{FieldSelector: "metadata.namespace=default"}, "default/web"},
	} {
		obj, err := s.Pods().List(ctx, tc.namespace, &tc.opts)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(names(obj), " "); got != tc.want {
			t.Errorf("pods in %q with %+v: %q, want %q", tc.namespace, tc.opts, got, tc.want)
		}
	}
	if _, err := s.Pods().List(ctx, "", &metav1.ListOptions{FieldSelector: "metadata.name"}); !apierrors.IsBadRequest(err) {
		t.Errorf("a field selector that does not parse: %v, want BadRequest", err)
	}

	// A node answering garbage keeps its last good reading; a node that
	// goes not ready loses it.
	k.answers["pi-1"] = "garbage {{{"
	s.scrapeAll(ctx)
	if _, err := s.Nodes().Get(ctx, "", "pi-1"); err != nil {
		t.Errorf("after a bad scrape: %v, want the last good reading", err)
	}
	nodes.items[0] = node("pi-1", corev1.ConditionUnknown, nil)
	s.scrapeAll(ctx)
	if list, err := s.Nodes().List(ctx, "", &metav1.ListOptions{}); err != nil || len(list.(*metricsv1beta1.NodeMetricsList).Items) != 0 {
		t.Errorf("after the node went not ready: %v, %v; want none", list, err)
	}
}
