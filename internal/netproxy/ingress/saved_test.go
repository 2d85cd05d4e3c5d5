package ingress

import (
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
)

// TestKeptRoutes: the routes kept on disk route as the table they were
// kept from (hosts, wildcards, any host, paths, the default backend,
// each backend's endpoints); they are written again only when they
// change; and an agent that cannot reach the server serves them.
func TestKeptRoutes(t *testing.T) {
	web := echo(t, "web")
	site := ing("site", 1, rule("web.example", path("/", prefix, "web"), path("/api", exact, "api")), rule("*.apps.example", path("/", prefix, "web")),
		rule("", path("/any", prefix, "web")))
	site.Spec.DefaultBackend = &networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: "api", Port: networkingv1.ServiceBackendPort{Number: 80}}}
	f := &fakeCluster{ingresses: []*networkingv1.Ingress{site}}
	f.service("web", false, addr(web))
	f.service("api", true)
	p := testProxy(t, f)
	orig := p.table.Load()
	path := filepath.Join(t.TempDir(), "ingress.json")
	written, err := keep(path, orig, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if again, err := keep(path, orig, true, written); err != nil || string(again) != string(written) {
		t.Fatalf("kept again: %v", err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatal("unchanged routes were written again")
	}
	if _, err := keep(path, orig, true, nil); err != nil {
		t.Fatal(err)
	}
	kept, listening, _, err := restore(path)
	if err != nil || !listening {
		t.Fatalf("restore: %v, listening %v", err, listening)
	}
	for _, req := range []struct{ host, path string }{
		{"web.example", "/"}, {"web.example", "/api"}, {"web.example", "/api/x"}, {"x.apps.example", "/"}, {"other", "/any/1"}, {"other", "/"},
	} {
		r1, b1 := orig.route(req.host, req.path)
		r2, b2 := kept.route(req.host, req.path)
		if (r1 == nil) != (r2 == nil) || b1.service != b2.service || strings.Join(b1.endpoints, ",") != strings.Join(b2.endpoints, ",") || b1.h2c != b2.h2c {
			t.Errorf("%s%s: kept routes to %+v, the table to %+v", req.host, req.path, b2, b1)
		}
	}

	// An agent with no server: the kept routes are served.
	offline, err := newProxy(Config{Secret: f.secret, Logger: discardLogger(), StatePath: path, HTTPAddr: "127.0.0.1:0", HTTPSAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { offline.listen(nil) })
	if offline.serveKept() == nil {
		t.Fatal("nothing kept was served")
	}
	front := httptest.NewServer(offline)
	defer front.Close()
	if code, body := get(t, front.Client(), front.URL+"/", "web.example"); code != 200 || !strings.HasPrefix(body, "web /") {
		t.Errorf("offline: %d %s", code, body)
	}
	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := restore(path); err == nil {
		t.Error("a damaged file restored")
	}
}
