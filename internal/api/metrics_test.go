package api_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"strings"
	"testing"

	"github.com/orch-dev/orch/internal/api/apitest"
	"github.com/orch-dev/orch/internal/api/pki"
	"github.com/orch-dev/orch/internal/metrics/metricstest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// scrape reads the server's /metrics as id, parsed by Prometheus' own
// text parser.
func (id identity) scrape() (int, metricstest.Families) {
	id.t.Helper()
	code, body := id.raw("/metrics")
	if code != http.StatusOK {
		return code, nil
	}
	families, err := metricstest.Parse(strings.NewReader(body))
	if err != nil {
		id.t.Fatalf("parse /metrics: %v", err)
	}
	return code, families
}

// TestMetricsEndpoint: /metrics serves kube-apiserver's request metrics
// (by verb, group, version, resource, scope and code), the store's and
// the watch caches' figures, and the Go runtime's, in Prometheus' text
// format. As in Kubernetes it is not anonymous: system:monitoring's group
// and the masters may read it, other users are refused; and no client
// can add series by asking for resources that are not served.
func TestMetricsEndpoint(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	admin := ts.as(t, "admin", "system:masters")
	if _, err := ts.client.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "a"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.client.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	_, _ = ts.client.CoreV1().ConfigMaps("default").Get(ctx, "missing", metav1.GetOptions{})
	for _, path := range []string{"/api/v1/namespaces/default/madeup-thing-1", "/apis/madeup.example/v9/things", "/api/v1/nodes/x/madeup-sub"} {
		admin.do("GET", path, "", "")
	}
	admin.do("PATCH", "/api/v1/namespaces/default/configmaps/a?fieldManager=test", "application/apply-patch+yaml", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"},"data":{"k":"v"}}`)

	code, families := admin.scrape()
	if code != http.StatusOK {
		t.Fatalf("/metrics as a master: %d", code)
	}
	for _, tc := range []struct {
		name   string
		labels map[string]string
	}{
		{"apiserver_request_total", map[string]string{"verb": "POST", "group": "", "version": "v1", "resource": "configmaps", "scope": "namespace", "code": "201", "component": "apiserver"}},
		{"apiserver_request_total", map[string]string{"verb": "LIST", "resource": "configmaps", "scope": "namespace", "code": "200"}},
		{"apiserver_request_total", map[string]string{"verb": "GET", "resource": "configmaps", "scope": "resource", "code": "404"}},
		{"apiserver_request_total", map[string]string{"verb": "APPLY", "resource": "configmaps", "scope": "resource", "code": "200"}},
		{"apiserver_request_duration_seconds", map[string]string{"verb": "POST", "resource": "configmaps"}},
		{"apiserver_storage_objects", map[string]string{"resource": "configmaps"}},
		{"apiserver_storage_size_bytes", nil},
		{"orch_store_commits_total", nil},
		{"go_goroutines", nil},
		{"process_resident_memory_bytes", nil},
	} {
		if v, ok := families.Sum(tc.name, tc.labels); !ok || v <= 0 {
			t.Errorf("%s%v: %v, %v; want a positive value", tc.name, tc.labels, v, ok)
		}
	}
	// Requests for what is not served are counted without their made-up
	// names, which appear nowhere.
	if v, ok := families.Sum("apiserver_request_total", map[string]string{"verb": "LIST", "resource": "", "code": "404"}); !ok || v != 2 {
		t.Errorf("lists of resources not served: %v, %v; want 2 under resource=\"\"", v, ok)
	}
	if v, ok := families.Sum("apiserver_request_total", map[string]string{"verb": "GET", "resource": "nodes", "subresource": "", "code": "404"}); !ok || v != 1 {
		t.Errorf("a subresource not served: %v, %v; want 1 under subresource=\"\"", v, ok)
	}
	code, text := admin.do("GET", "/metrics", "", "")
	if code != http.StatusOK || strings.Contains(text, "madeup") {
		t.Errorf("/metrics names what clients made up (%d)", code)
	}

	// Who may read it.
	anonymous := identity{t: t, ts: ts, client: &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: caPool(t, ts), MinVersion: tls.VersionTLS12}}}}
	for _, tc := range []struct {
		who  identity
		name string
		want int
	}{
		{ts.as(t, "prometheus", "system:monitoring"), "the system:monitoring group", http.StatusOK},
		{ts.as(t, "alice", "developers"), "an authenticated user", http.StatusForbidden},
		// orch, as k3s (--anonymous-auth=false), takes no anonymous
		// requests on its authenticated paths.
		{anonymous, "an anonymous client", http.StatusUnauthorized},
	} {
		if code, _ := tc.who.scrape(); code != tc.want {
			t.Errorf("/metrics as %s: %d, want %d", tc.name, code, tc.want)
		}
	}
}

func caPool(t *testing.T, ts *testServer) *x509.CertPool {
	t.Helper()
	ca, err := pki.LoadOrCreateCA(ts.dir + "/server/tls")
	if err != nil {
		t.Fatal(err)
	}
	return ca.Pool()
}

// TestMetricsAPIDiscovery: metrics.k8s.io/v1beta1 is served as
// metrics-server serves it (nodes and pods, get and list only), so
// kubectl top finds it; with no node reporting yet kubectl says what it
// says on Kubernetes; writes are refused.
func TestMetricsAPIDiscovery(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kubectl")
	}
	ts := startServer(t, "")
	k := apitest.NewKubectl(t, ts.kubeconfig)
	out := k.Run("api-resources", "--api-group=metrics.k8s.io", "-o", "wide")
	for _, want := range []string{"nodes", "NodeMetrics", "pods", "PodMetrics", "get,list"} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl api-resources --api-group=metrics.k8s.io lacks %q:\n%s", want, out)
		}
	}
	if out, err := k.Try("top", "node"); err == nil || !strings.Contains(out, "metrics not available yet") {
		t.Errorf("kubectl top node with no node reporting: %v\n%s", err, out)
	}
	if out, err := k.Try("top", "pod", "-A"); err == nil && !strings.Contains(out, "No resources found") {
		t.Errorf("kubectl top pod with no pods: %v\n%s", err, out)
	}
	admin := ts.as(t, "admin", "system:masters")
	if code, msg := admin.do("POST", "/apis/metrics.k8s.io/v1beta1/nodes", jsonType, `{"apiVersion":"metrics.k8s.io/v1beta1","kind":"NodeMetrics","metadata":{"name":"x"}}`); code != http.StatusMethodNotAllowed {
		t.Errorf("creating NodeMetrics: %d %s, want 405", code, msg)
	}
	if code, msg := admin.do("GET", "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods?watch=true", "", ""); code != http.StatusMethodNotAllowed {
		t.Errorf("watching PodMetrics: %d %s, want 405", code, msg)
	}
}
