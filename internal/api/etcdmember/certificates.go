package etcdmember

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/orch-dev/orch/internal/api/pki"
	"github.com/orch-dev/orch/internal/atomicfile"
)

// CA directories under the TLS dir: etcd's CAs are not the cluster's, so a
// certificate the cluster CA signs (a node's, a user's) never reaches etcd.
const (
	serverCADir = "server-ca"
	peerCADir   = "peer-ca"
)

// CAFiles are the CA files under the TLS dir every server of the cluster
// holds the same (slash-separated, relative).
var CAFiles = []string{
	serverCADir + "/ca.crt", serverCADir + "/ca.key",
	peerCADir + "/ca.crt", peerCADir + "/ca.key",
}

// Certificates are etcd's CAs, from which each member issues its own.
type Certificates struct {
	dir      string
	serverCA *pki.CA
	peerCA   *pki.CA
}

// LoadCertificates reads etcd's CAs under dir, making them when create is
// set (the first server); a joining server has them from the cluster.
func LoadCertificates(dir string, create bool) (*Certificates, error) {
	c := &Certificates{dir: dir}
	for _, ca := range []struct {
		sub string
		to  **pki.CA
	}{{serverCADir, &c.serverCA}, {peerCADir, &c.peerCA}} {
		caDir := filepath.Join(dir, ca.sub)
		if !create {
			if _, err := os.Stat(filepath.Join(caDir, "ca.key")); err != nil {
				return nil, fmt.Errorf("etcd's CA %s: %w", caDir, err)
			}
		}
		if err := os.MkdirAll(caDir, 0o700); err != nil {
			return nil, err
		}
		loaded, err := pki.LoadOrCreateCA(caDir)
		if err != nil {
			return nil, fmt.Errorf("etcd's CA %s: %w", caDir, err)
		}
		*ca.to = loaded
	}
	return c, nil
}

func (c *Certificates) serverCAFile() string { return filepath.Join(c.dir, serverCADir, "ca.crt") }
func (c *Certificates) peerCAFile() string   { return filepath.Join(c.dir, peerCADir, "ca.crt") }

type leafFiles struct {
	serverCert, serverKey string
	peerCert, peerKey     string
}

// issueLeaves makes this member's serving and peer certificates for ip,
// and the client certificate the API server presents, keeping those that
// still fit.
func (c *Certificates) issueLeaves(ip net.IP) (leafFiles, error) {
	names := pki.Request{IPs: []net.IP{ip, net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"}}
	out := leafFiles{
		serverCert: filepath.Join(c.dir, "server.crt"), serverKey: filepath.Join(c.dir, "server.key"),
		peerCert: filepath.Join(c.dir, "peer.crt"), peerKey: filepath.Join(c.dir, "peer.key"),
	}
	for _, leaf := range []struct {
		ca        *pki.CA
		cert, key string
		req       pki.Request
	}{
		{c.serverCA, out.serverCert, out.serverKey, pki.Request{CommonName: "etcd-server", IPs: names.IPs, DNSNames: names.DNSNames, Server: true}},
		// Peers dial each other with the certificate they serve with.
		{c.peerCA, out.peerCert, out.peerKey, pki.Request{CommonName: "etcd-peer", IPs: names.IPs, DNSNames: names.DNSNames, Server: true, Client: true}},
		{c.serverCA, filepath.Join(c.dir, "client.crt"), filepath.Join(c.dir, "client.key"), pki.Request{CommonName: "etcd-client", Client: true}},
	} {
		if err := loadOrIssue(leaf.ca, leaf.cert, leaf.key, leaf.req); err != nil {
			return leafFiles{}, err
		}
	}
	return out, nil
}

// loadOrIssue keeps a leaf signed by ca, far from expiry and covering the
// addresses wanted; otherwise it issues a new one.
func loadOrIssue(ca *pki.CA, certPath, keyPath string, req pki.Request) error {
	if cert, err := pki.ReadCertificate(certPath); err == nil {
		if _, err := os.Stat(keyPath); err == nil && cert.CheckSignatureFrom(ca.Cert) == nil &&
			time.Until(cert.NotAfter) > 90*24*time.Hour && coversIPs(cert, req.IPs) {
			return nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	kp, err := ca.Issue(req)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(keyPath, kp.KeyPEM, 0o600); err != nil {
		return err
	}
	return atomicfile.Write(certPath, kp.CertPEM, 0o600)
}

func coversIPs(cert *x509.Certificate, ips []net.IP) bool {
	for _, ip := range ips {
		if !slices.ContainsFunc(cert.IPAddresses, ip.Equal) {
			return false
		}
	}
	return true
}

// ClientTLS is a client's configuration: the client certificate, etcd's
// serving CA.
func (c *Certificates) ClientTLS() (*tls.Config, error) {
	if err := loadOrIssue(c.serverCA, filepath.Join(c.dir, "client.crt"), filepath.Join(c.dir, "client.key"), pki.Request{CommonName: "etcd-client", Client: true}); err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(c.dir, "client.crt"), filepath.Join(c.dir, "client.key"))
	if err != nil {
		return nil, fmt.Errorf("etcd client certificate: %w", err)
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: c.serverCA.Pool(), Certificates: []tls.Certificate{cert}}, nil
}

// Client is a client of the cluster with a server's client certificate,
// as etcdctl with DATA/server/tls/etcd's files (membership calls, and
// tests and benchmarks that look at the members).
func (c *Certificates) Client(endpoints []string) (*clientv3.Client, error) {
	cfg, err := c.ClientTLS()
	if err != nil {
		return nil, err
	}
	client, err := clientv3.New(clientv3.Config{Endpoints: endpoints, TLS: cfg, DialTimeout: 10 * time.Second, Logger: zapNop})
	if err != nil {
		return nil, fmt.Errorf("etcd client for %v: %w", endpoints, err)
	}
	return client, nil
}
