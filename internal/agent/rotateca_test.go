package agent_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent"
	"github.com/orch-dev/orch/internal/agent/agenttest"
	"github.com/orch-dev/orch/internal/api"
	"github.com/orch-dev/orch/internal/api/apitest"
	"github.com/orch-dev/orch/internal/api/pki"
	"github.com/orch-dev/orch/internal/joinproto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/transport"
)

// TestRotateCA is orch certificate rotate-ca on a running server with a
// running node: what trusts only the old CA (a copied admin kubeconfig,
// the node's clients) keeps working; the node takes the new bundle and
// renews its certificates from the new CA by itself; a node joins with
// the token from before the rotation, as with the new one. Dropping the
// previous CA is refused while a Ready node may not have renewed; once
// dropped, a client certificate it signed is refused (401, as for any
// unknown CA), the node still works, and restarts with its old token.
func TestRotateCA(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out the nodes' certificate checks (20 s): not in the unit tier")
	}
	fastCertificateReload()
	var dataDir string
	srv := apitest.StartWith(t, func(c *api.Config) { dataDir = c.DataDir })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	oldToken := srv.Token()
	oldCA := srv.CACert()
	start := func(ctx context.Context, dir, name, token string) chan error {
		cfg := quickNode(srv, dir, name, token, 200*time.Millisecond)
		done := make(chan error, 1)
		go func() { done <- agent.Run(ctx, cfg) }()
		return done
	}
	stopped := func(done chan error) {
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	}
	nodeDir := t.TempDir()
	tlsDir := filepath.Join(nodeDir, "agent", "tls")
	nodeCtx, stopNode := context.WithCancel(ctx)
	done := start(nodeCtx, nodeDir, "rotor", oldToken)
	defer func() { stopNode(); stopped(done) }()
	waitForNode(ctx, t, srv, "rotor")

	// An admin kubeconfig copied before: the old CA and an old client
	// certificate.
	kubeconfig, err := os.ReadFile(srv.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	restConfig, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	oldAdmin := kubernetes.NewForConfigOrDie(restConfig)

	out, err := api.RotateCA(ctx, dataDir, false, false)
	if err != nil || !out.Running || !out.Previous {
		t.Fatalf("rotate-ca: %+v, %v", out, err)
	}
	newCA := srv.CACert()
	if bytes.Equal(newCA, oldCA) || !bytes.Contains(newCA, oldCA) {
		t.Fatal("the server's bundle is not the new CA with the old one")
	}
	oldTok, _ := joinproto.ParseToken(oldToken)
	newTok, _ := joinproto.ParseToken(out.Token)
	if newTok.Secret != oldTok.Secret || newTok.CAHash == oldTok.CAHash || srv.Token() != out.Token {
		t.Errorf("token after rotation %q, before %q: want the secret kept and the new CA's hash", out.Token, oldToken)
	}
	if _, err := oldAdmin.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
		t.Errorf("a kubeconfig of the old CA, during the rotation: %v", err)
	}
	// The node takes the new CA and certificates it issued.
	block, _ := pem.Decode(newCA)
	newRoot, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		ca, _ := os.ReadFile(filepath.Join(tlsDir, "ca.crt"))
		client, err := pki.ReadCertificate(filepath.Join(tlsDir, "client.crt"))
		return err == nil && bytes.Equal(ca, newCA) && client.CheckSignatureFrom(newRoot) == nil, nil
	}); err != nil {
		t.Fatal("the node never took the new CA")
	}
	leaseRenewed(ctx, t, srv.Client, "rotor", "after the rotation")
	if _, err := srv.Client.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/rotor/proxy/metrics").DoRaw(ctx); err != nil {
		t.Errorf("the server reaches the renewed node's kubelet API: %v", err)
	}
	// Nodes join with the token of before, and with the new one.
	for name, token := range map[string]string{"old-token": oldToken, "new-token": out.Token} {
		joinCtx, stopJoin := context.WithCancel(ctx)
		joined := start(joinCtx, t.TempDir(), name, token)
		waitForNode(ctx, t, srv, name)
		stopJoin()
		stopped(joined)
	}

	// Were the two Ready, though stopped, dropping the previous CA would
	// be refused: a Ready node may still present one of its certificates.
	for _, name := range []string{"old-token", "new-token", "rotor"} {
		node, err := srv.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"}}
		if _, err := srv.Client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := api.RotateCA(ctx, dataDir, true, false); err == nil || !strings.Contains(err.Error(), "new-token") || !strings.Contains(err.Error(), "old-token") {
		t.Errorf("dropping the previous CA with unreachable Ready nodes: %v", err)
	}
	for _, name := range []string{"old-token", "new-token"} {
		if err := srv.Client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Refused too while the node's clients still present the certificate
	// they had (they load the renewed one from its file), then done.
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 40*time.Second, true, func(ctx context.Context) (bool, error) {
		out, err = api.RotateCA(ctx, dataDir, true, false)
		return err == nil, nil
	}); err != nil || !out.Running || out.Previous {
		t.Fatalf("rotate-ca --drop-previous: %+v, %v", out, err)
	}
	if bytes.Contains(srv.CACert(), oldCA) {
		t.Error("the bundle still holds the dropped CA")
	}
	if _, err := oldAdmin.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err == nil || !strings.Contains(err.Error(), "Unauthorized") {
		t.Errorf("a client certificate of the dropped CA: %v, want Unauthorized", err)
	}
	// The admin kubeconfig was written again, with a certificate of the
	// new CA.
	restConfig, err = clientcmd.BuildConfigFromFlags("", srv.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	admin := kubernetes.NewForConfigOrDie(restConfig)
	leaseRenewed(ctx, t, admin, "rotor", "after the previous CA was dropped")
	// It restarts with the token it joined with, whose CA is gone.
	stopNode()
	stopped(done)
	restartCtx, stopRestart := context.WithCancel(ctx)
	defer stopRestart() // before the deferred wait for done
	done = start(restartCtx, nodeDir, "rotor", oldToken)
	leaseRenewed(ctx, t, admin, "rotor", "restarted with its old token after the drop")
}

// leaseRenewed waits for the node's Lease to be renewed from now on.
func leaseRenewed(ctx context.Context, t *testing.T, client kubernetes.Interface, node, when string) {
	t.Helper()
	since := time.Now()
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		lease, err := client.CoordinationV1().Leases("kube-node-lease").Get(ctx, node, metav1.GetOptions{})
		return err == nil && lease.Spec.RenewTime != nil && lease.Spec.RenewTime.After(since), nil
	}); err != nil {
		t.Errorf("the node did not renew its lease %s", when)
	}
}

// TestNodeRenewsAfterForcedDrop: a node that had not renewed when the
// previous CA was dropped anyway (--force) is refused with its old
// certificates; at its next check (here, its restart) it takes the new
// CA, which the old one endorsed, and renews with its join token, as it
// joined, and works again.
func TestNodeRenewsAfterForcedDrop(t *testing.T) {
	fastCertificateReload()
	var dataDir string
	srv := apitest.StartWith(t, func(c *api.Config) { dataDir = c.DataDir })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := quickNode(srv, t.TempDir(), "late", srv.Token(), time.Hour) // it will not look again
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- agent.Run(runCtx, cfg) }()
	waitForNode(ctx, t, srv, "late")
	time.Sleep(300 * time.Millisecond) // its check at start is over
	if _, err := api.RotateCA(ctx, dataDir, false, false); err != nil {
		t.Fatal(err)
	}
	if _, err := api.RotateCA(ctx, dataDir, true, true); err != nil {
		t.Fatalf("rotate-ca --drop-previous --force: %v", err)
	}
	restConfig, err := clientcmd.BuildConfigFromFlags("", srv.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	admin := kubernetes.NewForConfigOrDie(restConfig)
	since := time.Now()
	time.Sleep(500 * time.Millisecond)
	if lease, err := admin.CoordinationV1().Leases("kube-node-lease").Get(ctx, "late", metav1.GetOptions{}); err != nil || lease.Spec.RenewTime.After(since.Add(200*time.Millisecond)) {
		t.Fatalf("the node's old certificates still renew its lease after the drop: %v", err)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	cfg.CertificateCheckInterval = 200 * time.Millisecond
	go func() { done <- agent.Run(ctx, cfg) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	}()
	leaseRenewed(ctx, t, admin, "late", "after renewing with its token")
}

// quickNode is a node of srv that renews its lease ten times a second
// and checks its certificates and the CA every.
func quickNode(srv *apitest.Server, dir, name, token string, every time.Duration) agent.Config {
	return agent.Config{
		Server: srv.URL(), Token: token, DataDir: dir, NodeName: name, NodeIPs: []string{"127.0.0.1"},
		LeaseEvery: 100 * time.Millisecond, Version: "v0.0.0-test", Logger: agenttest.Quiet,
		CertificateCheckInterval: every,
	}
}

var certificateReloadOnce sync.Once

// fastCertificateReload: a node's clients load a renewed client
// certificate from its file every five minutes (client-go's, as the
// kubelet's); these tests have not the time, as client-go lets
// integration tests say. Set once: client-go's reload goroutines of an
// earlier test outlive it and read the variable.
func fastCertificateReload() {
	certificateReloadOnce.Do(func() { transport.CertCallbackRefreshDuration = 100 * time.Millisecond })
}
