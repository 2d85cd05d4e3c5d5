package api_test

import (
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
	// The renewed kubeconfig works.
	if _, err := newKubectl(t, ts).Try("get", "ns", "default"); err != nil && !testing.Short() {
		t.Errorf("kubectl with the renewed kubeconfig: %v", err)
	}
}
