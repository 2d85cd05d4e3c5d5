package agent_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent"
	"github.com/orch-dev/orch/internal/agent/agenttest"
	"github.com/orch-dev/orch/internal/api/apitest"
	"github.com/orch-dev/orch/internal/api/pki"
	"github.com/orch-dev/orch/internal/joinproto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// TestAgentJoinsAndRegisters: with the server's token, the agent gets its
// certificates, registers its Node as Kubernetes describes one, and keeps
// its Lease; until it can run pods the node says so and is not Ready.
func TestAgentJoinsAndRegisters(t *testing.T) {
	srv := apitest.Start(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- agent.Run(ctx, agent.Config{
			Server: srv.URL(), Token: srv.Token(), DataDir: dir, NodeName: "edge-1", NodeIPs: []string{"127.0.0.1"},
			Labels: map[string]string{"site": "plant-7"}, Taints: []corev1.Taint{{Key: "edge", Effect: corev1.TaintEffectPreferNoSchedule}},
			LeaseEvery: 100 * time.Millisecond, Version: "v0.0.0-test", Logger: agenttest.Quiet,
		})
	}()
	var node *corev1.Node
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := srv.Client.CoreV1().Nodes().Get(ctx, "edge-1", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		node = n
		return len(n.Status.Conditions) > 0, nil
	})
	if err != nil {
		t.Fatalf("node never registered: %v", err)
	}
	if node.Labels[corev1.LabelHostname] != "edge-1" || node.Labels[corev1.LabelOSStable] != "linux" || node.Labels["site"] != "plant-7" ||
		len(node.Spec.Taints) != 1 || node.Status.Capacity.Cpu().IsZero() || node.Status.Capacity.Memory().IsZero() ||
		node.Status.Capacity.Pods().Value() != 110 || node.Status.NodeInfo.KernelVersion == "" || node.Status.Addresses[0].Address != "127.0.0.1" {
		t.Errorf("node: %+v", node)
	}
	if os.Geteuid() == 0 && !strings.HasPrefix(node.Status.NodeInfo.ContainerRuntimeVersion, "containerd://") {
		t.Errorf("the agent's containerd did not come up: %q", node.Status.NodeInfo.ContainerRuntimeVersion)
	}
	ready := false
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			ready = true
			if c.Status != corev1.ConditionFalse || c.Reason != "ContainerRuntimeNotReady" {
				t.Errorf("a node that cannot run pods says Ready: %+v", c)
			}
		}
	}
	if !ready {
		t.Errorf("the node reports no Ready condition: %+v", node.Status.Conditions)
	}
	first := leaseRenewal(ctx, t, srv)
	time.Sleep(300 * time.Millisecond)
	if later := leaseRenewal(ctx, t, srv); !later.After(first) {
		t.Errorf("lease not renewed: %v then %v", first, later)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("agent: %v", err)
	}

	// The node's identity is Kubernetes': system:node:<name> in system:nodes.
	certPEM, err := os.ReadFile(filepath.Join(dir, "agent/tls/client.crt"))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(certPEM)
	cert, _ := x509.ParseCertificate(block.Bytes)
	if cert.Subject.CommonName != "system:node:edge-1" || cert.Subject.Organization[0] != "system:nodes" {
		t.Errorf("client certificate subject %v", cert.Subject)
	}
	// The service proxy's is kube-proxy's: system:kube-proxy, no groups
	// (in particular not system:nodes).
	proxyPEM, err := os.ReadFile(filepath.Join(dir, "agent/tls/proxy.crt"))
	if err != nil {
		t.Fatal(err)
	}
	block, _ = pem.Decode(proxyPEM)
	proxyCert, _ := x509.ParseCertificate(block.Bytes)
	if proxyCert.Subject.CommonName != "system:kube-proxy" || len(proxyCert.Subject.Organization) != 0 {
		t.Errorf("service proxy certificate subject %v", proxyCert.Subject)
	}
	if info, err := os.Stat(filepath.Join(dir, "agent/tls/proxy.key")); err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("the service proxy's key: %v %v", info, err)
	}
	if info, err := os.Stat(filepath.Join(dir, "agent/tls/client.key")); err != nil {
		t.Errorf("the client key: %v", err)
	} else if info.Mode().Perm() != 0o600 {
		t.Errorf("key mode %v", info.Mode())
	}
	// A restart reuses the credentials: no server needed for them.
	if _, err := agent.Join(context.Background(), "https://127.0.0.1:1", srv.Token(), "edge-1", nil, filepath.Join(dir, "agent/tls"), agenttest.Quiet); err != nil {
		t.Errorf("kept credentials not reused: %v", err)
	}
}

// leaseRenewal waits for the node's Lease and returns its renewal time.
func leaseRenewal(ctx context.Context, t *testing.T, srv *apitest.Server) time.Time {
	t.Helper()
	var renewed time.Time
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		lease, err := srv.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, "edge-1", metav1.GetOptions{})
		if err != nil || lease.Spec.RenewTime == nil {
			return false, nil
		}
		renewed = lease.Spec.RenewTime.Time
		return true, nil
	})
	if err != nil {
		t.Fatalf("no lease: %v", err)
	}
	return renewed
}

// TestJoinRefusals: a CA other than the token's gets no secret; a wrong
// secret is refused; a bare secret joins, trusting the CA unpinned.
func TestJoinRefusals(t *testing.T) {
	srv := apitest.Start(t)
	tok, err := joinproto.ParseToken(srv.Token())
	if err != nil {
		t.Fatal(err)
	}

	// An impostor with its own CA: the agent must not send it the secret.
	impostorCA, err := pki.LoadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var secretSent atomic.Bool
	impostor := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/cacerts" {
			_, _ = w.Write(impostorCA.CertPEM)
			return
		}
		if strings.Contains(r.Header.Get("Authorization"), tok.Secret) {
			secretSent.Store(true)
		}
		http.Error(w, "no", http.StatusForbidden)
	}))
	impostor.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	impostor.StartTLS()
	defer impostor.Close()
	_, err = agent.Join(context.Background(), impostor.URL, srv.Token(), "n1", nil, t.TempDir(), agenttest.Quiet)
	if err == nil || !strings.Contains(err.Error(), "is not the one the token names") || secretSent.Load() {
		t.Errorf("impostor CA: err %v, secret sent %v", err, secretSent.Load())
	}

	wrong := joinproto.Token{CAHash: tok.CAHash, Secret: "not-the-secret"}.String()
	if _, err := agent.Join(context.Background(), srv.URL(), wrong, "n1", nil, t.TempDir(), agenttest.Quiet); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("wrong secret: %v", err)
	}
	if _, err := agent.Join(context.Background(), srv.URL(), tok.Secret, "n1", []string{"10.0.0.7"}, t.TempDir(), agenttest.Quiet); err != nil {
		t.Errorf("bare secret: %v", err)
	}
	if _, err := agent.Join(context.Background(), srv.URL(), srv.Token(), "Bad_Name", nil, t.TempDir(), agenttest.Quiet); err == nil || !strings.Contains(err.Error(), "400") {
		t.Errorf("invalid node name: %v", err)
	}
}

// TestJoinTokenAdmitsAMachineNotAnIdentity: the token lets a machine join,
// but the first machine to join with a node name keeps it (as k3s binds
// it with a node password), until the Node is deleted; no node gets a
// certificate in the API server's names or the Services' addresses; and
// guessing is slowed per source address.
func TestJoinTokenAdmitsAMachineNotAnIdentity(t *testing.T) {
	srv := apitest.Start(t)
	ctx := context.Background()
	first, second := t.TempDir(), t.TempDir()
	if _, err := agent.Join(ctx, srv.URL(), srv.Token(), "edge-1", []string{"192.0.2.10"}, first, agenttest.Quiet); err != nil {
		t.Fatal(err)
	}
	if _, err := agent.Join(ctx, srv.URL(), srv.Token(), "edge-1", []string{"192.0.2.66"}, second, agenttest.Quiet); err == nil ||
		!strings.Contains(err.Error(), "403") || !strings.Contains(err.Error(), "already joined from another machine") {
		t.Errorf("another machine took edge-1's name: %v", err)
	}
	// The first machine joins again (its certificates gone), as after a
	// reinstall that kept its node password.
	for _, f := range []string{"client.crt", "serving.crt"} {
		if err := os.Remove(filepath.Join(first, f)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := agent.Join(ctx, srv.URL(), srv.Token(), "edge-1", []string{"192.0.2.10"}, first, agenttest.Quiet); err != nil {
		t.Errorf("the machine that owns edge-1 joins again: %v", err)
	}
	// Deleting the Node frees the name (kubectl delete node).
	if _, err := srv.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := srv.Client.CoreV1().Nodes().Delete(ctx, "edge-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := agent.Join(ctx, srv.URL(), srv.Token(), "edge-1", []string{"192.0.2.66"}, second, agenttest.Quiet)
		return err == nil, nil
	})
	if err != nil {
		t.Errorf("edge-1's name not freed by deleting its Node: %v", err)
	}

	for _, tc := range []struct {
		name    string
		address string
		want    string
	}{
		{"kubernetes", "192.0.2.1", "the API server's own name"},
		{"kubernetes.default.svc", "192.0.2.1", "the API server's own name"},
		{"web.default.svc.cluster.local", "192.0.2.1", "cluster's DNS domain"},
		{"edge-2", "10.43.0.1", "in the service CIDR"},
	} {
		if _, err := agent.Join(ctx, srv.URL(), srv.Token(), tc.name, []string{tc.address}, t.TempDir(), agenttest.Quiet); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("join as %s at %s: %v, want %q", tc.name, tc.address, err, tc.want)
		}
	}

	// A flood of guesses from one address is cut to a few a second, and a
	// wrong token learns nothing but that it is wrong.
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the attacker's
	codes := map[int]int{}
	for range 30 {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL()+"/orch/v1/join", strings.NewReader(`{"nodeName":"kubernetes"}`))
		req.Header.Set("Authorization", "Bearer guess")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		codes[resp.StatusCode]++
		if resp.StatusCode == http.StatusUnauthorized && strings.TrimSpace(string(body)) != "join refused" {
			t.Errorf("a wrong token was told %q", body)
		}
	}
	if codes[http.StatusTooManyRequests] < 15 || codes[http.StatusUnauthorized] == 0 || len(codes) != 2 {
		t.Errorf("30 quick guesses from one address: %v, want most 429", codes)
	}
}
