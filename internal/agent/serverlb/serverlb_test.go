package serverlb_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent/serverlb"
)

// fakeServer answers /readyz (while ready) and /who with its name, and
// holds /hang open until the client goes.
type fakeServer struct {
	*httptest.Server
	name  string
	ready atomic.Bool
}

func newFake(t *testing.T, name string) *fakeServer {
	f := &fakeServer{name: name}
	f.ready.Store(true)
	f.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/readyz":
			if !f.ready.Load() {
				http.Error(w, "not ready", http.StatusServiceUnavailable)
				return
			}
			_, _ = io.WriteString(w, "ok")
		case "/who":
			_, _ = io.WriteString(w, f.name)
		case "/hang":
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeServer) addr() string { return strings.TrimPrefix(f.URL, "https://") }

func caOf(f *fakeServer) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.Certificate().Raw})
}

// client talks to the balancer as the node's clients do: TLS to the
// server behind it, verified against the cluster's CA.
func client(ca []byte) *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}}
}

func who(t *testing.T, c *http.Client, lb *serverlb.Balancer) string {
	t.Helper()
	resp, err := c.Get("https://" + lb.Address() + "/who")
	if err != nil {
		t.Fatalf("through the balancer: %v", err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func start(t *testing.T, given string, state string, ca []byte) *serverlb.Balancer {
	t.Helper()
	lb, err := serverlb.New(given, state, ca, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- lb.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return lb
}

// The node stays with the server it joined while that is ready; learns
// the others; moves when the current one is not ready (cutting the
// connections still open to it, so watches reconnect at once) or refuses
// connections; and remembers the servers across a restart.
func TestFailOver(t *testing.T) {
	a, b := newFake(t, "a"), newFake(t, "b")
	ca := caOf(a) // httptest's servers share one self-signed certificate
	state := filepath.Join(t.TempDir(), "servers.json")
	lb := start(t, a.addr(), state, ca)
	c := client(ca)
	if got := who(t, c, lb); got != "a" {
		t.Fatalf("answered by %q, want the given server a", got)
	}
	lb.SetServers([]string{b.addr(), a.addr()})
	if got := lb.Servers(); len(got) != 2 || got[0] != a.addr() {
		t.Fatalf("servers %v: want the given one first, then b", got)
	}
	if got := who(t, c, lb); got != "a" {
		t.Fatalf("answered by %q after learning b, want a still", got)
	}

	// A watch-like request open to a.
	hang, err := c.Get("https://" + lb.Address() + "/hang")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = hang.Body.Close() }()
	cut := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, hang.Body); cut <- err }()

	a.ready.Store(false)
	lb.CheckNow(context.Background())
	if lb.Current() != b.addr() {
		t.Fatalf("current %s after a is not ready, want b", lb.Current())
	}
	select {
	case err := <-cut:
		t.Logf("the open request to a ended: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("the connection to the server that is not ready was not cut")
	}
	if got := who(t, c, lb); got != "b" {
		t.Fatalf("answered by %q, want b", got)
	}

	// A server that refuses connections is skipped at once, before any
	// check: b dies, a is ready again (not yet checked) and takes them.
	a.ready.Store(true)
	b.Close()
	if got := who(t, c, lb); got != "a" {
		t.Fatalf("answered by %q with b dead, want a", got)
	}

	// Restarted, the node knows b too, though it was given only a.
	again := start(t, a.addr(), state, ca)
	if got := again.Servers(); len(got) != 2 {
		t.Fatalf("after a restart the balancer knows %v, want a and b", got)
	}
}

// With every server down, a client's connection is closed, not held.
func TestNoServer(t *testing.T) {
	a := newFake(t, "a")
	ca := caOf(a)
	addr := a.addr()
	a.Close()
	lb := start(t, addr, "", ca)
	if resp, err := client(ca).Get("https://" + lb.Address() + "/who"); err == nil {
		_ = resp.Body.Close()
		t.Fatal("a request got through with no server up")
	}
}
