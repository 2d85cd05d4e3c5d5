package ingress

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/gatewayapi"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// BenchmarkProxy: requests through the proxy against the same requests
// straight to the backend, in one run, with connections kept alive and
// with a new connection each; ns/op is a request's latency, p99-µs the
// 99th percentile. The target: at least 80 % of direct's rate,
// under 1 ms more at p99.
func BenchmarkProxy(b *testing.B) {
	body := make([]byte, 1024)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(body) }))
	defer backend.Close()
	f := &fakeCluster{ingresses: []*networkingv1.Ingress{ing("site", 0, rule("web.example", path("/", prefix, "web")))}}
	f.service("web", false, addr(backend))
	p, err := newProxy(Config{Secret: f.secret, Logger: discardLogger()})
	if err != nil {
		b.Fatal(err)
	}
	p.list = f.list
	p.rebuild(b.Context())
	front := httptest.NewServer(p)
	defer front.Close()
	// The same backend behind a Gateway's HTTPRoute, on a port of its own.
	gwPort := gatewayFront(b, p)
	f.gateways = gatewayapi.Config{Gateways: []gatewayapi.ConfigGateway{{Name: "infra/main", Addresses: []string{"127.0.0.1"},
		Listeners: []gatewayapi.ConfigListener{{Name: "http", Port: gwPort, Protocol: "HTTP", Routes: []gatewayapi.ConfigRoute{{Name: "apps/web",
			Hostnames: []string{"web.example"}, Rules: []gatewayapi.ConfigRule{{Matches: []gatewayv1.HTTPRouteMatch{pathMatch(gatewayv1.PathMatchPathPrefix, "/")},
				Backends: []gatewayapi.ConfigBackend{to("web", 1)}}}}}}}}}}
	p.rebuild(b.Context())
	gwURL := "http://127.0.0.1:" + strconv.Itoa(int(gwPort))
	for _, keepAlive := range []bool{true, false} {
		for _, via := range []struct{ name, url string }{{"direct", backend.URL}, {"proxied", front.URL}, {"gateway", gwURL}} {
			b.Run(fmt.Sprintf("keepalive=%v/%s", keepAlive, via.name), func(b *testing.B) {
				client := &http.Client{Transport: &http.Transport{DisableKeepAlives: !keepAlive, MaxIdleConnsPerHost: 8}}
				lat := make([]time.Duration, 0, b.N)
				b.ResetTimer()
				for b.Loop() {
					start := time.Now()
					req, _ := http.NewRequest(http.MethodGet, via.url+"/", nil)
					req.Host = "web.example"
					resp, err := client.Do(req)
					if err != nil {
						b.Fatal(err)
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
					if resp.StatusCode != 200 {
						b.Fatalf("status %d", resp.StatusCode)
					}
					lat = append(lat, time.Since(start))
				}
				var total time.Duration
				for _, l := range lat {
					total += l
				}
				slices.Sort(lat)
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
				b.ReportMetric(float64(len(lat))/total.Seconds(), "req/s")
			})
		}
	}
}

// BenchmarkTableBuild: the route table of 1,000 Ingresses (a host, two
// paths and a Service of three endpoints each) rebuilt after a change,
// and the memory it holds (table-bytes; the target for the
// node's proxy is under 10 MB).
func BenchmarkTableBuild(b *testing.B) {
	const n = 1000
	svcs, slices := map[string]*corev1.Service{}, map[string][]*discoveryv1.EndpointSlice{}
	var ingresses []*networkingv1.Ingress
	for i := range n {
		name := fmt.Sprintf("app-%d", i)
		svcs[name] = &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
		slice := &discoveryv1.EndpointSlice{Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}}}
		for j := range 3 {
			slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.42.%d.%d", i%250, j+1)}})
		}
		slices[name] = []*discoveryv1.EndpointSlice{slice}
		ingresses = append(ingresses, ing(name, i, rule(name+".example", path("/", prefix, name), path("/api", exact, name))))
	}
	c := cluster{ingresses: ingresses, classes: []*networkingv1.IngressClass{orchClass()},
		service: func(_, n string) *corev1.Service { return svcs[n] }, slices: func(_, n string) []*discoveryv1.EndpointSlice { return slices[n] }}
	for b.Loop() {
		_, _ = build(c)
	}
	b.StopTimer()
	// A second table's growth of the live heap, the objects and a first
	// table held (what the benchmark's earlier runs left freed first).
	var before, after runtime.MemStats
	first, _ := build(c)
	runtime.GC()
	runtime.GC() // what sync.Pools held goes at the second
	runtime.ReadMemStats(&before)
	t, _ := build(c)
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&after)
	if _, be := t.route("app-7.example", "/"); be == nil || len(be.endpoints) != 3 {
		b.Fatal("the table routes nowhere")
	}
	b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)), "table-bytes")
	runtime.KeepAlive(first)
	runtime.KeepAlive(c) // the objects, not the table's
	runtime.KeepAlive(t)
}
