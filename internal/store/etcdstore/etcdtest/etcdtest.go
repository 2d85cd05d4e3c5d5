// Package etcdtest runs a real one-member etcd inside a test process, with
// or without TLS, for the tests of the etcd store and of servers using it.
// Only tests import it: it links etcd's server.
package etcdtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/orch-dev/orch/internal/porttest"
)

// Etcd is a running member.
type Etcd struct {
	*embed.Etcd
	// Endpoint is its client URL.
	Endpoint string
	// CAFile, CertFile and KeyFile are, with TLS, the CA of its serving
	// certificate and a client certificate it accepts.
	CAFile, CertFile, KeyFile string
}

// Options choose how the member serves.
type Options struct {
	// TLS serves https and requires client certificates from its CA.
	TLS bool
}

// Start runs a member in a temporary directory until the test ends.
func Start(t testing.TB, opts Options) *Etcd {
	t.Helper()
	e, err := StartIn(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

// StartIn runs a member with its data in dir (for TestMain, which has no
// testing.TB); the caller closes it.
func StartIn(dir string, opts Options) (*Etcd, error) {
	cfg := embed.NewConfig()
	cfg.Dir = filepath.Join(dir, "etcd")
	// Its errors at Close are expected; the tests check what matters.
	cfg.LogLevel = "panic"
	scheme := "http"
	out := &Etcd{}
	if opts.TLS {
		scheme = "https"
		var err error
		if out.CAFile, out.CertFile, out.KeyFile, cfg.ClientTLSInfo, err = Certificates(filepath.Join(dir, "tls")); err != nil {
			return nil, err
		}
	}
	client, err := freeURL(scheme)
	if err != nil {
		return nil, err
	}
	peer, err := freeURL("http")
	if err != nil {
		return nil, err
	}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = fmt.Sprintf("%s=%s", cfg.Name, peer.String())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		return nil, fmt.Errorf("etcd did not start within 30s")
	}
	out.Etcd, out.Endpoint = e, client.String()
	return out, nil
}

func freeURL(scheme string) (url.URL, error) {
	port, err := porttest.Pick()
	if err != nil {
		return url.URL{}, err
	}
	return url.URL{Scheme: scheme, Host: fmt.Sprintf("127.0.0.1:%d", port)}, nil
}

// Certificates makes, under dir, a CA, etcd's serving pair for 127.0.0.1
// and a client pair, as an operator of an external etcd hands orch its
// files; info is etcd's side (serving pair, client CA, client certificates
// required).
func Certificates(dir string) (caFile, certFile, keyFile string, info transport.TLSInfo, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", "", info, err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", "", info, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "etcd-test-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return "", "", "", info, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return "", "", "", info, err
	}
	caFile = filepath.Join(dir, "ca.crt")
	if err := writePEM(caFile, "CERTIFICATE", caDER); err != nil {
		return "", "", "", info, err
	}
	issue := func(name string, serial int64, usage x509.ExtKeyUsage, ips []net.IP) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return err
		}
		if err := writePEM(filepath.Join(dir, name+".crt"), "CERTIFICATE", der); err != nil {
			return err
		}
		return writePEM(filepath.Join(dir, name+".key"), "EC PRIVATE KEY", keyDER)
	}
	if err := issue("etcd", 2, x509.ExtKeyUsageServerAuth, []net.IP{net.IPv4(127, 0, 0, 1)}); err != nil {
		return "", "", "", info, err
	}
	if err := issue("client", 3, x509.ExtKeyUsageClientAuth, nil); err != nil {
		return "", "", "", info, err
	}
	info = transport.TLSInfo{
		CertFile: filepath.Join(dir, "etcd.crt"), KeyFile: filepath.Join(dir, "etcd.key"),
		TrustedCAFile: caFile, ClientCertAuth: true,
	}
	return caFile, filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key"), info, nil
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}
