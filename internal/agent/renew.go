package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/orch-dev/orch/internal/joinproto"
)

// Defaults of certificate renewal: checked twice a day, renewed within 90
// days of expiry (of a year's validity), as k3s renews its certificates.
const (
	DefaultCertificateCheckInterval = 12 * time.Hour
	DefaultCertificateRenewBefore   = 90 * 24 * time.Hour
)

// Renew asks the server for new certificates, presenting the node's
// current client certificate instead of the join token (which may have
// been rotated since the node joined), and saves them under dir.
func Renew(ctx context.Context, server string, creds *Credentials, nodeName string, addresses []string, dir string) (*Credentials, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(creds.CA) {
		return nil, errors.New("renew: no CA certificate")
	}
	cert, err := tls.X509KeyPair(creds.ClientCert, creds.ClientKey)
	if err != nil {
		return nil, fmt.Errorf("renew: client certificate: %w", err)
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}}
	next, err := askForCredentials(ctx, client, server, "", nodeName, addresses, dir, creds.CA)
	if err != nil {
		return nil, err
	}
	if !next.goodFor(joinproto.Token{}, nodeName) {
		return nil, errors.New("renew: the certificates do not chain to the cluster's CA or do not name this node")
	}
	if err := next.save(dir); err != nil {
		return nil, err
	}
	return next, nil
}

// expiresWithin reports whether any of the node's certificates expires
// within d (or cannot be read).
func (c *Credentials) expiresWithin(d time.Duration) bool {
	for _, pair := range [][2][]byte{{c.ClientCert, c.ClientKey}, {c.ServingCert, c.ServingKey}, {c.ProxyCert, c.ProxyKey}} {
		kp, err := tls.X509KeyPair(pair[0], pair[1])
		if err != nil {
			return true
		}
		cert, err := x509.ParseCertificate(kp.Certificate[0])
		if err != nil || time.Until(cert.NotAfter) < d {
			return true
		}
	}
	return false
}

// keepCredentials renews the node's certificates once they come within
// cfg's renewal window, while the agent runs, and hands each new set to
// use. The files are replaced too: client-go reloads a client certificate
// from its files (within five minutes), as the kubelet's does. A failed
// renewal is retried at the next check; the old certificates still hold.
func keepCredentials(ctx context.Context, cfg Config, creds *Credentials, dir string, use func(*Credentials), log *slog.Logger) {
	every := cfg.CertificateCheckInterval
	if every <= 0 {
		every = DefaultCertificateCheckInterval
	}
	before := cfg.CertificateRenewBefore
	if before <= 0 {
		before = DefaultCertificateRenewBefore
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !creds.expiresWithin(before) {
			continue
		}
		next, err := Renew(ctx, cfg.Server, creds, cfg.NodeName, nodeAddresses(cfg), dir)
		if err != nil {
			log.Warn("renewing the node's certificates (retrying later)", "err", err)
			continue
		}
		creds = next
		use(next)
		log.Info("node certificates renewed")
	}
}
