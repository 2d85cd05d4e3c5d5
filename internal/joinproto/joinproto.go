// Package joinproto is what an agent and the server both speak when a
// machine joins: the join token's format, the request and answer on the
// wire, the certificate request the agent makes for the key it keeps, and
// the user name a node's certificate carries. The agent imports it instead
// of the API server's packages.
package joinproto

import (
	"bytes"
	"context"
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
	"io"
	"net/http"
	"strings"
	"time"
)

// NodeUserPrefix starts the user name of a node's certificate
// (system:node:<name>), as in Kubernetes.
const NodeUserPrefix = "system:node:"

// ProxyUser is the user name of the certificate a node's service proxy
// and pod network use, as kube-proxy's (system:kube-proxy): they read
// every Service, EndpointSlice and Node, which a node's own identity may
// not.
const ProxyUser = "system:kube-proxy"

// Path is where the server takes join requests.
const Path = "/orch/v1/join"

// Request is what an agent sends, with the join secret as a bearer token.
type Request struct {
	NodeName string `json:"nodeName"`
	// NodePassword is the machine's own secret: the first join with a
	// node name binds the name to it, and later joins must present it.
	NodePassword string `json:"nodePassword"`
	// Addresses are the node's IPs, for its :10250 serving certificate.
	Addresses []string `json:"addresses"`
	// ClientCSR and ServingCSR are PEM certificate requests for the keys
	// the agent made and keeps.
	ClientCSR  string `json:"clientCSR"`
	ServingCSR string `json:"servingCSR"`
	// ProxyCSR is for the node's service proxy's client certificate
	// (ProxyUser).
	ProxyCSR string `json:"proxyCSR,omitempty"`
}

// Response carries the node's certificates and the cluster CA.
type Response struct {
	CA          string `json:"ca"`
	ClientCert  string `json:"clientCert"`
	ServingCert string `json:"servingCert"`
	ProxyCert   string `json:"proxyCert,omitempty"`
}

// Token is a join token: K10<sha256 of CA PEM>::server:<secret>, or a bare
// secret that pins no CA.
type Token struct {
	CAHash string
	Secret string
}

func (t Token) String() string {
	if t.CAHash == "" {
		return t.Secret
	}
	return "K10" + t.CAHash + "::server:" + t.Secret
}

// ParseToken splits a full or short token.
func ParseToken(s string) (Token, error) {
	if s == "" {
		return Token{}, errors.New("empty token")
	}
	if !strings.HasPrefix(s, "K10") {
		return Token{Secret: s}, nil
	}
	hash, secret, ok := strings.Cut(strings.TrimPrefix(s, "K10"), "::")
	if !ok {
		return Token{}, errors.New("token starts with K10 but has no '::' before its secret")
	}
	if len(hash) != sha256.Size*2 {
		return Token{}, fmt.Errorf("token CA hash has %d characters, want %d", len(hash), sha256.Size*2)
	}
	if _, err := hex.DecodeString(hash); err != nil {
		return Token{}, fmt.Errorf("token CA hash is not hex: %w", err)
	}
	if _, rest, ok := strings.Cut(secret, ":"); ok {
		secret = rest
	}
	if secret == "" {
		return Token{}, errors.New("token has an empty secret")
	}
	return Token{CAHash: hash, Secret: secret}, nil
}

// NewKeyAndCSR makes a private key and a certificate request for it, both
// PEM: what an agent keeps and what it sends to be signed.
func NewKeyAndCSR(commonName string) (keyPEM, csrPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate key: %w", err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: commonName}}, key)
	if err != nil {
		return nil, nil, fmt.Errorf("certificate request: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("marshal key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}

// PinnedBy accepts the certificate whose PEM has the sha256 hash, as a
// join token names its CA; an empty hash (a bare secret) accepts all.
func PinnedBy(hash string) func(block []byte) bool {
	return func(block []byte) bool {
		sum := sha256.Sum256(block)
		return hash == "" || hex.EncodeToString(sum[:]) == hash
	}
}

// TrustedBundle returns the CA certificates of bundle (PEM) that are
// trusted: those anchor accepts (given each one's PEM), and those they
// endorse, transitively — a CA certificate one of them signed, or a
// self-signed one of the same subject and key as one so signed. That
// is how a node takes a rotated CA: the old CA, which it trusts,
// signed the new one's key. The rest are left out; none trusted is an
// error.
func TrustedBundle(bundle []byte, anchor func(block []byte) bool) ([]byte, error) {
	type entry struct {
		cert  *x509.Certificate
		block []byte
		ok    bool
	}
	var all []*entry
	for block, rest := pem.Decode(bundle); block != nil; block, rest = pem.Decode(rest) {
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil || !c.IsCA {
			continue
		}
		e := &entry{cert: c, block: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})}
		e.ok = anchor(e.block)
		all = append(all, e)
	}
	for changed := true; changed; {
		changed = false
		for _, e := range all {
			for _, by := range all {
				if e.ok || !by.ok {
					continue
				}
				if SameKey(e.cert, by.cert) && e.cert.CheckSignatureFrom(e.cert) == nil || e.cert.CheckSignatureFrom(by.cert) == nil {
					e.ok, changed = true, true
				}
			}
		}
	}
	var out []byte
	for _, e := range all {
		if e.ok {
			out = append(out, e.block...)
		}
	}
	if out == nil {
		return nil, errors.New("no CA certificate in the bundle is trusted")
	}
	return out, nil
}

// SameKey reports whether a and b are the same subject's same key: a CA
// and its endorsement by another (a cross-signed certificate).
func SameKey(a, b *x509.Certificate) bool {
	return bytes.Equal(a.RawSubject, b.RawSubject) && bytes.Equal(a.RawSubjectPublicKeyInfo, b.RawSubjectPublicKeyInfo)
}

// FetchCA reads the server's CA bundle, over a connection verified with
// cfg, or, with none, without trusting the server yet (the bundle is
// checked against the token's hash before any use); nothing secret is
// sent.
func FetchCA(ctx context.Context, cfg *tls.Config, server string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(server, "/")+"/cacerts", nil)
	if err != nil {
		return nil, fmt.Errorf("server URL %q: %w", server, err)
	}
	if cfg == nil {
		cfg = &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12} //nolint:gosec // checked against the token's hash before any use
	}
	// One request: no idle connection is kept behind.
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch the CA of %s: %w", server, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetch the CA of %s: %s", server, resp.Status)
	}
	return io.ReadAll(io.LimitReader(resp.Body, 1<<20))
}
