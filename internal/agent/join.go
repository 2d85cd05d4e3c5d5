package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/orch-dev/orch/internal/atomicfile"
	"github.com/orch-dev/orch/internal/joinproto"
)

// Credentials are what joining gives a node, as PEM.
type Credentials struct {
	// CA is the bundle of CAs the node trusts: the cluster's, and after a
	// rotation of it, the one before.
	CA                      []byte
	ClientCert, ClientKey   []byte
	ServingCert, ServingKey []byte
	// ProxyCert and ProxyKey are the service proxy's and pod network's
	// identity (system:kube-proxy), as kube-proxy has its own.
	ProxyCert, ProxyKey []byte
	// Pin is the CA hash of the token the node joined with: a bundle it
	// took since (a rotation the old CA endorsed) is trusted under that
	// token, though it no longer holds the CA the token names.
	Pin string
}

// pinFile keeps Pin under DATA/agent/tls; a node joined before it has
// none.
const pinFile = "ca-pin"

// files under DATA/agent/tls.
var credentialFiles = []string{"ca.crt", "client.crt", "client.key", "serving.crt", "serving.key", "proxy.crt", "proxy.key"}

func (c *Credentials) parts() [][]byte {
	return [][]byte{c.CA, c.ClientCert, c.ClientKey, c.ServingCert, c.ServingKey, c.ProxyCert, c.ProxyKey}
}

// Join returns the node's credentials: the ones kept under dir if they
// are still good for this server and node, else new ones from the server.
// The server is trusted only once its CA matches the token's hash, and the
// join secret is sent only then; a token without a hash (a bare secret)
// trusts the CA the server presents, which is logged.
func Join(ctx context.Context, server, token, nodeName string, addresses []string, dir string, log *slog.Logger) (*Credentials, error) {
	tok, err := joinproto.ParseToken(token)
	if err != nil {
		return nil, fmt.Errorf("join token: %w", err)
	}
	if kept, err := loadCredentials(dir); err == nil && kept.goodFor(tok, nodeName) {
		return kept, nil
	}
	fetched, err := joinproto.FetchCA(ctx, nil, server)
	if err != nil {
		return nil, err
	}
	// The CA the token names, and what it endorsed (a rotated CA).
	ca, err := joinproto.TrustedBundle(fetched, joinproto.PinnedBy(tok.CAHash))
	if err != nil {
		sum := sha256.Sum256(fetched)
		return nil, fmt.Errorf("the server's CA (sha256 %s) is not the one the token names (%s): not sending the join secret to %s", hex.EncodeToString(sum[:]), tok.CAHash, server)
	}
	if tok.CAHash == "" {
		sum := sha256.Sum256(ca)
		log.Warn("the join token pins no CA: trusting the server's CA unverified", "server", server, "caHash", hex.EncodeToString(sum[:]))
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: trusting(ca)}}
	creds, err := askForCredentials(ctx, client, server, tok.Secret, nodeName, addresses, dir, ca)
	if err != nil {
		return nil, err
	}
	creds.Pin = tok.CAHash
	if !creds.goodFor(tok, nodeName) {
		return nil, errors.New("join answer: the certificates do not chain to the server's CA or do not name this node")
	}
	if err := creds.save(dir); err != nil {
		return nil, err
	}
	log.Info("joined", "server", server)
	return creds, nil
}

// askForCredentials sends new keys' certificate requests to the join
// endpoint, with the join secret (joining) or none (renewing: client
// presents the node's certificate), and returns what the server signed.
func askForCredentials(ctx context.Context, client *http.Client, server, secret, nodeName string, addresses []string, dir string, ca []byte) (*Credentials, error) {
	clientKey, clientCSR, err := joinproto.NewKeyAndCSR(nodeName)
	if err != nil {
		return nil, err
	}
	servingKey, servingCSR, err := joinproto.NewKeyAndCSR(nodeName)
	if err != nil {
		return nil, err
	}
	proxyKey, proxyCSR, err := joinproto.NewKeyAndCSR(joinproto.ProxyUser)
	if err != nil {
		return nil, err
	}
	password, err := nodePassword(filepath.Join(dir, "node-password"))
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(joinproto.Request{NodeName: nodeName, NodePassword: password, Addresses: addresses, ClientCSR: string(clientCSR), ServingCSR: string(servingCSR), ProxyCSR: string(proxyCSR)})
	if err != nil {
		return nil, err
	}
	data, err := postJoin(ctx, client, strings.TrimSuffix(server, "/")+joinproto.Path, secret, body)
	if err != nil {
		return nil, fmt.Errorf("join %s: %w", server, err)
	}
	var answer joinproto.Response
	if err := json.Unmarshal(data, &answer); err != nil {
		return nil, fmt.Errorf("join answer: %w", err)
	}
	return &Credentials{CA: ca, ClientCert: []byte(answer.ClientCert), ClientKey: clientKey, ServingCert: []byte(answer.ServingCert), ServingKey: servingKey,
		ProxyCert: []byte(answer.ProxyCert), ProxyKey: proxyKey}, nil
}

// postJoin sends the join request, waiting as told while the server
// limits this address's attempts (429).
func postJoin(ctx context.Context, client *http.Client, url, secret string, body []byte) ([]byte, error) {
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		if secret != "" {
			req.Header.Set("Authorization", "Bearer "+secret)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		_ = resp.Body.Close()
		if err != nil {
			return nil, err
		}
		switch resp.StatusCode {
		case http.StatusOK:
			return data, nil
		case http.StatusTooManyRequests:
			wait := time.Second
			if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 && s < 60 {
				wait = time.Duration(s) * time.Second
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(wait):
			}
		default:
			return nil, &refusedError{status: resp.StatusCode, msg: fmt.Sprintf("refused (%s): %s", resp.Status, strings.TrimSpace(string(data)))}
		}
	}
}

// refusedError is the join endpoint's refusal.
type refusedError struct {
	status int
	msg    string
}

func (e *refusedError) Error() string { return e.msg }

// nodePassword is this machine's own secret, made at its first join and
// kept: the server binds the node name to it, so no other machine that
// holds the token can take the name.
func nodePassword(path string) (string, error) {
	if b, err := os.ReadFile(path); err == nil && len(strings.TrimSpace(string(b))) >= 32 {
		return strings.TrimSpace(string(b)), nil
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("node password: %w", err)
	}
	var buf [32]byte
	if _, err := rand.Read(buf[:]); err != nil {
		return "", fmt.Errorf("node password: %w", err)
	}
	password := hex.EncodeToString(buf[:])
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", fmt.Errorf("node password: %w", err)
	}
	if err := atomicfile.Write(path, []byte(password+"\n"), 0o600); err != nil {
		return "", err
	}
	return password, nil
}

// trusting is a client's TLS configuration trusting the CA bundle.
func trusting(ca []byte) *tls.Config {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

// goodFor reports whether the credentials belong to this node, chain to a
// CA the token accepts, and are not about to expire.
func (c *Credentials) goodFor(tok joinproto.Token, nodeName string) bool {
	pinned := joinproto.PinnedBy(tok.CAHash)
	ca, err := joinproto.TrustedBundle(c.CA, func(block []byte) bool { return pinned(block) || c.Pin == tok.CAHash })
	if err != nil {
		return false
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	for _, part := range []struct {
		cert, key []byte
		usage     x509.ExtKeyUsage
		name      string
	}{
		{c.ClientCert, c.ClientKey, x509.ExtKeyUsageClientAuth, joinproto.NodeUserPrefix + nodeName},
		{c.ServingCert, c.ServingKey, x509.ExtKeyUsageServerAuth, nodeName},
		{c.ProxyCert, c.ProxyKey, x509.ExtKeyUsageClientAuth, joinproto.ProxyUser},
	} {
		pair, err := tls.X509KeyPair(part.cert, part.key)
		if err != nil {
			return false
		}
		cert, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil || cert.Subject.CommonName != part.name || time.Until(cert.NotAfter) < 30*24*time.Hour {
			return false
		}
		if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{part.usage}}); err != nil {
			return false
		}
	}
	return true
}

func loadCredentials(dir string) (*Credentials, error) {
	var parts [7][]byte
	for i, name := range credentialFiles {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		parts[i] = data
	}
	pin, err := os.ReadFile(filepath.Join(dir, pinFile))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return &Credentials{CA: parts[0], ClientCert: parts[1], ClientKey: parts[2], ServingCert: parts[3], ServingKey: parts[4], ProxyCert: parts[5], ProxyKey: parts[6],
		Pin: strings.TrimSpace(string(pin))}, nil
}

func (c *Credentials) save(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	for i, data := range c.parts() {
		if err := atomicfile.Write(filepath.Join(dir, credentialFiles[i]), data, 0o600); err != nil {
			return err
		}
	}
	return atomicfile.Write(filepath.Join(dir, pinFile), []byte(c.Pin+"\n"), 0o600)
}
