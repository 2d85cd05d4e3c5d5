package pki

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestCAPersistsAndTokenPinsIt(t *testing.T) {
	dir := t.TempDir()
	ca, err := LoadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	again, err := LoadOrCreateCA(dir)
	if err != nil || !again.Cert.Equal(ca.Cert) {
		t.Fatalf("second load made a new CA: %v", err)
	}
	sum := sha256.Sum256(ca.CertPEM)
	if ca.Hash() != hex.EncodeToString(sum[:]) {
		t.Errorf("hash %s is not the sha256 of the CA PEM", ca.Hash())
	}
	path := filepath.Join(dir, "token")
	tok, err := ca.LoadOrCreateToken(path, "")
	if err != nil {
		t.Fatal(err)
	}
	if same, _ := ca.LoadOrCreateToken(path, ""); same != tok {
		t.Errorf("token changed across loads: %s then %s", tok, same)
	}
	if info, _ := os.Stat(path); info.Mode().Perm() != 0o600 {
		t.Errorf("token file mode %v", info.Mode())
	}
	given, err := ca.LoadOrCreateToken(path, "operator-secret")
	if err != nil || given != "K10"+ca.Hash()+"::server:operator-secret" {
		t.Errorf("--token secret: %s %v", given, err)
	}
}

func TestServingCertReissuedWhenNamesChange(t *testing.T) {
	dir := t.TempDir()
	ca, err := LoadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	names := ServingNames{DNS: []string{"localhost"}, IPs: []net.IP{net.ParseIP("127.0.0.1")}}
	first, err := ca.LoadOrIssueServing(dir, "serving", names)
	if err != nil {
		t.Fatal(err)
	}
	if same, _ := ca.LoadOrIssueServing(dir, "serving", names); string(same.CertPEM) != string(first.CertPEM) {
		t.Error("unchanged names reissued the certificate")
	}
	names.IPs = append(names.IPs, net.ParseIP("192.0.2.7"))
	next, err := ca.LoadOrIssueServing(dir, "serving", names)
	if err != nil {
		t.Fatal(err)
	}
	cert, _, err := parsePair(next)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: "192.0.2.7"}); err != nil {
		t.Errorf("new address not covered: %v", err)
	}
	client, err := ca.LoadOrIssueClient(dir, "admin", "system:admin", []string{"system:masters"})
	if err != nil {
		t.Fatal(err)
	}
	cc, _, _ := parsePair(client)
	if cc.Subject.CommonName != "system:admin" || cc.Subject.Organization[0] != "system:masters" ||
		cc.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth {
		t.Errorf("client cert subject %v usage %v", cc.Subject, cc.ExtKeyUsage)
	}
}

// TestRotateCA: a rotated CA issues certificates that a client trusting
// only the old CA still verifies (the chain carries the old CA's
// endorsement of the new key), while certificates of the old CA are
// still accepted; once the previous CA is dropped they are not, and the
// new CA's certificates still verify through the endorsement. The join
// token keeps its secret and names the new CA.
func TestRotateCA(t *testing.T) {
	dir := t.TempDir()
	old, err := LoadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	tokenPath := filepath.Join(dir, "token")
	tok, err := old.LoadOrCreateToken(tokenPath, "")
	if err != nil {
		t.Fatal(err)
	}
	oldClient, err := old.Issue(Request{CommonName: "alice", Client: true})
	if err != nil {
		t.Fatal(err)
	}
	ca, err := RotateCA(dir, filepath.Join(dir, "backup"))
	if err != nil {
		t.Fatal(err)
	}
	if ca.Cert.Equal(old.Cert) || !ca.Rotated() {
		t.Fatal("no new CA")
	}
	if reloaded, err := LoadOrCreateCA(dir); err != nil || !reloaded.Cert.Equal(ca.Cert) || string(reloaded.Bundle()) != string(ca.Bundle()) {
		t.Fatalf("the rotated CA does not load back: %v", err)
	}
	if backed, err := os.ReadFile(filepath.Join(dir, "backup", "ca.key")); err != nil || len(backed) == 0 {
		t.Errorf("the old key is not in the backup: %v", err)
	}
	if _, err := RotateCA(dir, filepath.Join(dir, "backup-again")); err == nil || !strings.Contains(err.Error(), "drop it first") {
		t.Errorf("a second rotation before the first was dropped: %v", err)
	}
	newTok, err := ca.LoadOrCreateToken(tokenPath, "")
	if err != nil {
		t.Fatal(err)
	}
	if oldSecret, newSecret := tok[strings.LastIndex(tok, ":"):], newTok[strings.LastIndex(newTok, ":"):]; oldSecret != newSecret || !strings.HasPrefix(newTok, "K10"+ca.Hash()) {
		t.Errorf("token after rotation %q (before %q): want the same secret, the new CA's hash", newTok, tok)
	}

	serving, err := ca.Issue(Request{CommonName: "orch-apiserver", DNSNames: []string{"localhost"}, Server: true})
	if err != nil {
		t.Fatal(err)
	}
	verify := func(kp KeyPair, roots *x509.CertPool, usage x509.ExtKeyUsage) error {
		pair, err := kp.TLS()
		if err != nil {
			return err
		}
		inter := x509.NewCertPool()
		for _, der := range pair.Certificate[1:] {
			c, _ := x509.ParseCertificate(der)
			inter.AddCert(c)
		}
		leaf, _ := x509.ParseCertificate(pair.Certificate[0])
		_, err = leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}})
		return err
	}
	newOnly := x509.NewCertPool()
	newOnly.AddCert(ca.Cert)
	for name, roots := range map[string]*x509.CertPool{"the old CA alone": old.Pool(), "the new CA alone": newOnly, "the bundle": ca.Pool()} {
		if err := verify(serving, roots, x509.ExtKeyUsageServerAuth); err != nil {
			t.Errorf("a certificate of the new CA, checked with %s: %v", name, err)
		}
	}
	if err := verify(oldClient, ca.Pool(), x509.ExtKeyUsageClientAuth); err != nil {
		t.Errorf("a client certificate of the old CA is refused during the rotation: %v", err)
	}

	dropped, err := DropPreviousCA(dir, filepath.Join(dir, "backup2"))
	if err != nil {
		t.Fatal(err)
	}
	if dropped.Rotated() || !dropped.Cert.Equal(ca.Cert) {
		t.Error("the previous CA is still trusted after dropping it")
	}
	if err := verify(oldClient, dropped.Pool(), x509.ExtKeyUsageClientAuth); err == nil {
		t.Error("a client certificate of the dropped CA is still accepted")
	}
	// As the API server checks them, at each request: remembered by the
	// CA that verified it, not by the next.
	oldPair, _ := oldClient.TLS()
	oldCert, _ := x509.ParseCertificate(oldPair.Certificate[0])
	for range 2 {
		if _, err := ca.VerifyClient([]*x509.Certificate{oldCert}); err != nil {
			t.Errorf("during the rotation, a client certificate of the old CA: %v", err)
		}
	}
	newClient, err := ca.Issue(Request{CommonName: "bob", Client: true})
	if err != nil {
		t.Fatal(err)
	}
	newPair, _ := newClient.TLS()
	newCert, _ := x509.ParseCertificate(newPair.Certificate[0])
	if _, err := ca.VerifyClient([]*x509.Certificate{newCert}); err != nil {
		t.Errorf("a client certificate of the new CA: %v", err)
	}
	if users := ca.UsersOfPrevious(time.Minute); len(users) != 1 || users[0] != "alice" {
		t.Errorf("clients seen with a certificate of the previous CA: %v, want alice", users)
	}
	if _, err := dropped.VerifyClient([]*x509.Certificate{oldCert}); err == nil {
		t.Error("after the drop, a client certificate of the old CA is accepted")
	}
	if err := verify(serving, old.Pool(), x509.ExtKeyUsageServerAuth); err != nil {
		t.Errorf("a client trusting only the old CA no longer verifies the server: %v", err)
	}
	if _, err := DropPreviousCA(dir, filepath.Join(dir, "backup3")); err == nil {
		t.Error("dropping twice: no error")
	}
	if _, err := RotateCA(dir, filepath.Join(dir, "backup4")); err != nil {
		t.Errorf("rotating again after the drop: %v", err)
	}
}

// BenchmarkVerifyClient is what the API server spends on each request
// with a client certificate, checked against the CAs of the moment as
// kube-apiserver checks it: a rotated CA's chain (leaf and endorsement),
// verified once, then known (first), or verified each time (another
// CA object each time, as at every rotation: uncached).
func BenchmarkVerifyClient(b *testing.B) {
	dir := b.TempDir()
	if _, err := LoadOrCreateCA(dir); err != nil {
		b.Fatal(err)
	}
	ca, err := RotateCA(dir, filepath.Join(dir, "backup"))
	if err != nil {
		b.Fatal(err)
	}
	kp, err := ca.Issue(Request{CommonName: "system:node:n", Organization: []string{"system:nodes"}, Client: true})
	if err != nil {
		b.Fatal(err)
	}
	pair, err := kp.TLS()
	if err != nil {
		b.Fatal(err)
	}
	var chain []*x509.Certificate
	for _, der := range pair.Certificate {
		c, _ := x509.ParseCertificate(der)
		chain = append(chain, c)
	}
	// Checks enough per iteration for make bench's single iteration.
	const checks = 200
	if _, err := ca.VerifyClient(chain); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		fresh bool
	}{{"known", false}, {"uncached", true}} {
		b.Run(c.name, func(b *testing.B) {
			var spent time.Duration
			for b.Loop() {
				start := time.Now()
				for range checks {
					verifier := ca
					if c.fresh {
						verifier = &CA{Cert: ca.Cert, pool: ca.pool}
					}
					if _, err := verifier.VerifyClient(chain); err != nil {
						b.Fatal(err)
					}
				}
				spent += time.Since(start)
			}
			b.ReportMetric(float64(spent.Nanoseconds())/1e3/float64(b.N*checks), "µs/check")
		})
	}
}
