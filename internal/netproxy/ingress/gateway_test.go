package ingress

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/gatewayapi"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

func pathMatch(typ gatewayv1.PathMatchType, value string) gatewayv1.HTTPRouteMatch {
	return gatewayv1.HTTPRouteMatch{Path: &gatewayv1.HTTPPathMatch{Type: &typ, Value: &value}}
}

func to(service string, weight int32) gatewayapi.ConfigBackend {
	return gatewayapi.ConfigBackend{Service: "default/" + service, Port: 80, Weight: weight}
}

// gatewayFront serves p on every local address of a free port, as the
// node's listener for a Gateway port, and returns the port.
func gatewayFront(t testing.TB, p *Proxy) int32 {
	t.Helper()
	l, err := net.Listen("tcp4", ":0")
	if err != nil {
		t.Fatal(err)
	}
	s := &http.Server{Handler: p, ConnContext: connContext, ReadHeaderTimeout: time.Second}
	go func() { _ = s.Serve(l) }()
	t.Cleanup(func() { _ = s.Close() })
	return int32(l.Addr().(*net.TCPAddr).Port)
}

// gwGet asks addr:port for path with host, and returns the status, the
// body and the response headers.
func gwGet(t *testing.T, addr string, port int32, host, method, path string, header ...string) (int, string, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+net.JoinHostPort(addr, strconv.Itoa(int(port)))+path, nil)
	req.Host = host
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }, Timeout: 10 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// TestGatewayRouting: two Gateways on one port are told apart by the
// address the client asked for; within a Gateway the listener is chosen
// by hostname and the route by the Gateway API's precedence (exact path,
// longer prefix, method, more headers, more query parameters, then the
// older route), as its conformance suite checks.
func TestGatewayRouting(t *testing.T) {
	names := []string{"exact", "prefix", "longer", "method", "header", "query", "older", "newer", "wild", "other"}
	f := &fakeCluster{}
	for _, n := range names {
		f.service(n, false, addr(echo(t, n)))
	}
	p := testProxy(t, f)
	port := gatewayFront(t, p)
	post := gatewayv1.HTTPMethodPost
	exactType := gatewayv1.HeaderMatchExact
	f.gateways = gatewayapi.Config{Gateways: []gatewayapi.ConfigGateway{
		{Name: "infra/main", Addresses: []string{"127.0.0.1"}, Listeners: []gatewayapi.ConfigListener{
			{Name: "any", Port: port, Protocol: "HTTP", Routes: []gatewayapi.ConfigRoute{
				{Name: "apps/b", Order: 1, Rules: []gatewayapi.ConfigRule{
					{Matches: []gatewayv1.HTTPRouteMatch{pathMatch(gatewayv1.PathMatchPathPrefix, "/")}, Backends: []gatewayapi.ConfigBackend{to("newer", 1)}},
				}},
				{Name: "apps/a", Order: 0, Rules: []gatewayapi.ConfigRule{
					{Matches: []gatewayv1.HTTPRouteMatch{pathMatch(gatewayv1.PathMatchExact, "/a")}, Backends: []gatewayapi.ConfigBackend{to("exact", 1)}},
					{Matches: []gatewayv1.HTTPRouteMatch{pathMatch(gatewayv1.PathMatchPathPrefix, "/a")}, Backends: []gatewayapi.ConfigBackend{to("prefix", 1)}},
					{Matches: []gatewayv1.HTTPRouteMatch{pathMatch(gatewayv1.PathMatchPathPrefix, "/a/b")}, Backends: []gatewayapi.ConfigBackend{to("longer", 1)}},
					{Matches: []gatewayv1.HTTPRouteMatch{{Path: pathMatch(gatewayv1.PathMatchPathPrefix, "/m").Path, Method: &post}}, Backends: []gatewayapi.ConfigBackend{to("method", 1)}},
					{Matches: []gatewayv1.HTTPRouteMatch{{Path: pathMatch(gatewayv1.PathMatchPathPrefix, "/m").Path,
						Headers: []gatewayv1.HTTPHeaderMatch{{Type: &exactType, Name: "version", Value: "two"}}}}, Backends: []gatewayapi.ConfigBackend{to("header", 1)}},
					{Matches: []gatewayv1.HTTPRouteMatch{{Path: pathMatch(gatewayv1.PathMatchPathPrefix, "/m").Path,
						QueryParams: []gatewayv1.HTTPQueryParamMatch{{Name: "animal", Value: "whale"}}}}, Backends: []gatewayapi.ConfigBackend{to("query", 1)}},
					{Matches: []gatewayv1.HTTPRouteMatch{pathMatch(gatewayv1.PathMatchPathPrefix, "/")}, Backends: []gatewayapi.ConfigBackend{to("older", 1)}},
				}},
			}},
			{Name: "wild", Port: port, Protocol: "HTTP", Hostname: "*.example", Routes: []gatewayapi.ConfigRoute{
				{Name: "apps/wild", Hostnames: []string{"*.example"}, Rules: []gatewayapi.ConfigRule{
					{Matches: []gatewayv1.HTTPRouteMatch{{}}, Backends: []gatewayapi.ConfigBackend{to("wild", 1)}}}}}},
		}},
		{Name: "infra/other", Addresses: []string{"127.0.0.2"}, Listeners: []gatewayapi.ConfigListener{
			{Name: "any", Port: port, Protocol: "HTTP", Routes: []gatewayapi.ConfigRoute{
				{Name: "apps/other", Rules: []gatewayapi.ConfigRule{{Matches: []gatewayv1.HTTPRouteMatch{{}}, Backends: []gatewayapi.ConfigBackend{to("other", 1)}}}}}}}},
	}}
	p.rebuild(t.Context())

	for _, tc := range []struct {
		addr, host, method, path string
		header                   []string
		want                     string
	}{
		{"127.0.0.1", "x.test", "GET", "/a", nil, "exact"},
		{"127.0.0.1", "x.test", "GET", "/a/", nil, "prefix"},
		{"127.0.0.1", "x.test", "GET", "/a/b/c", nil, "longer"},
		{"127.0.0.1", "x.test", "GET", "/ab", nil, "older"}, // prefixes match whole path elements
		{"127.0.0.1", "x.test", "POST", "/m", []string{"version", "two"}, "method"},
		{"127.0.0.1", "x.test", "GET", "/m?animal=whale", []string{"version", "two"}, "header"},
		{"127.0.0.1", "x.test", "GET", "/m?animal=whale", nil, "query"},
		{"127.0.0.1", "x.test", "GET", "/other", nil, "older"}, // the older of two equal routes
		{"127.0.0.1", "shop.example", "GET", "/a", nil, "wild"},
		{"127.0.0.2", "shop.example", "GET", "/a", nil, "other"},
	} {
		code, body, _ := gwGet(t, tc.addr, port, tc.host, tc.method, tc.path, tc.header...)
		if code != http.StatusOK || !strings.HasPrefix(body, tc.want+" ") {
			t.Errorf("%s %s%s at %s: %d %q, want %s", tc.method, tc.host, tc.path, tc.addr, code, body, tc.want)
		}
	}
	// An address no Gateway has is not theirs: the Ingresses' (none).
	if code, _, _ := gwGet(t, "127.0.0.3", port, "x.test", "GET", "/a"); code != http.StatusNotFound {
		t.Errorf("an address of no Gateway: %d", code)
	}
}

// TestGatewayFilters: the filters of the Gateway API's core and extended
// HTTPRoute features as its spec describes them, weighted backends, and
// the 500 of a rule with no usable backend.
func TestGatewayFilters(t *testing.T) {
	var mirrored atomic.Int32
	mirror := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { mirrored.Add(1) }))
	defer mirror.Close()
	headers := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = fmt.Fprintf(w, "path=%s host=%s set=%s add=%s removed=%s", r.URL.Path, r.Host, r.Header.Get("X-Set"), strings.Join(r.Header.Values("X-Add"), ","), r.Header.Get("X-Remove"))
	}))
	defer headers.Close()
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(5 * time.Second):
		case <-r.Context().Done():
		}
	}))
	defer slow.Close()
	f := &fakeCluster{}
	f.service("headers", false, addr(headers))
	f.service("mirror", false, addr(mirror))
	f.service("slow", false, addr(slow))
	f.service("one", false, addr(echo(t, "one")))
	f.service("two", false, addr(echo(t, "two")))
	p := testProxy(t, f)
	port := gatewayFront(t, p)
	rule := func(path string, filters []gatewayv1.HTTPRouteFilter, backends ...gatewayapi.ConfigBackend) gatewayapi.ConfigRule {
		return gatewayapi.ConfigRule{Matches: []gatewayv1.HTTPRouteMatch{pathMatch(gatewayv1.PathMatchPathPrefix, path)}, Filters: filters, Backends: backends}
	}
	str := func(s string) *string { return &s }
	code := func(c int) *int { return &c }
	portNum := func(p int32) *gatewayv1.PortNumber { v := gatewayv1.PortNumber(p); return &v }
	hostname := func(h string) *gatewayv1.PreciseHostname { v := gatewayv1.PreciseHostname(h); return &v }
	timeout := gatewayv1.Duration("200ms")
	ns := gatewayv1.Namespace("default")
	rules := []gatewayapi.ConfigRule{
		rule("/headers", []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestHeaderModifier, RequestHeaderModifier: &gatewayv1.HTTPHeaderFilter{
			Set: []gatewayv1.HTTPHeader{{Name: "X-Set", Value: "set"}}, Add: []gatewayv1.HTTPHeader{{Name: "X-Add", Value: "added"}}, Remove: []string{"X-Remove"}}},
			{Type: gatewayv1.HTTPRouteFilterResponseHeaderModifier, ResponseHeaderModifier: &gatewayv1.HTTPHeaderFilter{Set: []gatewayv1.HTTPHeader{{Name: "X-Answer", Value: "42"}}}}},
			to("headers", 1)),
		rule("/redirect", []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestRedirect, RequestRedirect: &gatewayv1.HTTPRequestRedirectFilter{
			Scheme: str("https"), Hostname: hostname("example.org"), StatusCode: code(301),
			Path: &gatewayv1.HTTPPathModifier{Type: gatewayv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: str("/moved")}}}}),
		rule("/port", []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestRedirect, RequestRedirect: &gatewayv1.HTTPRequestRedirectFilter{Port: portNum(8443)}}}),
		rule("/rewrite", []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterURLRewrite, URLRewrite: &gatewayv1.HTTPURLRewriteFilter{
			Hostname: hostname("inner.example"), Path: &gatewayv1.HTTPPathModifier{Type: gatewayv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: str("/")}}}},
			to("headers", 1)),
		rule("/full", []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterURLRewrite, URLRewrite: &gatewayv1.HTTPURLRewriteFilter{
			Path: &gatewayv1.HTTPPathModifier{Type: gatewayv1.FullPathHTTPPathModifier, ReplaceFullPath: str("/one")}}}},
			to("headers", 1)),
		rule("/mirror", []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestMirror, RequestMirror: &gatewayv1.HTTPRequestMirrorFilter{
			BackendRef: gatewayv1.BackendObjectReference{Name: "mirror", Namespace: &ns, Port: portNum(80)}}}}, to("one", 1)),
		rule("/weights", nil, to("one", 1), to("two", 1), to("headers", 0)),
		rule("/invalid", nil, gatewayapi.ConfigBackend{Weight: 1, Invalid: "backend default/gone: not found"}),
		rule("/none", nil),
	}
	slowRule := rule("/slow", nil, to("slow", 1))
	slowRule.Timeouts = &gatewayv1.HTTPRouteTimeouts{Request: &timeout}
	rules = append(rules, slowRule)
	f.gateways = gatewayapi.Config{Gateways: []gatewayapi.ConfigGateway{{Name: "infra/main", Addresses: []string{"127.0.0.1"},
		Listeners: []gatewayapi.ConfigListener{{Name: "http", Port: port, Protocol: "HTTP", Routes: []gatewayapi.ConfigRoute{{Name: "apps/filters", Rules: rules}}}}}}}
	p.rebuild(t.Context())

	status, body, h := gwGet(t, "127.0.0.1", port, "web.example", "GET", "/headers", "X-Remove", "me", "X-Add", "mine")
	if status != 200 || body != "path=/headers host=web.example set=set add=mine,added removed=" || h.Get("X-Answer") != "42" {
		t.Errorf("header filters: %d %q %v", status, body, h)
	}
	status, _, h = gwGet(t, "127.0.0.1", port, "web.example", "GET", "/redirect/page?q=1")
	if status != 301 || h.Get("Location") != "https://example.org/moved/page?q=1" {
		t.Errorf("redirect: %d %q", status, h.Get("Location"))
	}
	status, _, h = gwGet(t, "127.0.0.1", port, "web.example", "GET", "/port")
	if status != 302 || h.Get("Location") != "http://web.example:8443/port" {
		t.Errorf("port redirect: %d %q", status, h.Get("Location"))
	}
	if status, body, _ = gwGet(t, "127.0.0.1", port, "web.example", "GET", "/rewrite/x"); body != "path=/x host=inner.example set= add= removed=" {
		t.Errorf("prefix rewrite: %d %q", status, body)
	}
	if status, body, _ = gwGet(t, "127.0.0.1", port, "web.example", "GET", "/full/x"); !strings.HasPrefix(body, "path=/one ") {
		t.Errorf("full path rewrite: %d %q", status, body)
	}
	if status, body, _ = gwGet(t, "127.0.0.1", port, "web.example", "GET", "/mirror"); status != 200 || !strings.HasPrefix(body, "one ") {
		t.Errorf("mirrored request: %d %q", status, body)
	}
	deadline := time.Now().Add(5 * time.Second)
	for mirrored.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if mirrored.Load() != 1 {
		t.Errorf("the mirror got %d requests", mirrored.Load())
	}
	seen := map[string]int{}
	for range 60 {
		_, body, _ := gwGet(t, "127.0.0.1", port, "web.example", "GET", "/weights")
		seen[strings.Fields(body)[0]]++
	}
	if seen["one"] == 0 || seen["two"] == 0 || seen["path=/weights"] != 0 {
		t.Errorf("weighted backends: %v", seen)
	}
	for _, path := range []string{"/invalid", "/none"} {
		if status, body, _ := gwGet(t, "127.0.0.1", port, "web.example", "GET", path); status != http.StatusInternalServerError {
			t.Errorf("%s: %d %q, want a 500", path, status, body)
		}
	}
	start := time.Now()
	if status, _, _ := gwGet(t, "127.0.0.1", port, "web.example", "GET", "/slow"); status != http.StatusGatewayTimeout || time.Since(start) > 4*time.Second {
		t.Errorf("request timeout: %d after %v", status, time.Since(start))
	}
}

// TestGatewayKept: the Gateways' routes and endpoints are kept on disk
// with the Ingresses', and an agent started with the server away serves
// them.
func TestGatewayKept(t *testing.T) {
	f := &fakeCluster{}
	f.service("one", false, addr(echo(t, "one")))
	p := testProxy(t, f)
	l, err := net.Listen("tcp4", ":0")
	if err != nil {
		t.Fatal(err)
	}
	port := int32(l.Addr().(*net.TCPAddr).Port)
	f.gateways = gatewayapi.Config{Gateways: []gatewayapi.ConfigGateway{{Name: "infra/main", Addresses: []string{"127.0.0.1"},
		Listeners: []gatewayapi.ConfigListener{{Name: "http", Port: port, Protocol: "HTTP", Routes: []gatewayapi.ConfigRoute{{Name: "apps/one",
			Rules: []gatewayapi.ConfigRule{{Matches: []gatewayv1.HTTPRouteMatch{{}}, Backends: []gatewayapi.ConfigBackend{to("one", 1)}}}}}}}}}}
	p.rebuild(t.Context())
	path := t.TempDir() + "/ingress.json"
	if _, err := keep(path, p.table.Load(), false, nil); err != nil {
		t.Fatal(err)
	}
	offline, err := newProxy(Config{Secret: f.secret, Logger: discardLogger(), StatePath: path})
	if err != nil {
		t.Fatal(err)
	}
	if offline.serveKept() == nil {
		t.Fatal("nothing kept was served")
	}
	if got := offline.wanted(false); len(got) != 1 {
		t.Errorf("listeners wanted offline: %v", got)
	}
	s := &http.Server{Handler: offline, ConnContext: connContext, ReadHeaderTimeout: time.Second}
	go func() { _ = s.Serve(l) }()
	defer func() { _ = s.Close() }()
	if code, body, _ := gwGet(t, "127.0.0.1", port, "any.example", "GET", "/x"); code != 200 || !strings.HasPrefix(body, "one /x") {
		t.Errorf("offline: %d %q", code, body)
	}
}

// TestGatewayCORS: a CORS filter answers preflight requests itself, with
// what the filter allows for an allowed origin (exact or *.domain) and
// no CORS header for another, and marks responses to allowed origins.
func TestGatewayCORS(t *testing.T) {
	f := &fakeCluster{}
	f.service("one", false, addr(echo(t, "one")))
	p := testProxy(t, f)
	port := gatewayFront(t, p)
	yes := true
	cors := &gatewayv1.HTTPCORSFilter{AllowOrigins: []gatewayv1.CORSOrigin{"https://www.foo.com", "https://*.bar.com"},
		AllowMethods: []gatewayv1.HTTPMethodWithWildcard{"GET", "OPTIONS"}, AllowHeaders: []gatewayv1.HTTPHeaderName{"x-header-1"},
		ExposeHeaders: []gatewayv1.HTTPHeaderName{"x-header-3"}, AllowCredentials: &yes, MaxAge: 3600}
	f.gateways = gatewayapi.Config{Gateways: []gatewayapi.ConfigGateway{{Name: "infra/main", Addresses: []string{"127.0.0.1"},
		Listeners: []gatewayapi.ConfigListener{{Name: "http", Port: port, Protocol: "HTTP", Routes: []gatewayapi.ConfigRoute{{Name: "apps/cors",
			Rules: []gatewayapi.ConfigRule{{Matches: []gatewayv1.HTTPRouteMatch{{}}, Filters: []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterCORS, CORS: cors}},
				Backends: []gatewayapi.ConfigBackend{to("one", 1)}}}}}}}}}}
	p.rebuild(t.Context())

	code, _, h := gwGet(t, "127.0.0.1", port, "x.test", "OPTIONS", "/", "Origin", "https://a.bar.com", "Access-Control-Request-Method", "GET")
	if code != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != "https://a.bar.com" || h.Get("Access-Control-Allow-Methods") != "GET, OPTIONS" ||
		h.Get("Access-Control-Allow-Headers") != "x-header-1" || h.Get("Access-Control-Max-Age") != "3600" || h.Get("Access-Control-Allow-Credentials") != "true" {
		t.Errorf("preflight from an allowed origin: %d %v", code, h)
	}
	code, _, h = gwGet(t, "127.0.0.1", port, "x.test", "OPTIONS", "/", "Origin", "https://evil.example", "Access-Control-Request-Method", "GET")
	if code != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("preflight from another origin: %d %v", code, h)
	}
	code, body, h := gwGet(t, "127.0.0.1", port, "x.test", "GET", "/", "Origin", "https://www.foo.com")
	if code != 200 || !strings.HasPrefix(body, "one ") || h.Get("Access-Control-Allow-Origin") != "https://www.foo.com" || h.Get("Access-Control-Expose-Headers") != "x-header-3" {
		t.Errorf("a request from an allowed origin: %d %q %v", code, body, h)
	}
	if _, _, h := gwGet(t, "127.0.0.1", port, "x.test", "GET", "/", "Origin", "https://bar.com"); h.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("*.bar.com allowed bar.com: %v", h)
	}
}

// TestGatewayRetry: a rule's retry policy sends a request again after an
// answer with one of its codes, up to its attempts, and not after
// another code.
func TestGatewayRetry(t *testing.T) {
	var calls atomic.Int32
	flaky := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		fails, _ := strconv.Atoi(r.URL.Query().Get("fail"))
		code, _ := strconv.Atoi(r.URL.Query().Get("code"))
		if int(n) <= fails {
			w.WriteHeader(code)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	defer flaky.Close()
	f := &fakeCluster{}
	f.service("flaky", false, addr(flaky))
	p := testProxy(t, f)
	port := gatewayFront(t, p)
	attempts := 2
	backoff := gatewayv1.Duration("1ms")
	f.gateways = gatewayapi.Config{Gateways: []gatewayapi.ConfigGateway{{Name: "infra/main", Addresses: []string{"127.0.0.1"},
		Listeners: []gatewayapi.ConfigListener{{Name: "http", Port: port, Protocol: "HTTP", Routes: []gatewayapi.ConfigRoute{{Name: "apps/retry",
			Rules: []gatewayapi.ConfigRule{{Matches: []gatewayv1.HTTPRouteMatch{{}}, Backends: []gatewayapi.ConfigBackend{to("flaky", 1)},
				Retry: &gatewayv1.HTTPRouteRetry{Codes: []gatewayv1.HTTPRouteRetryStatusCode{500, 502}, Attempts: &attempts, Backoff: &backoff}}}}}}}}}}
	p.rebuild(t.Context())
	for _, tc := range []struct {
		query     string
		want      int
		wantCalls int32
	}{
		{"fail=2&code=500", 200, 3}, // two retries
		{"fail=3&code=502", 502, 3}, // out of attempts
		{"fail=1&code=503", 503, 1}, // not a code to retry
	} {
		calls.Store(0)
		if code, _, _ := gwGet(t, "127.0.0.1", port, "x.test", "GET", "/?"+tc.query); code != tc.want || calls.Load() != tc.wantCalls {
			t.Errorf("%s: %d after %d calls, want %d after %d", tc.query, code, calls.Load(), tc.want, tc.wantCalls)
		}
	}
}
