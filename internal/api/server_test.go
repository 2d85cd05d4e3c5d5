package api_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// testServer is a real orch API server on a loopback port with its own
// data dir, driven through the kubeconfig it writes, as a user would.
type testServer struct {
	srv        *api.Server
	dir        string
	kubeconfig string
	config     *rest.Config
	client     kubernetes.Interface
	stop       func()
}

func startServer(t *testing.T, dir string) *testServer { return startServerOn(t, dir, 0) }

// restartOn starts a server again on dir and the address a previous one used.
func restartOn(t *testing.T, dir, addr string) *testServer {
	_, port, _ := net.SplitHostPort(addr)
	n, _ := strconv.Atoi(port)
	return startServerOn(t, dir, n)
}

func (ts *testServer) compact(t *testing.T) {
	if err := ts.srv.CompactStore(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func startServerOn(t *testing.T, dir string, port int) *testServer {
	t.Helper()
	return startServerWith(t, dir, port, nil)
}

// startServerWith is startServerOn with the server's config adjusted.
func startServerWith(t *testing.T, dir string, port int, adjust func(*api.Config)) *testServer {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	ctx, cancel := context.WithCancel(context.Background())
	kc := filepath.Join(dir, "kubeconfig.yaml")
	cfg := api.Config{
		DataDir: dir, BindAddress: "127.0.0.1", Port: port, KubeconfigPath: kc, AdvertiseAddress: "192.0.2.10",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), BookmarkInterval: 200 * time.Millisecond, CompactInterval: -1, EventTTL: 2 * time.Second,
		Version: "v0.0.0-test",
	}
	if adjust != nil {
		adjust(&cfg)
	}
	srv, err := api.New(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatalf("start server: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("server stopped with: %v", err)
		}
	}
	t.Cleanup(stop)
	restCfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatalf("load kubeconfig: %v", err)
	}
	restCfg.QPS, restCfg.Burst = -1, 0
	client := kubernetes.NewForConfigOrDie(restCfg)
	ts := &testServer{srv: srv, dir: dir, kubeconfig: kc, config: restCfg, client: client, stop: stop}
	waitReady(t, srv.URL())
	return ts
}

func waitReady(t *testing.T, url string) {
	t.Helper()
	c := insecureClient()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := c.Get(url + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("server at %s never became ready", url)
}

// TestKubeconfigFollowsBindAddress: a server bound to one address (not
// every one) writes that address into its admin kubeconfig, as k3s does:
// loopback would not answer; bound to every address, loopback.
func TestKubeconfigFollowsBindAddress(t *testing.T) {
	for _, tc := range []struct{ bind, want string }{{"127.0.0.2", "https://127.0.0.2:"}, {"0.0.0.0", "https://127.0.0.1:"}} {
		ts := startServerWith(t, "", 0, func(c *api.Config) { c.BindAddress = tc.bind })
		if !strings.HasPrefix(ts.srv.URL(), tc.want) || ts.config.Host != ts.srv.URL() {
			t.Errorf("bound to %s: URL %s, kubeconfig %s, want %s...", tc.bind, ts.srv.URL(), ts.config.Host, tc.want)
		}
		if _, err := ts.client.Discovery().ServerVersion(); err != nil {
			t.Errorf("bound to %s, the kubeconfig does not reach the server: %v", tc.bind, err)
		}
	}
}
