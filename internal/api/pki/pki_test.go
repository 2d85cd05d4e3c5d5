package pki

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"net"
	"os"
	"path/filepath"
	"testing"
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
