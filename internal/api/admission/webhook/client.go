package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
)

// Client posts JSON to one webhook, admission's or a custom resource
// conversion's: at its URL, or at a ready endpoint of its Service with
// the certificate checked for <service>.<namespace>.svc, trusting its CA
// bundle (the system's roots without one), as Kubernetes does.
type Client struct {
	config   admissionregistrationv1.WebhookClientConfig
	services ServiceResolver

	once sync.Once
	http *http.Client
	err  error
}

// NewClient returns a client of the webhook cc describes.
func NewClient(cc admissionregistrationv1.WebhookClientConfig, services ServiceResolver) *Client {
	return &Client{config: cc, services: services}
}

// CloseIdleConnections lets go of the client's idle connections.
func (c *Client) CloseIdleConnections() {
	if c != nil && c.http != nil {
		c.http.CloseIdleConnections()
	}
}

// Post sends body and returns the webhook's answer, within timeout (also
// sent as the timeout query parameter, as Kubernetes does). An error says
// the call failed, in Kubernetes' words.
func (c *Client) Post(ctx context.Context, body []byte, timeout time.Duration) ([]byte, error) {
	c.once.Do(func() { c.http, c.err = newHTTPClient(c.config, c.services) })
	if c.err != nil {
		return nil, fmt.Errorf("failed to call webhook: %w", c.err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	target, err := c.endpoint(ctx)
	if err != nil {
		return nil, fmt.Errorf("failed to call webhook: %w", err)
	}
	q := target.Query()
	q.Set("timeout", strconv.Itoa(int((timeout+time.Second-1)/time.Second))+"s")
	target.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target.String(), bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("failed to call webhook: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("failed to call webhook: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse+1))
	if err != nil {
		return nil, fmt.Errorf("failed to call webhook: %w", err)
	}
	if len(data) > maxResponse {
		return nil, fmt.Errorf("received invalid webhook response: larger than %d bytes", maxResponse)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, fmt.Errorf("failed to call webhook: the server responded with status %d: %s", resp.StatusCode, truncate(string(data), 256))
	}
	return data, nil
}

// endpoint is where the webhook is called now.
func (c *Client) endpoint(ctx context.Context) (*url.URL, error) {
	cc := c.config
	if cc.URL != nil {
		return url.Parse(*cc.URL)
	}
	if cc.Service == nil {
		return nil, errors.New("webhook has neither a url nor a service")
	}
	port := int32(443)
	if cc.Service.Port != nil {
		port = *cc.Service.Port
	}
	if c.services == nil {
		return nil, errors.New("services are not reachable from here")
	}
	host, err := c.services.ResolveService(ctx, cc.Service.Namespace, cc.Service.Name, port)
	if err != nil {
		return nil, err
	}
	u := &url.URL{Scheme: "https", Host: host, Path: "/"}
	if cc.Service.Path != nil {
		u.Path = *cc.Service.Path
	}
	return u, nil
}

func newHTTPClient(cc admissionregistrationv1.WebhookClientConfig, services ServiceResolver) (*http.Client, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if len(cc.CABundle) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(cc.CABundle) {
			return nil, errors.New("caBundle holds no PEM certificate")
		}
		cfg.RootCAs = pool
	}
	if s := cc.Service; s != nil {
		cfg.ServerName = s.Name + "." + s.Namespace + ".svc"
	}
	dial := (&net.Dialer{Timeout: 5 * time.Second}).DialContext
	if services != nil {
		dial = services.DialContext
	}
	tr := &http.Transport{Proxy: nil, DialContext: dial, TLSClientConfig: cfg,
		ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 4, IdleConnTimeout: 90 * time.Second, TLSHandshakeTimeout: 10 * time.Second}
	return &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}, nil
}
