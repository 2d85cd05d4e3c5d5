package api_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api"
	"github.com/orch-dev/orch/internal/api/pki"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// TestCertificatesRenewWhileServing: a certificate that comes within 90
// days of expiry while the server runs is reissued without a restart:
// the serving certificate is presented from the next handshake on, and
// the admin kubeconfig is written again with a new client certificate.
func TestCertificatesRenewWhileServing(t *testing.T) {
	dir := t.TempDir()
	ts := startServerWith(t, dir, 0, func(c *api.Config) { c.CertificateCheckInterval = 100 * time.Millisecond })
	tlsDir := filepath.Join(dir, "server", "tls")
	ca, err := pki.LoadOrCreateCA(tlsDir)
	if err != nil {
		t.Fatal(err)
	}
	presented := func() *x509.Certificate {
		conn, err := tls.Dial("tcp", strings.TrimPrefix(ts.srv.URL(), "https://"), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the certificate is what is looked at
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = conn.Close() }()
		return conn.ConnectionState().PeerCertificates[0]
	}
	first := presented()
	// As if a year had passed: the pairs on disk have an hour left.
	shortLived := func(name string, req pki.Request) {
		req.Validity = time.Hour
		kp, err := ca.Issue(req)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tlsDir, name+".key"), kp.KeyPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tlsDir, name+".crt"), kp.CertPEM, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	shortLived("serving", pki.Request{CommonName: "orch-apiserver", DNSNames: first.DNSNames, IPs: first.IPAddresses, Server: true})
	kubeconfig, _ := os.ReadFile(ts.kubeconfig)
	shortLived("client-admin", pki.Request{CommonName: "system:admin", Organization: []string{"system:masters"}, Client: true})
	shortLived("client-kubelet", pki.Request{CommonName: "system:kube-apiserver", Organization: []string{"system:masters"}, Client: true})

	deadline := time.Now().Add(10 * time.Second)
	for {
		now := presented()
		onDisk, _ := os.ReadFile(filepath.Join(tlsDir, "serving.crt"))
		block, _ := pem.Decode(onDisk)
		renewed := block != nil && !now.Equal(first) && time.Until(now.NotAfter) > 300*24*time.Hour
		if renewed {
			disk, err := x509.ParseCertificate(block.Bytes)
			if err != nil || !disk.Equal(now) {
				t.Errorf("the presented certificate is not the one on disk: %v", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the serving certificate was not renewed: presented until %s", now.NotAfter)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for {
		again, _ := os.ReadFile(ts.kubeconfig)
		if string(again) != string(kubeconfig) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the admin kubeconfig was not written again")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The certificate the server presents to kubelets too.
	for {
		if c := certFile(t, filepath.Join(tlsDir, "client-kubelet.crt")); time.Until(c.NotAfter) > 300*24*time.Hour {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the kubelet client certificate was not renewed")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The renewed kubeconfig works.
	if _, err := newKubectl(t, ts).Try("get", "ns", "default"); err != nil && !testing.Short() {
		t.Errorf("kubectl with the renewed kubeconfig: %v", err)
	}
}

func certFile(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	c, err := pki.ReadCertificate(path)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestCertificateRotate: orch certificate rotate on a running server
// issues its serving, admin and kubelet client certificates again, in
// force at once (the new serving certificate presented, the admin
// kubeconfig rewritten and working), the old ones kept in a backup; on a
// stopped server it moves them aside and the next start issues new ones.
func TestCertificateRotate(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	ts := startServerWith(t, dir, 0, nil)
	tlsDir := filepath.Join(dir, "server", "tls")
	before := map[string]*x509.Certificate{}
	for _, name := range []string{"serving", "client-admin", "client-kubelet"} {
		before[name] = certFile(t, filepath.Join(tlsDir, name+".crt"))
	}
	caBefore := certFile(t, filepath.Join(tlsDir, "ca.crt"))
	out, err := api.RotateCertificates(ctx, dir)
	if err != nil || !out.Running {
		t.Fatalf("rotate: %+v, %v", out, err)
	}
	for name, old := range before {
		now := certFile(t, filepath.Join(tlsDir, name+".crt"))
		if now.SerialNumber.Cmp(old.SerialNumber) == 0 || now.Subject.String() != old.Subject.String() {
			t.Errorf("%s: serial %v (was %v), subject %v (was %v)", name, now.SerialNumber, old.SerialNumber, now.Subject, old.Subject)
		}
		if kept := certFile(t, filepath.Join(out.Backup, name+".crt")); !kept.Equal(old) {
			t.Errorf("the backup of %s is not the old certificate", name)
		}
	}
	if ca := certFile(t, filepath.Join(tlsDir, "ca.crt")); !ca.Equal(caBefore) {
		t.Error("the CA changed")
	}
	conn, err := tls.Dial("tcp", strings.TrimPrefix(ts.srv.URL(), "https://"), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the certificate is what is looked at
	if err != nil {
		t.Fatal(err)
	}
	presented := conn.ConnectionState().PeerCertificates[0]
	_ = conn.Close()
	if presented.SerialNumber.Cmp(before["serving"].SerialNumber) == 0 {
		t.Error("the server still presents the old serving certificate")
	}
	kubeconfig, err := clientcmd.BuildConfigFromFlags("", ts.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kubernetes.NewForConfigOrDie(kubeconfig).CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
		t.Errorf("the rewritten admin kubeconfig: %v", err)
	}
	block, _ := pem.Decode(kubeconfig.CertData)
	if c, _ := x509.ParseCertificate(block.Bytes); c == nil || c.SerialNumber.Cmp(before["client-admin"].SerialNumber) == 0 {
		t.Error("the admin kubeconfig still holds the old certificate")
	}

	// Stopped: moved aside, issued at the next start.
	addr := strings.TrimPrefix(ts.srv.URL(), "https://")
	ts.stop()
	running := certFile(t, filepath.Join(tlsDir, "serving.crt"))
	out, err = api.RotateCertificates(ctx, dir)
	if err != nil || out.Running {
		t.Fatalf("rotate with no server: %+v, %v", out, err)
	}
	if _, err := os.Stat(filepath.Join(tlsDir, "serving.crt")); !os.IsNotExist(err) {
		t.Errorf("the serving certificate is still in place: %v", err)
	}
	restartOn(t, dir, addr)
	if c := certFile(t, filepath.Join(tlsDir, "serving.crt")); c.SerialNumber.Cmp(running.SerialNumber) == 0 {
		t.Error("the restarted server kept the old serving certificate")
	}
}
