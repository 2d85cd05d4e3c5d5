package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"github.com/orch-dev/orch/internal/joinproto"
)

// Defaults of certificate renewal: checked every ten minutes, renewed
// within 90 days of expiry (of a year's validity), as k3s renews its
// certificates. The check also asks the server for its CA bundle (a
// few kilobytes), to take a rotated CA.
const (
	DefaultCertificateCheckInterval = 10 * time.Minute
	DefaultCertificateRenewBefore   = 90 * 24 * time.Hour
)

// Renew asks the server for new certificates, presenting the node's
// current client certificate instead of the join token (which may have
// been rotated since the node joined), and saves them under dir with the
// CA bundle ca. When the server no longer takes the certificate (its CA
// was dropped before the node renewed), it asks with the join secret, if
// it has one.
func Renew(ctx context.Context, server string, creds *Credentials, ca []byte, nodeName string, addresses []string, dir, secret string) (*Credentials, error) {
	cert, err := tls.X509KeyPair(creds.ClientCert, creds.ClientKey)
	if err != nil {
		return nil, fmt.Errorf("renew: client certificate: %w", err)
	}
	cfg := trusting(creds.CA)
	cfg.Certificates = []tls.Certificate{cert}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	next, err := askForCredentials(ctx, client, server, "", nodeName, addresses, dir, ca)
	var refused *refusedError
	if errors.As(err, &refused) && refused.status == http.StatusUnauthorized && secret != "" {
		client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: trusting(creds.CA)}}
		next, err = askForCredentials(ctx, client, server, secret, nodeName, addresses, dir, ca)
	}
	if err != nil {
		return nil, err
	}
	next.Pin = creds.Pin
	if !next.goodFor(joinproto.Token{}, nodeName) {
		return nil, errors.New("renew: the certificates do not chain to the cluster's CA or do not name this node")
	}
	if err := next.save(dir); err != nil {
		return nil, err
	}
	return next, nil
}

// rotatedCA is the server's CA bundle when it differs from the one the
// node trusts and is endorsed by it (orch certificate rotate-ca), else
// nil. It is read over a connection verified with the node's bundle.
func rotatedCA(ctx context.Context, server string, creds *Credentials) ([]byte, error) {
	fetched, err := joinproto.FetchCA(ctx, trusting(creds.CA), server)
	if err != nil {
		return nil, err
	}
	// What the node trusts may have left the server's bundle (the CA
	// before was dropped) and still vouch for what is in it.
	trusted, err := joinproto.TrustedBundle(append(slices.Clip(fetched), creds.CA...), func(block []byte) bool { return bytes.Contains(creds.CA, block) })
	if err != nil {
		return nil, fmt.Errorf("the server's CA bundle: %w", err)
	}
	var ca []byte
	for block, rest := pem.Decode(trusted); block != nil; block, rest = pem.Decode(rest) {
		if encoded := pem.EncodeToMemory(block); bytes.Contains(fetched, encoded) && !bytes.Contains(ca, encoded) {
			ca = append(ca, encoded...)
		}
	}
	if ca == nil {
		return nil, errors.New("the server's CA bundle: no CA the node trusts vouches for it")
	}
	if bytes.Equal(ca, creds.CA) {
		return nil, nil
	}
	return ca, nil
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
// cfg's renewal window, or once the server has a new CA, while the agent
// runs, and hands each new set to use. The files are replaced too:
// client-go reloads a client certificate from its files (within five
// minutes), as the kubelet's does. A failed renewal is retried at the
// next check; the old certificates still hold. The first check is at
// once: a node restarted after a rotation takes the new CA then.
func keepCredentials(ctx context.Context, cfg Config, creds *Credentials, dir string, use func(*Credentials), log *slog.Logger) {
	every := cfg.CertificateCheckInterval
	if every <= 0 {
		every = DefaultCertificateCheckInterval
	}
	before := cfg.CertificateRenewBefore
	if before <= 0 {
		before = DefaultCertificateRenewBefore
	}
	var secret string
	if tok, err := joinproto.ParseToken(cfg.Token); err == nil {
		secret = tok.Secret
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		ca, err := rotatedCA(ctx, cfg.Server, creds)
		if err != nil {
			log.Debug("reading the server's CA bundle (retrying later)", "err", err)
		}
		if newCA := ca != nil; newCA || creds.expiresWithin(before) {
			if !newCA {
				ca = creds.CA
			}
			next, err := Renew(ctx, cfg.Server, creds, ca, cfg.NodeName, nodeAddresses(cfg), dir, secret)
			if err != nil {
				log.Warn("renewing the node's certificates (retrying later)", "err", err)
			} else {
				creds = next
				use(next)
				log.Info("node certificates renewed", "newCA", newCA)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
