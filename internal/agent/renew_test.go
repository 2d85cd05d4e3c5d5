package agent_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent"
	"github.com/orch-dev/orch/internal/agent/agenttest"
	"github.com/orch-dev/orch/internal/api"
	"github.com/orch-dev/orch/internal/api/apitest"
	"github.com/orch-dev/orch/internal/api/pki"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

func certOf(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	c, err := pki.ReadCertificate(path)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestNodeRenewsItsCertificates: a running agent whose certificates come
// within the renewal window gets new ones from the server with its
// current client certificate (the join token was rotated meanwhile, so
// the token could not have been used), saves them, and its kubelet API
// presents the new serving certificate at once; the new client
// certificate is accepted as the same node. A node's certificate renews
// only that node's certificates, and the service proxy's renews nothing.
func TestNodeRenewsItsCertificates(t *testing.T) {
	var dataDir string
	srv := apitest.StartWith(t, func(c *api.Config) { dataDir = c.DataDir })
	dir := t.TempDir()
	tlsDir := filepath.Join(dir, "agent", "tls")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := agent.Config{
		Server: srv.URL(), Token: srv.Token(), DataDir: dir, NodeName: "renewer", NodeIPs: []string{"127.0.0.1"},
		LeaseEvery: 100 * time.Millisecond, Version: "v0.0.0-test", Logger: agenttest.Quiet,
		CertificateCheckInterval: 200 * time.Millisecond,
	}
	// First a run that keeps its certificates (a year's validity is far
	// from the 90 days' window)...
	done := make(chan error, 1)
	runCtx, stopRun := context.WithCancel(ctx)
	go func() { done <- agent.Run(runCtx, cfg) }()
	waitForNode(ctx, t, srv, "renewer")
	first := certOf(t, filepath.Join(tlsDir, "client.crt"))
	time.Sleep(600 * time.Millisecond)
	if again := certOf(t, filepath.Join(tlsDir, "client.crt")); again.SerialNumber.Cmp(first.SerialNumber) != 0 {
		t.Fatal("certificates a year from expiry were renewed")
	}
	stopRun()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// ...then the token is rotated, and a run whose window is longer than
	// their validity renews them while it runs.
	if _, err := api.RotateToken(ctx, dataDir, ""); err != nil {
		t.Fatal(err)
	}
	cfg.CertificateRenewBefore = 400 * 24 * time.Hour
	go func() { done <- agent.Run(ctx, cfg) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	}()
	var renewed *x509.Certificate
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		renewed = certOf(t, filepath.Join(tlsDir, "client.crt"))
		return renewed.SerialNumber.Cmp(first.SerialNumber) != 0, nil
	}); err != nil {
		t.Fatal("the node's client certificate was never renewed")
	}
	if renewed.Subject.CommonName != "system:node:renewer" || renewed.Subject.Organization[0] != "system:nodes" {
		t.Errorf("renewed client certificate: %v", renewed.Subject)
	}
	// The kubelet API presents a renewed serving certificate.
	node, err := srv.Client.CoreV1().Nodes().Get(ctx, "renewer", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	port := node.Status.DaemonEndpoints.KubeletEndpoint.Port
	firstServing := certOf(t, filepath.Join(tlsDir, "serving.crt"))
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		conn, err := tls.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only reading the presented certificate
		if err != nil {
			return false, nil
		}
		defer func() { _ = conn.Close() }()
		presented := conn.ConnectionState().PeerCertificates[0]
		return presented.SerialNumber.Cmp(firstServing.SerialNumber) != 0 && presented.Subject.CommonName == "renewer", nil
	}); err != nil {
		t.Error("the kubelet API never presented a renewed serving certificate")
	}
	// The renewed client certificate is the node's identity.
	var client kubernetes.Interface
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		certPEM, _ := os.ReadFile(filepath.Join(tlsDir, "client.crt"))
		keyPEM, _ := os.ReadFile(filepath.Join(tlsDir, "client.key"))
		if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
			return false, nil // read between the two files' replacement
		}
		client = kubernetes.NewForConfigOrDie(&rest.Config{Host: srv.URL(), TLSClientConfig: rest.TLSClientConfig{CAData: srv.CACert(), CertData: certPEM, KeyData: keyPEM}})
		_, err := client.CoreV1().Nodes().Get(ctx, "renewer", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		t.Error("the renewed client certificate does not read the node's own Node")
	}

	// Refusals: renewing another node, renewing with the proxy's identity.
	creds := &agent.Credentials{CA: srv.CACert()}
	for _, f := range []struct {
		dst  *[]byte
		name string
	}{{&creds.ClientCert, "client.crt"}, {&creds.ClientKey, "client.key"}, {&creds.ServingCert, "serving.crt"}, {&creds.ServingKey, "serving.key"}} {
		data, err := os.ReadFile(filepath.Join(tlsDir, f.name))
		if err != nil {
			t.Fatal(err)
		}
		*f.dst = bytes.Clone(data)
	}
	if _, err := agent.Renew(ctx, srv.URL(), creds, creds.CA, "someone-else", nil, t.TempDir(), ""); err == nil || !strings.Contains(err.Error(), `node "renewer" may renew its own certificates only`) {
		t.Errorf("renewing another node's certificates: %v", err)
	}
	proxy := *creds
	proxy.ClientCert, _ = os.ReadFile(filepath.Join(tlsDir, "proxy.crt"))
	proxy.ClientKey, _ = os.ReadFile(filepath.Join(tlsDir, "proxy.key"))
	if _, err := agent.Renew(ctx, srv.URL(), &proxy, proxy.CA, "renewer", nil, t.TempDir(), ""); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("renewing with the service proxy's certificate: %v", err)
	}
}

func waitForNode(ctx context.Context, t *testing.T, srv *apitest.Server, name string) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := srv.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatalf("node %s never registered", name)
	}
}
