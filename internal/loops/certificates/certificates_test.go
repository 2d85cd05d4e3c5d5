package certificates

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestDeadline: requests are kept as Kubernetes' cleaner keeps them — a
// day pending, an hour after being denied, failing or issued, approved
// but not issued until the day ends, never past their certificate.
func TestDeadline(t *testing.T) {
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	decided := created.Add(10 * time.Minute)
	cond := func(typ certificatesv1.RequestConditionType) certificatesv1.CertificateSigningRequestCondition {
		return certificatesv1.CertificateSigningRequestCondition{Type: typ, Status: corev1.ConditionTrue, LastUpdateTime: metav1.NewTime(decided)}
	}
	shortCert := certificate(t, created.Add(30*time.Minute))
	longCert := certificate(t, created.Add(365*24*time.Hour))
	for _, tc := range []struct {
		name       string
		conditions []certificatesv1.CertificateSigningRequestCondition
		cert       []byte
		want       time.Time
	}{
		{"pending", nil, nil, created.Add(24 * time.Hour)},
		{"denied", []certificatesv1.CertificateSigningRequestCondition{cond(certificatesv1.CertificateDenied)}, nil, decided.Add(time.Hour)},
		{"failed", []certificatesv1.CertificateSigningRequestCondition{cond(certificatesv1.CertificateApproved), cond(certificatesv1.CertificateFailed)}, nil, decided.Add(time.Hour)},
		{"approved, not issued", []certificatesv1.CertificateSigningRequestCondition{cond(certificatesv1.CertificateApproved)}, nil, created.Add(24 * time.Hour)},
		{"issued", []certificatesv1.CertificateSigningRequestCondition{cond(certificatesv1.CertificateApproved)}, longCert, decided.Add(time.Hour)},
		{"issued, expiring sooner", []certificatesv1.CertificateSigningRequestCondition{cond(certificatesv1.CertificateApproved)}, shortCert, created.Add(30 * time.Minute)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			csr := &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(created)},
				Status: certificatesv1.CertificateSigningRequestStatus{Conditions: tc.conditions, Certificate: tc.cert}}
			if got := (&Controller{}).deadline(csr); !got.Equal(tc.want) {
				t.Errorf("deadline %s, want %s", got, tc.want)
			}
		})
	}
}

func certificate(t *testing.T, notAfter time.Time) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "x"}, NotBefore: notAfter.Add(-time.Hour), NotAfter: notAfter}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// TestSignerShapes: what each built-in signer signs, as Kubernetes'
// signer checks it.
func TestSignerShapes(t *testing.T) {
	node := &x509.CertificateRequest{Subject: pkix.Name{CommonName: "system:node:a", Organization: []string{"system:nodes"}}}
	named := &x509.CertificateRequest{Subject: node.Subject, DNSNames: []string{"a.local"}}
	ds, ke, ca, sa := certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment, certificatesv1.UsageClientAuth, certificatesv1.UsageServerAuth
	for _, tc := range []struct {
		name  string
		check func(*x509.CertificateRequest, []certificatesv1.KeyUsage) error
		req   *x509.CertificateRequest
		use   []certificatesv1.KeyUsage
		ok    bool
	}{
		{"kubelet client", validateKubeletClient, node, []certificatesv1.KeyUsage{ds, ca}, true},
		{"kubelet client with RSA usages", validateKubeletClient, node, []certificatesv1.KeyUsage{ke, ds, ca}, true},
		{"kubelet client with names", validateKubeletClient, named, []certificatesv1.KeyUsage{ds, ca}, false},
		{"kubelet client as a server", validateKubeletClient, node, []certificatesv1.KeyUsage{ds, sa}, false},
		{"kubelet client of a user", validateKubeletClient, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "alice", Organization: []string{"system:nodes"}}}, []certificatesv1.KeyUsage{ds, ca}, false},
		{"kubelet serving", validateKubeletServing, named, []certificatesv1.KeyUsage{ds, sa}, true},
		{"kubelet serving without names", validateKubeletServing, node, []certificatesv1.KeyUsage{ds, sa}, false},
		{"kubelet serving as a client", validateKubeletServing, named, []certificatesv1.KeyUsage{ds, ca}, false},
		{"api client", func(_ *x509.CertificateRequest, u []certificatesv1.KeyUsage) error { return validateClientUsages(u) }, nil, []certificatesv1.KeyUsage{ca, ds}, true},
		{"api client without client auth", func(_ *x509.CertificateRequest, u []certificatesv1.KeyUsage) error { return validateClientUsages(u) }, nil, []certificatesv1.KeyUsage{ds}, false},
		{"api client as a server", func(_ *x509.CertificateRequest, u []certificatesv1.KeyUsage) error { return validateClientUsages(u) }, nil, []certificatesv1.KeyUsage{ca, sa}, false},
	} {
		if err := tc.check(tc.req, tc.use); (err == nil) != tc.ok {
			t.Errorf("%s: %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}
