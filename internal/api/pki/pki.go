// Package pki creates and reuses the cluster's certificate authority, the API
// server's serving certificate, client certificates, and the join token.
//
// Everything lives under one directory (DATA/server/tls) and is created on
// first start only; later starts load it, so kubeconfigs and agents that trust
// the CA keep working. The serving certificate alone is reissued when the
// names or addresses it must cover change. A rotation of the CA keeps the
// one before trusted, and has it endorse the new one, until it is dropped.
package pki

import (
	"cmp"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/orch-dev/orch/internal/atomicfile"
	"github.com/orch-dev/orch/internal/joinproto"
)

const (
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 365 * 24 * time.Hour
	// renewBefore reissues a leaf certificate that would expire within it.
	renewBefore = 90 * 24 * time.Hour
)

// CA is the cluster's certificate authority: the certificate and key
// that sign, and, after a rotation, the CA before it, still trusted.
type CA struct {
	Cert    *x509.Certificate
	CertPEM []byte
	key     crypto.Signer
	// previous is what a rotation keeps (PEM): the CA before this one and
	// its endorsement of this one's key (a cross-signed certificate).
	previous []byte
	// chain is appended to every certificate this CA issues: the
	// endorsements of its key, so that a client still trusting only the
	// CA before verifies them through it.
	chain   []byte
	trusted []*x509.Certificate
	pool    *x509.CertPool

	verifiedMu sync.Mutex
	// verified are the client certificates verified (DER), and whether a
	// CA before this one signed them; previousUsers are who presented
	// one of those, and when last.
	verified      map[string]bool
	previousUsers map[string]time.Time
}

// Bundle is what clients trust (PEM): this CA, then what a rotation kept.
func (ca *CA) Bundle() []byte {
	return append(slices.Clip(ca.CertPEM), ca.previous...)
}

// Rotated reports whether a CA before this one is still trusted.
func (ca *CA) Rotated() bool {
	return slices.ContainsFunc(ca.trusted, func(c *x509.Certificate) bool { return !joinproto.SameKey(c, ca.Cert) })
}

// Hash is the sha256 of the CA certificate's PEM, as the join token pins it.
func (ca *CA) Hash() string {
	sum := sha256.Sum256(ca.CertPEM)
	return hex.EncodeToString(sum[:])
}

// Pool returns the pool of the trusted CAs: this one, and the one before
// it after a rotation. It is shared: not to be added to.
func (ca *CA) Pool() *x509.CertPool { return ca.pool }

// VerifyClient checks a client's certificate chain (as the TLS handshake
// received it) against the trusted CAs, and returns the client's
// certificate. A certificate once verified is not verified again by the
// same CA (only its validity period is checked): the signatures cost a
// third of a millisecond, at every request. Who still presents a
// certificate of the CA before is remembered (UsersOfPrevious).
func (ca *CA) VerifyClient(chain []*x509.Certificate) (*x509.Certificate, error) {
	if len(chain) == 0 {
		return nil, errors.New("no client certificate")
	}
	leaf := chain[0]
	now := time.Now()
	ca.verifiedMu.Lock()
	previous, known := ca.verified[string(leaf.Raw)]
	ca.verifiedMu.Unlock()
	if !known || now.Before(leaf.NotBefore) || now.After(leaf.NotAfter) {
		intermediates := x509.NewCertPool()
		for _, c := range chain[1:] {
			intermediates.AddCert(c)
		}
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: ca.pool, Intermediates: intermediates, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			return nil, err
		}
		previous = leaf.CheckSignatureFrom(ca.Cert) != nil
	}
	ca.verifiedMu.Lock()
	defer ca.verifiedMu.Unlock()
	if ca.verified == nil || len(ca.verified) >= maxVerified {
		ca.verified = map[string]bool{}
	}
	ca.verified[string(leaf.Raw)] = previous
	if previous {
		if ca.previousUsers == nil || len(ca.previousUsers) >= maxVerified {
			ca.previousUsers = map[string]time.Time{}
		}
		ca.previousUsers[leaf.Subject.CommonName] = now
	}
	return leaf, nil
}

// UsersOfPrevious are the clients that presented a certificate of the CA
// before this one within the last d.
func (ca *CA) UsersOfPrevious(d time.Duration) []string {
	ca.verifiedMu.Lock()
	defer ca.verifiedMu.Unlock()
	var users []string
	for user, at := range ca.previousUsers {
		if time.Since(at) < d {
			users = append(users, user)
		}
	}
	return users
}

// maxVerified bounds the verified client certificates remembered (a
// few hundred bytes each): more clients than that are verified again.
const maxVerified = 1024

// KeyPair is a certificate with its private key, both PEM encoded.
type KeyPair struct {
	CertPEM []byte
	KeyPEM  []byte
}

// TLS returns the pair as a tls.Certificate.
func (kp KeyPair) TLS() (tls.Certificate, error) {
	return tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
}

// Files of the CA under its directory: its certificate and key, and
// what a rotation keeps trusted.
const (
	caCertFile     = "ca.crt"
	caKeyFile      = "ca.key"
	caPreviousFile = "ca-previous.crt"
)

// LoadOrCreateCA loads dir/ca.crt and dir/ca.key, creating them on first
// use, with dir/ca-previous.crt when a rotation left one.
func LoadOrCreateCA(dir string) (*CA, error) {
	certPath, keyPath := filepath.Join(dir, caCertFile), filepath.Join(dir, caKeyFile)
	kp, err := readPair(certPath, keyPath)
	if errors.Is(err, os.ErrNotExist) {
		if kp, err = newCA(); err == nil {
			err = writePair(certPath, keyPath, kp)
		}
	}
	if err != nil {
		return nil, err
	}
	previous, err := os.ReadFile(filepath.Join(dir, caPreviousFile))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return parseCA(kp, previous)
}

// newCA makes a self-signed CA with a fresh key.
func newCA() (KeyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return KeyPair{}, fmt.Errorf("generate CA key: %w", err)
	}
	now := time.Now()
	tmpl := caTemplate(pkix.Name{CommonName: fmt.Sprintf("orch-ca@%d", now.UnixNano())}, now.Add(caValidity))
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return KeyPair{}, fmt.Errorf("self-sign CA: %w", err)
	}
	return encodePair(der, key)
}

func caTemplate(subject pkix.Name, notAfter time.Time) *x509.Certificate {
	return &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               subject,
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
}

// parseCA reads a CA pair and what a rotation kept; expired certificates
// of the latter are left out.
func parseCA(kp KeyPair, previous []byte) (*CA, error) {
	cert, key, err := parsePair(kp)
	if err != nil {
		return nil, fmt.Errorf("CA: %w", err)
	}
	if !cert.IsCA {
		return nil, errors.New("CA: certificate is not a CA")
	}
	ca := &CA{Cert: cert, CertPEM: kp.CertPEM, key: key, trusted: []*x509.Certificate{cert}}
	for _, c := range parseCertificates(previous) {
		if !c.IsCA || time.Now().After(c.NotAfter) {
			continue
		}
		block := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
		ca.previous = append(ca.previous, block...)
		ca.trusted = append(ca.trusted, c)
		if joinproto.SameKey(c, cert) && !c.Equal(cert) {
			ca.chain = append(ca.chain, block...)
		}
	}
	ca.pool = x509.NewCertPool()
	for _, c := range ca.trusted {
		ca.pool.AddCert(c)
	}
	return ca, nil
}

// parseCertificates reads the certificates of a PEM bundle, skipping
// what is not one.
func parseCertificates(bundle []byte) []*x509.Certificate {
	var out []*x509.Certificate
	for block, rest := pem.Decode(bundle); block != nil; block, rest = pem.Decode(rest) {
		if block.Type != "CERTIFICATE" {
			continue
		}
		if c, err := x509.ParseCertificate(block.Bytes); err == nil {
			out = append(out, c)
		}
	}
	return out
}

// RotateCA replaces the CA under dir with a new one, as orch certificate
// rotate-ca: the old CA endorses the new one's key (a cross-signed
// certificate) and both stay trusted, so that what trusts only the old
// one — nodes, kubeconfigs, pods — still verifies what the new one
// issues while they take the new bundle. The old files go to backup
// first.
func RotateCA(dir, backup string) (*CA, error) {
	old, err := LoadOrCreateCA(dir)
	if err != nil {
		return nil, err
	}
	if old.Rotated() {
		// One endorsement is kept: a second rotation would leave what
		// trusts only the first CA without a way to the third.
		return nil, errors.New("the CA before the current one is still trusted: once the nodes have renewed, drop it first (orch certificate rotate-ca --drop-previous)")
	}
	kp, err := newCA()
	if err != nil {
		return nil, err
	}
	next, _, err := parsePair(kp)
	if err != nil {
		return nil, err
	}
	// The endorsement ends with the old CA: no longer than it is valid.
	notAfter := next.NotAfter
	if old.Cert.NotAfter.Before(notAfter) {
		notAfter = old.Cert.NotAfter
	}
	tmpl := caTemplate(next.Subject, notAfter)
	cross, err := x509.CreateCertificate(rand.Reader, tmpl, old.Cert, next.PublicKey, old.key)
	if err != nil {
		return nil, fmt.Errorf("endorse the new CA with the old: %w", err)
	}
	if err := copyFiles(dir, backup, caCertFile, caKeyFile, caPreviousFile); err != nil {
		return nil, err
	}
	previous := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cross}), old.CertPEM...)
	if err := atomicfile.Write(filepath.Join(dir, caPreviousFile), previous, 0o644); err != nil {
		return nil, err
	}
	if err := writePair(filepath.Join(dir, caCertFile), filepath.Join(dir, caKeyFile), kp); err != nil {
		return nil, err
	}
	return parseCA(kp, previous)
}

// DropPreviousCA stops trusting the CA a rotation replaced (its file
// goes to backup first); the endorsement of the current key stays, for
// what has not taken the new bundle yet to verify the server by.
func DropPreviousCA(dir, backup string) (*CA, error) {
	ca, err := LoadOrCreateCA(dir)
	if err != nil {
		return nil, err
	}
	if !ca.Rotated() {
		return nil, errors.New("no CA before the current one is trusted: nothing to drop")
	}
	if err := copyFiles(dir, backup, caPreviousFile); err != nil {
		return nil, err
	}
	if err := atomicfile.Write(filepath.Join(dir, caPreviousFile), ca.chain, 0o644); err != nil {
		return nil, err
	}
	return LoadOrCreateCA(dir)
}

// copyFiles copies the named files of dir that exist into backup.
func copyFiles(dir, backup string, names ...string) error {
	if err := os.MkdirAll(backup, 0o700); err != nil {
		return err
	}
	for _, name := range names {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err == nil {
			err = atomicfile.Write(filepath.Join(backup, name), data, 0o600)
		}
		if err != nil {
			return fmt.Errorf("back up %s: %w", name, err)
		}
	}
	return nil
}

// ServingNames are what a serving certificate must cover.
type ServingNames struct {
	DNS []string
	IPs []net.IP
}

// LoadOrIssueServing loads the serving pair under dir with base name name,
// reissuing it when it is missing, near expiry, signed by another CA, or does
// not cover every name and address in want.
func (ca *CA) LoadOrIssueServing(dir, name string, want ServingNames) (KeyPair, error) {
	certPath, keyPath := filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if kp, err := readPair(certPath, keyPath); err == nil {
		if cert, _, err := parsePair(kp); err == nil && ca.stillGood(cert) && covers(cert, want) {
			return kp, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return KeyPair{}, err
	}
	kp, err := ca.Issue(Request{CommonName: "orch-apiserver", DNSNames: want.DNS, IPs: want.IPs, Server: true})
	if err != nil {
		return KeyPair{}, err
	}
	return kp, writePair(certPath, keyPath, kp)
}

// LoadOrIssueClient loads the client pair under dir with base name name,
// issuing it for user and groups when missing, near expiry or from another CA.
func (ca *CA) LoadOrIssueClient(dir, name, user string, groups []string) (KeyPair, error) {
	certPath, keyPath := filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if kp, err := readPair(certPath, keyPath); err == nil {
		if cert, _, err := parsePair(kp); err == nil && ca.stillGood(cert) &&
			cert.Subject.CommonName == user && slices.Equal(cert.Subject.Organization, groups) {
			return kp, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return KeyPair{}, err
	}
	kp, err := ca.Issue(Request{CommonName: user, Organization: groups, Client: true})
	if err != nil {
		return KeyPair{}, err
	}
	return kp, writePair(certPath, keyPath, kp)
}

func (ca *CA) stillGood(cert *x509.Certificate) bool {
	if time.Until(cert.NotAfter) < renewBefore {
		return false
	}
	return cert.CheckSignatureFrom(ca.Cert) == nil
}

func covers(cert *x509.Certificate, want ServingNames) bool {
	for _, name := range want.DNS {
		if !slices.Contains(cert.DNSNames, name) {
			return false
		}
	}
	for _, ip := range want.IPs {
		if !slices.ContainsFunc(cert.IPAddresses, ip.Equal) {
			return false
		}
	}
	return true
}

// Request describes a leaf certificate to issue.
type Request struct {
	CommonName   string
	Organization []string
	DNSNames     []string
	IPs          []net.IP
	Server       bool
	Client       bool
	// Validity is how long the certificate is valid (0: a year).
	Validity time.Duration
}

// Issue signs a new leaf certificate with a fresh key.
func (ca *CA) Issue(req Request) (KeyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return KeyPair{}, fmt.Errorf("generate key: %w", err)
	}
	der, err := ca.sign(req, key.Public())
	if err != nil {
		return KeyPair{}, err
	}
	kp, err := encodePair(der, key)
	kp.CertPEM = append(kp.CertPEM, ca.chain...)
	return kp, err
}

// SignCSR signs a certificate for the key in a PEM certificate request,
// with the names and usages of req (never those the request asks for): the
// requester keeps its private key, and gets only what the server grants.
func (ca *CA) SignCSR(csrPEM []byte, req Request) ([]byte, error) {
	block, _ := pem.Decode(csrPEM)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, errors.New("not a PEM certificate request")
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse certificate request: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("certificate request signature: %w", err)
	}
	der, err := ca.sign(req, csr.PublicKey)
	if err != nil {
		return nil, err
	}
	return append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), ca.chain...), nil
}

// SigningBackdate is how far before now a certificate signed for a
// CertificateSigningRequest is valid from (clocks differ), as Kubernetes'
// signers backdate; a lifetime of at least shortLived loses it at the
// end, so a certificate never lives longer than asked.
const (
	SigningBackdate = 5 * time.Minute
	shortLived      = 8 * time.Hour
)

// SignRequest signs a certificate for a verified request as Kubernetes'
// signers do: the request's subject and alternative names, the usages
// given, valid for ttl from now (backdated by SigningBackdate) but never
// past the CA's own expiry. It returns the certificate, then the CA's
// endorsements (PEM).
func (ca *CA) SignRequest(req *x509.CertificateRequest, ttl time.Duration, keyUsage x509.KeyUsage, extKeyUsage []x509.ExtKeyUsage) ([]byte, error) {
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: req.Subject,
		DNSNames: req.DNSNames, IPAddresses: req.IPAddresses, EmailAddresses: req.EmailAddresses, URIs: req.URIs,
		NotBefore: now.Add(-SigningBackdate), NotAfter: now.Add(ttl),
		KeyUsage: keyUsage, ExtKeyUsage: extKeyUsage, BasicConstraintsValid: true,
	}
	if ttl >= shortLived {
		tmpl.NotAfter = tmpl.NotAfter.Add(-SigningBackdate)
	}
	if tmpl.NotAfter.After(ca.Cert.NotAfter) {
		tmpl.NotAfter = ca.Cert.NotAfter
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, req.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("sign certificate for %q: %w", req.Subject.CommonName, err)
	}
	return append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), ca.chain...), nil
}

func (ca *CA) sign(req Request, pub crypto.PublicKey) ([]byte, error) {
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: req.CommonName, Organization: req.Organization},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(cmp.Or(req.Validity, leafValidity)),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		DNSNames:     req.DNSNames,
		IPAddresses:  req.IPs,
	}
	if req.Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if req.Client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.key)
	if err != nil {
		return nil, fmt.Errorf("sign certificate for %q: %w", req.CommonName, err)
	}
	return der, nil
}

// LoadOrCreateToken returns the join token stored at path, creating it on first
// use. A non-empty secret given by the operator (--token) is used as the
// secret, whether passed bare or as a full K10 token.
func (ca *CA) LoadOrCreateToken(path, secret string) (string, error) {
	if secret == "" {
		// The secret outlives a rotation of the CA; the hash follows it.
		if b, err := os.ReadFile(path); err == nil {
			if tok, err := joinproto.ParseToken(strings.TrimSpace(string(b))); err == nil && tok.CAHash == ca.Hash() {
				return tok.String(), nil
			} else if err == nil && tok.CAHash != "" {
				secret = tok.Secret
			}
		} else if !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("read token: %w", err)
		}
	}
	if secret == "" {
		var buf [16]byte
		if _, err := rand.Read(buf[:]); err != nil {
			return "", fmt.Errorf("generate token: %w", err)
		}
		secret = hex.EncodeToString(buf[:])
	} else if tok, err := joinproto.ParseToken(secret); err == nil {
		secret = tok.Secret
	}
	tok := joinproto.Token{CAHash: ca.Hash(), Secret: secret}
	if err := atomicfile.Write(path, []byte(tok.String()+"\n"), 0o600); err != nil {
		return "", err
	}
	return tok.String(), nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		// crypto/rand never fails on Linux; a fixed serial would still be valid.
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}

func encodePair(der []byte, key *ecdsa.PrivateKey) (KeyPair, error) {
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return KeyPair{}, fmt.Errorf("marshal key: %w", err)
	}
	return KeyPair{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

func parsePair(kp KeyPair) (*x509.Certificate, crypto.Signer, error) {
	pair, err := tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("parse key pair: %w", err)
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, nil, errors.New("private key cannot sign")
	}
	return pair.Leaf, signer, nil
}

// ReadCertificate reads the first certificate of the PEM file at path.
func ReadCertificate(path string) (*x509.Certificate, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return x509.ParseCertificate(block.Bytes)
}

func readPair(certPath, keyPath string) (KeyPair, error) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return KeyPair{}, err
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return KeyPair{}, err
	}
	return KeyPair{CertPEM: certPEM, KeyPEM: keyPEM}, nil
}

func writePair(certPath, keyPath string, kp KeyPair) error {
	if err := atomicfile.Write(keyPath, kp.KeyPEM, 0o600); err != nil {
		return err
	}
	return atomicfile.Write(certPath, kp.CertPEM, 0o644)
}
