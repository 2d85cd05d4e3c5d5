// Package apitest starts a real orch API server for the tests of other
// packages: on a loopback port, with its store in a temporary directory,
// stopped when the test ends.
package apitest

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Server is a running API server and an admin client of it.
type Server struct {
	*api.Server
	// Admin is the admin kubeconfig's client config (over HTTPS).
	Admin *rest.Config
	// Client is a clientset for Admin.
	Client     kubernetes.Interface
	Kubeconfig string
}

// Start runs a server until the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartWith(t, nil)
}

// StartWith runs a server whose configuration configure may change.
func StartWith(t testing.TB, configure func(*api.Config)) *Server {
	t.Helper()
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	kc := filepath.Join(dir, "kubeconfig.yaml")
	cfg := api.Config{
		DataDir: dir, BindAddress: "127.0.0.1", KubeconfigPath: kc, AdvertiseAddress: "192.0.2.10",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Version: "v0.0.0-test",
	}
	if configure != nil {
		configure(&cfg)
	}
	srv, err := api.New(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatalf("start API server: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("API server stopped with: %v", err)
		}
	})
	admin, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	admin.QPS, admin.Burst = -1, 0
	client := kubernetes.NewForConfigOrDie(admin)
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := client.Discovery().ServerVersion()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("API server never answered: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return &Server{Server: srv, Admin: admin, Client: client, Kubeconfig: kc}
}
