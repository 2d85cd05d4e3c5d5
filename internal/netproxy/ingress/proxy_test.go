package ingress

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/gatewayapi"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// echo is a backend answering with its name and what it was sent.
func echo(t *testing.T, name string) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = fmt.Fprintf(w, "%s %s host=%s xff=%s xfp=%s xfh=%s proto=%d", name, r.URL.Path, r.Host,
			r.Header.Get("X-Forwarded-For"), r.Header.Get("X-Forwarded-Proto"), r.Header.Get("X-Forwarded-Host"), r.ProtoMajor)
	}))
	t.Cleanup(s.Close)
	return s
}

// fakeCluster is a cluster of Services backed by the given addresses.
type fakeCluster struct {
	ingresses []*networkingv1.Ingress
	svcs      map[string]*corev1.Service
	slices    map[string][]*discoveryv1.EndpointSlice
	secrets   map[string]*corev1.Secret
	gateways  gatewayapi.Config
}

// service adds a Service on port 80 whose ready endpoints are addrs
// (host:port).
func (f *fakeCluster) service(name string, h2c bool, addrs ...string) {
	if f.svcs == nil {
		f.svcs, f.slices = map[string]*corev1.Service{}, map[string][]*discoveryv1.EndpointSlice{}
	}
	sp := corev1.ServicePort{Port: 80}
	if h2c {
		sp.AppProtocol = ptr.To("kubernetes.io/h2c")
	}
	f.svcs[name] = &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{sp}}}
	f.slices[name] = nil
	for _, a := range addrs { // a slice each: test servers' ports differ
		host, port, _ := net.SplitHostPort(a)
		n, _ := strconv.Atoi(port)
		f.slices[name] = append(f.slices[name], &discoveryv1.EndpointSlice{Ports: []discoveryv1.EndpointPort{{Port: ptr.To(int32(n))}},
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{host}}}})
	}
}

func (f *fakeCluster) list() cluster {
	return cluster{ingresses: f.ingresses, classes: []*networkingv1.IngressClass{orchClass()}, gateways: f.gateways,
		service: func(_, n string) *corev1.Service { return f.svcs[n] }, slices: func(_, n string) []*discoveryv1.EndpointSlice { return f.slices[n] }}
}

func (f *fakeCluster) secret(_ context.Context, ns, name string) (*corev1.Secret, error) {
	if s := f.secrets[name]; s != nil {
		return s, nil
	}
	return nil, apierrors.NewNotFound(corev1.Resource("secrets"), name)
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func testProxy(t *testing.T, f *fakeCluster) *Proxy {
	p, err := newProxy(Config{Secret: f.secret, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	p.list = f.list
	p.rebuild(context.Background())
	return p
}

func get(t *testing.T, c *http.Client, url, host string, header ...string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Host = host
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func addr(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }

// TestProxy: requests reach the backend of their host and path with the
// client's Host and the X-Forwarded headers; no rule is a 404, a Service
// without ready endpoints a 503 that says so, and an endpoint that
// refuses connections (its pod just went away) is passed over.
func TestProxy(t *testing.T) {
	web, api := echo(t, "web"), echo(t, "api")
	gone := httptest.NewServer(http.NotFoundHandler())
	goneAddr := addr(gone)
	gone.Close() // refuses connections from now on
	f := &fakeCluster{ingresses: []*networkingv1.Ingress{ing("site", 0,
		rule("web.example", path("/", prefix, "web"), path("/api", prefix, "api"), path("/empty", prefix, "empty"), path("/missing", prefix, "missing")))}}
	f.service("web", false, addr(web), goneAddr)
	f.service("api", false, addr(api))
	f.service("empty", false)
	p := testProxy(t, f)
	front := httptest.NewServer(p)
	defer front.Close()
	for range 6 { // over both endpoints, one refusing
		code, body := get(t, front.Client(), front.URL+"/index.html", "web.example", "X-Forwarded-For", "203.0.113.7")
		if code != 200 || !strings.HasPrefix(body, "web /index.html host=web.example xff=203.0.113.7, 127.0.0.1 xfp=http xfh=web.example") {
			t.Fatalf("web: %d %s", code, body)
		}
	}
	if code, body := get(t, front.Client(), front.URL+"/api/users", "web.example"); code != 200 || !strings.HasPrefix(body, "api /api/users") {
		t.Errorf("api: %d %s", code, body)
	}
	if code, body := get(t, front.Client(), front.URL+"/", "other.example"); code != 404 {
		t.Errorf("no rule: %d %s", code, body)
	}
	if code, body := get(t, front.Client(), front.URL+"/empty", "web.example"); code != 503 || !strings.Contains(body, `no ready endpoints of service default/empty`) {
		t.Errorf("no endpoints: %d %s", code, body)
	}
	if code, body := get(t, front.Client(), front.URL+"/missing", "web.example"); code != 503 || !strings.Contains(body, `service "default/missing" not found`) {
		t.Errorf("no service: %d %s", code, body)
	}
}

// selfSignedPEM is a certificate for names and its key, in PEM.
func selfSignedPEM(t *testing.T, names ...string) (certPEM, keyPEM []byte, pool *x509.CertPool) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), pool
}

// TestTLS: HTTPS is terminated with the certificate of the TLS Secret
// the Ingress names for the client's SNI name (a wildcard's too), over
// HTTP/2 when the client offers it; a name without one, or a Secret
// whose key does not match, gets the proxy's own certificate, which a
// client's check refuses.
func TestTLS(t *testing.T) {
	web := echo(t, "web")
	certPEM, keyPEM, pool := selfSignedPEM(t, "web.example", "*.apps.example")
	otherCert, _, _ := selfSignedPEM(t, "bad.example")
	f := &fakeCluster{secrets: map[string]*corev1.Secret{
		"web-tls": {Type: corev1.SecretTypeTLS, Data: map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM}},
		"bad-tls": {Type: corev1.SecretTypeTLS, Data: map[string][]byte{"tls.crt": otherCert, "tls.key": keyPEM}},
	}}
	site := ing("site", 0, rule("web.example", path("/", prefix, "web")), rule("a.apps.example", path("/", prefix, "web")), rule("bad.example", path("/", prefix, "web")))
	site.Spec.TLS = []networkingv1.IngressTLS{{Hosts: []string{"web.example", "*.apps.example"}, SecretName: "web-tls"}, {Hosts: []string{"bad.example"}, SecretName: "bad-tls"}}
	f.ingresses = []*networkingv1.Ingress{site}
	f.service("web", false, addr(web))
	p := testProxy(t, f)
	front := httptest.NewUnstartedServer(p)
	front.EnableHTTP2 = true
	front.TLS = p.tlsConfig()
	front.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes below
	front.StartTLS()
	defer front.Close()
	client := func(name string) *http.Client {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: name}, ForceAttemptHTTP2: true}
		return &http.Client{Transport: tr}
	}
	for _, name := range []string{"web.example", "a.apps.example"} {
		code, body := get(t, client(name), front.URL+"/", name)
		if code != 200 || !strings.Contains(body, "xfp=https") || !strings.Contains(body, "proto=1") {
			t.Errorf("%s over TLS: %d %s", name, code, body)
		}
	}
	resp, err := client("web.example").Get(front.URL + "/")
	if err == nil {
		if resp.ProtoMajor != 2 {
			t.Errorf("the client offered HTTP/2, the proxy answered HTTP/%d", resp.ProtoMajor)
		}
		_ = resp.Body.Close()
	}
	for _, name := range []string{"bad.example", "nothing.example"} {
		resp, err := client(name).Get(front.URL + "/")
		if err == nil {
			_ = resp.Body.Close()
		}
		if err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Errorf("%s: %v, want a certificate the client refuses", name, err)
		}
	}
}

// TestUpgradeAndH2C: a WebSocket upgrade passes through both ways, and a
// Service port of appProtocol kubernetes.io/h2c is spoken to in HTTP/2
// without TLS (as gRPC servers are), also when the client speaks h2c.
func TestUpgradeAndH2C(t *testing.T) {
	ws := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "websocket" {
			http.Error(w, "no upgrade", 400)
			return
		}
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer func() { _ = conn.Close() }()
		_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		_ = rw.Flush()
		line, _ := rw.ReadString('\n')
		_, _ = rw.WriteString("echo: " + line)
		_ = rw.Flush()
	}))
	defer ws.Close()
	h2 := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = fmt.Fprintf(w, "proto=%d", r.ProtoMajor)
	}))
	h2.Config.Protocols = new(http.Protocols)
	h2.Config.Protocols.SetUnencryptedHTTP2(true)
	h2.Start()
	defer h2.Close()
	f := &fakeCluster{ingresses: []*networkingv1.Ingress{ing("site", 0, rule("x.example", path("/ws", prefix, "ws"), path("/grpc", prefix, "grpc")))}}
	f.service("ws", false, addr(ws))
	f.service("grpc", true, addr(h2))
	p := testProxy(t, f)
	front := httptest.NewUnstartedServer(p)
	front.Config.Protocols = new(http.Protocols)
	front.Config.Protocols.SetHTTP1(true)
	front.Config.Protocols.SetUnencryptedHTTP2(true)
	front.Start()
	defer front.Close()

	conn, err := net.Dial("tcp", addr(front))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: x.example\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("the upgrade: %v %+v", err, resp)
	}
	defer func() { _ = resp.Body.Close() }()
	if _, err := fmt.Fprintf(conn, "hello\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := br.ReadString('\n'); err != nil || line != "echo: hello\n" {
		t.Errorf("through the upgraded connection: %q %v", line, err)
	}

	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	if code, body := get(t, &http.Client{Transport: tr}, front.URL+"/grpc", "x.example"); code != 200 || body != "proto=2" {
		t.Errorf("h2c end to end: %d %s", code, body)
	}
	if code, body := get(t, front.Client(), front.URL+"/grpc", "x.example"); code != 200 || body != "proto=2" {
		t.Errorf("HTTP/1.1 in, h2c to the backend: %d %s", code, body)
	}
}
