package ingress

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"slices"
	"time"
)

// transport spreads requests over a backend's endpoints in turn and,
// when an endpoint refuses the connection (its pod just went away), tries
// the next: nothing of the request was sent, so any request may be sent
// again.
type transport struct {
	http1, h2c *http.Transport
}

func newTransport() *transport {
	base := func() *http.Transport {
		t := &http.Transport{
			DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost:   32,
			IdleConnTimeout:       idleTimeout,
			ResponseHeaderTimeout: 0, // long polls and streams are the backend's business
			ExpectContinueTimeout: time.Second,
		}
		return t
	}
	h2c := base()
	h2c.Protocols = new(http.Protocols)
	h2c.Protocols.SetUnencryptedHTTP2(true)
	return &transport{http1: base(), h2c: h2c}
}

// maxAttempts bounds the endpoints one request tries.
const maxAttempts = 3

// RoundTrip sends a request to its backend, and again, as a route's
// retry policy asks, after an answer with one of its status codes: a
// request with a body is sent once (the body is gone).
func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	retry, _ := req.Context().Value(retryKey{}).(*gatewayv1.HTTPRouteRetry)
	retries := 0
	if retry != nil && retry.Attempts != nil && (req.Body == nil || req.Body == http.NoBody) {
		retries = *retry.Attempts
	}
	var backoff time.Duration
	if retry != nil && retry.Backoff != nil {
		backoff, _ = time.ParseDuration(string(*retry.Backoff))
	}
	for attempt := 0; ; attempt++ {
		resp, err := t.once(req)
		if err != nil || attempt >= retries || !slices.Contains(retry.Codes, gatewayv1.HTTPRouteRetryStatusCode(resp.StatusCode)) {
			return resp, err
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
		select {
		case <-req.Context().Done():
			return nil, req.Context().Err()
		case <-time.After(backoff):
		}
	}
}

// once sends a request to one of its backend's endpoints, the next when
// one refuses the connection.
func (t *transport) once(req *http.Request) (*http.Response, error) {
	be := req.Context().Value(backendKey{}).(*backend)
	rt := t.http1
	if be.h2c {
		rt = t.h2c
	}
	n := len(be.endpoints)
	start := int(be.next.Add(1))
	// A route's backendRequest timeout bounds each attempt, until its
	// response's body is read.
	var cancel context.CancelFunc
	if d, ok := req.Context().Value(backendTimeoutKey{}).(time.Duration); ok {
		var ctx context.Context
		ctx, cancel = context.WithTimeout(req.Context(), d)
		req = req.WithContext(ctx)
	}
	var err error
	for i := 0; i < n && i < maxAttempts; i++ {
		req.URL.Host = be.endpoints[(start+i)%n]
		var resp *http.Response
		if resp, err = rt.RoundTrip(req); err == nil {
			if cancel != nil && resp.StatusCode != http.StatusSwitchingProtocols {
				resp.Body = cancelOnClose{resp.Body, cancel}
			}
			return resp, nil
		}
		var op *net.OpError
		if !errors.As(err, &op) || op.Op != "dial" {
			break
		}
	}
	if cancel != nil {
		cancel()
	}
	return nil, err
}

// selfSigned is the certificate served to a client whose name no
// Ingress has a certificate for, as ingress controllers serve their
// "fake" one: the connection is made, and the client's check fails.
func selfSigned() (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{Organization: []string{"orch"}, CommonName: "orch ingress default certificate"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().AddDate(10, 0, 0), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
