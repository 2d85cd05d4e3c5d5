package api_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/orch-dev/orch/internal/api"
	"github.com/orch-dev/orch/internal/joinproto"
	"github.com/orch-dev/orch/internal/porttest"
)

// embedded makes a server an etcd member on loopback ports of its own.
func embedded(t *testing.T, join, token string) func(*api.Config) {
	client, peer := porttest.Free(t), porttest.Free(t)
	return func(c *api.Config) {
		c.AdvertiseAddress = "127.0.0.1"
		c.Embedded = &api.Embedded{Join: join, ServerToken: token, ClientPort: client, PeerPort: peer, EtcdLogLevel: "panic"}
		if join == "" {
			c.Token = token
		}
	}
}

// TestEmbeddedEtcd: a server made with --cluster-init is joined by another
// presenting the server token, never the agents' token; joins that cannot
// work are refused before anything changes, and a member restarts as one.
func TestEmbeddedEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("runs etcd members")
	}
	const agentSecret = "embedded-agents-secret-0123456789"
	first := startServerWith(t, "", 0, embedded(t, "", agentSecret))
	url := first.srv.URL()
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(first.dir, "server", name))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	serverToken, agentToken := read("server-token"), read("token")
	tok, err := joinproto.ParseToken(serverToken)
	if err != nil || tok.CAHash == "" || tok.Secret == agentSecret {
		t.Fatalf("server token %q: %v", serverToken, err)
	}
	plain := startServerWith(t, "", 0, nil)
	plainToken, err := os.ReadFile(filepath.Join(plain.dir, "server", "token"))
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, tc := range []struct {
		name, join, token, want string
		adjust                  func(*api.Config)
	}{
		{"the agents' token", url, agentToken, "agents' join token", nil},
		{"a bare secret", url, tok.Secret, "whole server token", nil},
		{"a wrong secret", url, joinproto.Token{CAHash: tok.CAHash, Secret: "guessed"}.String(), "wrong server token", nil},
		{"another CA", url, joinproto.Token{CAHash: strings.Repeat("ab", 32), Secret: tok.Secret}.String(), "not a server of the cluster", nil},
		{"other networks", url, serverToken, "networks differ", func(c *api.Config) { c.ServiceCIDR = "10.99.0.0/16" }},
		// The only token a server alone has.
		{"a server alone", plain.srv.URL(), strings.TrimSpace(string(plainToken)), "started without --cluster-init", nil},
	} {
		dir := t.TempDir()
		cfg := api.Config{DataDir: dir, BindAddress: "127.0.0.1", KubeconfigPath: filepath.Join(dir, "kubeconfig.yaml"),
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), CompactInterval: -1, Version: "v0.0.0-test"}
		embedded(t, tc.join, tc.token)(&cfg)
		if tc.adjust != nil {
			tc.adjust(&cfg)
		}
		srv, err := api.New(ctx, cfg)
		if err == nil {
			_ = srv
			t.Fatalf("%s: joined", tc.name)
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
		if _, err := os.Stat(filepath.Join(dir, "server", "db", "etcd", "member")); err == nil {
			t.Errorf("%s: an etcd member was made", tc.name)
		}
	}

	dir := t.TempDir()
	join := embedded(t, url, serverToken)
	second := startServerWith(t, dir, 0, join)
	if _, err := second.client.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "via-second"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := first.client.CoreV1().ConfigMaps("default").Get(ctx, "via-second", metav1.GetOptions{}); err != nil {
		t.Fatalf("the first does not see what the second wrote: %v", err)
	}
	// The joiner took the cluster's identity: the agents' token and the
	// server token are the first's.
	for _, name := range []string{"token", "server-token", "tls/ca.crt", "tls/etcd/peer-ca/ca.crt"} {
		a, _ := os.ReadFile(filepath.Join(first.dir, "server", name))
		b, _ := os.ReadFile(filepath.Join(dir, "server", name))
		if len(a) == 0 || string(a) != string(b) {
			t.Errorf("%s differs between the servers", name)
		}
	}
	// Restarted, the second is the member it was (--server is not used
	// again), with its data.
	second.stop()
	again := startServerWith(t, dir, 0, join)
	if _, err := again.client.CoreV1().ConfigMaps("default").Get(ctx, "via-second", metav1.GetOptions{}); err != nil {
		t.Fatalf("after the second's restart: %v", err)
	}
	again.stop()

	// With its agent, the second names its member on its Node: deleting
	// the Node removes the member (kubectl delete node), and the server
	// stops, to join anew only when told where.
	cfg := api.Config{DataDir: dir, BindAddress: "127.0.0.1", KubeconfigPath: filepath.Join(dir, "kubeconfig.yaml"),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), CompactInterval: -1, Version: "v0.0.0-test",
		NodeName: "second-node", MemberCheckInterval: 200 * time.Millisecond}
	join(&cfg)
	srv, err := api.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	stopped := make(chan error, 1)
	go func() { stopped <- srv.Run(runCtx) }()
	nodes := first.client.CoreV1().Nodes()
	if _, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "second-node"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, err := nodes.Get(ctx, "second-node", metav1.GetOptions{})
		if err == nil && n.Annotations["etcd.orch.dev/member"] != "" && slices.Contains(n.Finalizers, "etcd.orch.dev/member") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server's Node does not name its member: %+v %v", n, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := nodes.Delete(ctx, "second-node", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-stopped:
		if err == nil || !strings.Contains(err.Error(), "removed from the cluster") {
			t.Fatalf("the removed server stopped with %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the server whose Node was deleted still runs")
	}
	for {
		if _, err := nodes.Get(ctx, "second-node", metav1.GetOptions{}); apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline.Add(time.Minute)) {
			t.Fatal("the deleted Node stays: its finalizer was not released")
		}
		time.Sleep(100 * time.Millisecond)
	}
	alone := cfg
	alone.Embedded = &api.Embedded{ClientPort: cfg.Embedded.ClientPort, PeerPort: cfg.Embedded.PeerPort, EtcdLogLevel: "panic"}
	if _, err := api.New(ctx, alone); err == nil || !strings.Contains(err.Error(), "--server") {
		t.Fatalf("a removed server restarted without --server: %v", err)
	}
	rejoined := startServerWith(t, dir, 0, join)
	if _, err := rejoined.client.CoreV1().ConfigMaps("default").Get(ctx, "via-second", metav1.GetOptions{}); err != nil {
		t.Fatalf("after rejoining: %v", err)
	}
}
