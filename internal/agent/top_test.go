package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent/agenttest"
	"github.com/orch-dev/orch/internal/api"
	"github.com/orch-dev/orch/internal/api/apitest"
	"github.com/orch-dev/orch/internal/loops"
	"github.com/orch-dev/orch/internal/loops/hollow"
	"github.com/orch-dev/orch/internal/loops/loopstest"
	"github.com/orch-dev/orch/internal/metrics/metricstest"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

// topColumns parses `kubectl top` output into name -> columns.
func topColumns(out string) map[string][]string {
	rows := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 1 {
			rows[f[0]] = f[1:]
		}
	}
	return rows
}

func quantity(t *testing.T, s string) *resource.Quantity {
	t.Helper()
	q, err := resource.ParseQuantity(s)
	if err != nil {
		t.Fatalf("kubectl top printed %q: %v", s, err)
	}
	return &q
}

// TestKubectlTop: stock kubectl top reads the CPU and memory of a real
// node and its pods, measured from their cgroups: a busy loop uses CPU, a
// sleeper none; a shell holding 16 MiB shows it; --containers and label
// selectors work; the kubelet's metrics endpoints answer through
// nodes/proxy in Prometheus' format (as Prometheus scrapes them), the
// Summary API has CPU and memory; the server's /metrics has the loops'
// work queues and the scheduler's attempts. A service account that may
// view its namespace sees its pods' metrics, not the nodes'.
func TestKubectlTop(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kubectl")
	}
	dir := agenttest.NodeDataDir(t)
	c := loopstest.StartWithServer(t, func(cfg *api.Config) { cfg.MetricsResolution = time.Second }, nil, hollow.Options{LeaseEvery: -1}, loops.Options{})
	n := startNodeIn(t, c, dir, "top-node")
	k := apitest.NewKubectl(t, n.Server.Kubeconfig)

	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "burner", Labels: map[string]string{"app": "burn"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{agenttest.Busybox("spin", "while true; do :; done")}}})
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sleeper"}, Spec: corev1.PodSpec{Containers: []corev1.Container{
		agenttest.Busybox("idle", "sleep 3600"),
		agenttest.Busybox("hog", "x=$(yes aaaaaaaaaaaaaaa | head -c 16777216); echo holding ${#x}; sleep 3600; echo $x"),
	}}})
	n.waitOutput(t, "sleeper", "hog", "holding 1677721")
	n.waitRunning(t, "burner")
	var pods map[string][]string
	n.Eventually("kubectl top pod showing both pods", time.Minute, func(ctx context.Context) (bool, error) {
		out, err := k.Try("top", "pod")
		pods = topColumns(out)
		return err == nil && len(pods["burner"]) == 2 && len(pods["sleeper"]) == 2, nil
	})
	// The sleeper settles once its string is made (the window may still
	// hold the making of it).
	n.Eventually("kubectl top pod showing the sleeper idle, holding 16Mi", 30*time.Second, func(ctx context.Context) (bool, error) {
		out, err := k.Try("top", "pod", "sleeper")
		row := topColumns(out)["sleeper"]
		return err == nil && len(row) == 2 && quantity(t, row[0]).MilliValue() <= 50 && quantity(t, row[1]).Value() >= 16<<20, nil
	})
	// A busy loop gets most of a core on this two-core machine; give the
	// shared machine room.
	if cpu := quantity(t, pods["burner"][0]); cpu.MilliValue() < 200 {
		t.Errorf("burner uses %s of CPU, want ≥ 200m", pods["burner"][0])
	}
	if out := k.Run("top", "pod", "-l", "app=burn"); !strings.Contains(out, "burner") || strings.Contains(out, "sleeper") {
		t.Errorf("kubectl top pod -l app=burn:\n%s", out)
	}
	if out := k.Run("top", "pod", "sleeper", "--containers"); !strings.Contains(out, "hog") || !strings.Contains(out, "idle") {
		t.Errorf("kubectl top pod sleeper --containers:\n%s", out)
	}
	nodes := topColumns(k.Run("top", "node"))
	if row := nodes["top-node"]; len(row) != 4 || quantity(t, row[0]).MilliValue() < 200 || !strings.HasSuffix(row[1], "%") || quantity(t, row[2]).Value() < 16<<20 {
		t.Errorf("kubectl top node: %v", nodes)
	}

	// The kubelet's endpoints, through the API server.
	raw := func(path string) []byte {
		t.Helper()
		data, err := n.Client.CoreV1().RESTClient().Get().AbsPath(path).DoRaw(n.Ctx)
		if err != nil {
			t.Fatalf("GET %s: %v %s", path, err, data)
		}
		return data
	}
	parse := func(path string) metricstest.Families {
		t.Helper()
		families, err := metricstest.Parse(bytes.NewReader(raw(path)))
		if err != nil {
			t.Fatalf("parse %s: %v", path, err)
		}
		return families
	}
	has := func(families metricstest.Families, name string, labels map[string]string) float64 {
		t.Helper()
		v, ok := families.Sum(name, labels)
		if !ok {
			t.Errorf("no %s%v", name, labels)
		}
		return v
	}
	res := parse("/api/v1/nodes/top-node/proxy/metrics/resource")
	if v := has(res, "container_cpu_usage_seconds_total", map[string]string{"pod": "burner", "container": "spin", "namespace": "default"}); v <= 0 {
		t.Errorf("burner's CPU seconds: %v", v)
	}
	has(res, "pod_memory_working_set_bytes", map[string]string{"pod": "sleeper"})
	has(res, "node_cpu_usage_seconds_total", nil)
	cadvisor := parse("/api/v1/nodes/top-node/proxy/metrics/cadvisor")
	if v := has(cadvisor, "container_memory_working_set_bytes", map[string]string{"pod": "sleeper", "container": "hog"}); v < 16<<20 {
		t.Errorf("hog's working set in /metrics/cadvisor: %v, want ≥ 16 MiB", v)
	}
	own := parse("/api/v1/nodes/top-node/proxy/metrics")
	if v := has(own, "kubelet_running_pods", nil); v != 2 {
		t.Errorf("kubelet_running_pods = %v, want 2", v)
	}
	has(own, "go_goroutines", nil)
	var summary statsapi.Summary
	if err := json.Unmarshal(raw("/api/v1/nodes/top-node/proxy/stats/summary"), &summary); err != nil {
		t.Fatal(err)
	}
	if summary.Node.CPU == nil || summary.Node.CPU.UsageCoreNanoSeconds == nil || summary.Node.Memory == nil || summary.Node.Memory.WorkingSetBytes == nil {
		t.Errorf("the Summary API's node lacks CPU or memory: %+v", summary.Node)
	}
	for _, p := range summary.Pods {
		if p.PodRef.Name == "burner" && (p.CPU == nil || p.CPU.UsageCoreNanoSeconds == nil || *p.CPU.UsageCoreNanoSeconds == 0 || len(p.Containers) != 1 || p.Containers[0].Memory == nil) {
			t.Errorf("the Summary API's burner: %+v", p)
		}
	}

	// The server's own metrics: the loops' queues and the scheduler.
	server := parse("/metrics")
	if v := has(server, "scheduler_schedule_attempts_total", map[string]string{"result": "scheduled", "profile": "default-scheduler"}); v < 2 {
		t.Errorf("scheduled attempts: %v, want ≥ 2", v)
	}
	if v := has(server, "workqueue_adds_total", map[string]string{"name": "scheduler"}); v < 2 {
		t.Errorf("the scheduler's queue adds: %v, want ≥ 2", v)
	}
	has(server, "workqueue_depth", map[string]string{"name": "replicaset"})

	// Who may see what: a namespace viewer, its pods' metrics only.
	if _, err := n.Client.CoreV1().ServiceAccounts("default").Create(n.Ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "viewer"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Client.RbacV1().RoleBindings("default").Create(n.Ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "viewer"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "viewer", Namespace: "default"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	as := "--as=system:serviceaccount:default:viewer"
	n.Eventually("the viewer's kubectl top pod", 30*time.Second, func(context.Context) (bool, error) {
		out, err := k.Try("top", "pod", as)
		return err == nil && strings.Contains(out, "burner"), nil
	})
	if out, err := k.Try("top", "node", as); err == nil || !strings.Contains(out, "forbidden") {
		t.Errorf("a namespace viewer's kubectl top node: %v\n%s", err, out)
	}
	if out, err := k.Try("get", "--raw", "/api/v1/nodes/top-node/proxy/metrics/cadvisor", as); err == nil || !strings.Contains(out, "forbidden") {
		t.Errorf("a namespace viewer scraping the node: %v\n%s", err, out)
	}
}
