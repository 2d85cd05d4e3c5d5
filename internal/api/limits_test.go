package api_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestConnectionsPerSource: an address holding its share of connections
// gets the next one closed at once, while other addresses are served;
// closing one gives its slot back.
func TestConnectionsPerSource(t *testing.T) {
	ts := startServerWith(t, "", 0, func(c *api.Config) { c.MaxConnectionsPerSource = 10 })
	attacker := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}, Timeout: 5 * time.Second}
	var held []net.Conn
	defer func() {
		for _, c := range held {
			_ = c.Close()
		}
	}()
	for range 10 {
		c, err := attacker.Dial("tcp", ts.srv.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	// The 11th is accepted and closed without a byte.
	extra, err := attacker.Dial("tcp", ts.srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	_ = extra.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := extra.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("the 11th connection from one address read %d bytes, %v; want it closed", n, err)
	}
	_ = extra.Close()
	// Others are served meanwhile.
	if _, err := ts.client.CoreV1().Namespaces().List(context.Background(), metav1.ListOptions{}); err != nil {
		t.Errorf("another address while one is at its limit: %v", err)
	}
	// One closed, one more may open, and it speaks TLS.
	_ = held[0].Close()
	held = held[1:]
	deadline := time.Now().Add(5 * time.Second)
	for {
		conn, err := tls.DialWithDialer(attacker, "tcp", ts.srv.Addr().String(), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only the handshake matters
		if err == nil {
			_ = conn.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a freed slot never opened: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestMaxRequestsInFlight: beyond the writes in flight a client gets 429
// with Retry-After, as Kubernetes' max-in-flight filter answers; once one
// ends, the next is served. Masters are not counted, as in Kubernetes.
func TestMaxRequestsInFlight(t *testing.T) {
	ts := startServerWith(t, "", 0, func(c *api.Config) { c.MaxMutatingRequestsInFlight = 1 })
	node := ts.as(t, "system:node:n1", "system:nodes")
	const lease = `{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"n1"}}`
	const leases = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
	// The first write holds its seat while its body trickles in.
	slowBody, feed := io.Pipe()
	first := make(chan int, 1)
	go func() {
		req, _ := http.NewRequestWithContext(context.Background(), "POST", ts.srv.URL()+leases, slowBody)
		req.Header.Set("Content-Type", jsonType)
		resp, err := node.client.Do(req)
		if err != nil {
			first <- 0
			return
		}
		_ = resp.Body.Close()
		first <- resp.StatusCode
	}()
	if _, err := feed.Write([]byte(lease[:10])); err != nil {
		t.Fatal(err)
	}
	// A second write is refused while the first is in flight.
	var code int
	var retryAfter string
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		req, _ := http.NewRequestWithContext(context.Background(), "POST", ts.srv.URL()+"/api/v1/namespaces/default/events", strings.NewReader(`{}`))
		req.Header.Set("Content-Type", jsonType)
		resp, err := node.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		code, retryAfter = resp.StatusCode, resp.Header.Get("Retry-After")
		if code == http.StatusTooManyRequests {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code != http.StatusTooManyRequests || retryAfter != "1" {
		t.Fatalf("a write beyond the limit: %d, Retry-After %q; want 429 with Retry-After", code, retryAfter)
	}
	// Masters are not counted.
	if _, err := ts.client.CoreV1().ConfigMaps("default").Create(context.Background(), configMap("by-admin", nil), metav1.CreateOptions{}); err != nil {
		t.Errorf("an admin write while the seat is taken: %v", err)
	}
	_, _ = feed.Write([]byte(lease[10:]))
	_ = feed.Close()
	if got := <-first; got != http.StatusCreated {
		t.Errorf("the slow write: %d", got)
	}
	if got, msg := node.do("PUT", leases+"/n1", jsonType, lease); got != http.StatusOK && got != http.StatusConflict {
		t.Errorf("a write after the seat was freed: %d %s", got, msg)
	}
}

// TestAnonymousHTTP2ConnectionsClose: as Kubernetes' mitigation of
// HTTP/2 floods from unauthenticated clients (CVE-2023-44487), a request
// without credentials over HTTP/2 ends its connection; an authenticated
// client keeps multiplexing over one.
func TestAnonymousHTTP2ConnectionsClose(t *testing.T) {
	ts := startServer(t, "")
	connections := func(client *http.Client, path string) (int, int) {
		t.Helper()
		fresh := 0
		codes := 0
		for range 3 {
			trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
				if !info.Reused {
					fresh++
				}
			}}
			req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "GET", ts.srv.URL()+path, nil)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.ProtoMajor != 2 {
				t.Fatalf("%s over HTTP/%d, want HTTP/2", path, resp.ProtoMajor)
			}
			codes = resp.StatusCode
		}
		return fresh, codes
	}
	anonymous := &http.Client{Transport: &http.Transport{ForceAttemptHTTP2: true, TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // anonymous on purpose
	for _, path := range []string{"/api/v1/namespaces", "/healthz"} {
		if fresh, code := connections(anonymous, path); fresh != 3 {
			t.Errorf("3 anonymous HTTP/2 requests for %s (%d) used %d connections, want one each", path, code, fresh)
		}
	}
	admin := ts.as(t, "admin", "system:masters").client
	admin.Transport.(*http.Transport).ForceAttemptHTTP2 = true
	if fresh, code := connections(admin, "/api/v1/namespaces"); fresh != 1 || code != 200 {
		t.Errorf("3 authenticated HTTP/2 requests used %d connections (%d), want one", fresh, code)
	}
}
