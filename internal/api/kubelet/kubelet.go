// Package kubelet is the API server's way to the nodes' :10250 API, as
// kube-apiserver's kubelet client: pods/log (and the streaming
// subresources, whose protocol upgrades pass through) are proxied to the
// node the pod runs on, with a client certificate the agents trust and
// the nodes' serving certificates checked against the cluster CA.
package kubelet

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Client proxies requests to nodes.
type Client struct {
	transport *http.Transport
	cert      atomic.Pointer[tls.Certificate]
	roots     atomic.Pointer[x509.CertPool]
}

// New is a client presenting cert and trusting nodes signed by ca.
func New(cert tls.Certificate, ca *x509.CertPool) *Client {
	c := &Client{}
	c.cert.Store(&cert)
	c.roots.Store(ca)
	c.transport = &http.Transport{
		TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12,
			// Verified by verify instead, against the CAs of the moment.
			InsecureSkipVerify:   true, //nolint:gosec // VerifyConnection checks the chain and name
			VerifyConnection:     c.verify,
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return c.cert.Load(), nil }},
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
		TLSHandshakeTimeout: 10 * time.Second,
		IdleConnTimeout:     90 * time.Second,
	}
	return c
}

// verify checks a node's serving certificate as crypto/tls would, with
// the roots SetRoots last gave.
func (c *Client) verify(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("the node presented no certificate")
	}
	intermediates := x509.NewCertPool()
	for _, cert := range cs.PeerCertificates[1:] {
		intermediates.AddCert(cert)
	}
	_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: c.roots.Load(), Intermediates: intermediates, DNSName: cs.ServerName})
	return err
}

// ServingCertificate is the certificate node's kubelet API presents,
// read without checking it (for what signed it).
func (c *Client) ServingCertificate(ctx context.Context, node *corev1.Node) (*x509.Certificate, error) {
	addr, err := Address(node)
	if err != nil {
		return nil, err
	}
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 10 * time.Second}, Config: &tls.Config{MinVersion: tls.VersionTLS12,
		InsecureSkipVerify:   true, //nolint:gosec // only reading the certificate presented; nothing is sent
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return c.cert.Load(), nil }}}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	return conn.(*tls.Conn).ConnectionState().PeerCertificates[0], nil
}

// NodeReady reports whether the node's Ready condition is True.
func NodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// SetRoots trusts the nodes signed by ca from the next connection on
// (the CA was rotated).
func (c *Client) SetRoots(ca *x509.CertPool) {
	c.roots.Store(ca)
	c.transport.CloseIdleConnections()
}

// SetCertificate presents cert from the next connection on (renewed).
func (c *Client) SetCertificate(cert tls.Certificate) {
	c.cert.Store(&cert)
	c.transport.CloseIdleConnections()
}

// Address is where node's kubelet API listens: its first InternalIP (or
// any address) and the port its status gives (10250 by default).
func Address(node *corev1.Node) (string, error) {
	var ip string
	for _, t := range []corev1.NodeAddressType{corev1.NodeInternalIP, corev1.NodeExternalIP, corev1.NodeHostName} {
		for _, a := range node.Status.Addresses {
			if a.Type == t && ip == "" {
				ip = a.Address
			}
		}
	}
	if ip == "" {
		return "", apierrors.NewServiceUnavailable(fmt.Sprintf("node %q has no address", node.Name))
	}
	port := node.Status.DaemonEndpoints.KubeletEndpoint.Port
	if port == 0 {
		port = 10250
	}
	return net.JoinHostPort(ip, strconv.Itoa(int(port))), nil
}

// RemoveLocalVolume asks node's agent to remove the data of the named
// local-path volume.
func (c *Client) RemoveLocalVolume(ctx context.Context, node *corev1.Node, name string) error {
	_, err := c.do(ctx, http.MethodDelete, node, "/localVolumes/"+name, 0)
	return err
}

// Get reads path of node's kubelet API, at most limit bytes (a longer
// answer is an error; 0 reads no body).
func (c *Client) Get(ctx context.Context, node *corev1.Node, path string, limit int64) ([]byte, error) {
	return c.do(ctx, http.MethodGet, node, path, limit)
}

func (c *Client) do(ctx context.Context, method string, node *corev1.Node, path string, limit int64) ([]byte, error) {
	addr, err := Address(node)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, method, (&url.URL{Scheme: "https", Host: addr, Path: path}).String(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := (&http.Client{Transport: c.transport, Timeout: time.Minute}).Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode >= 300 {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		return nil, fmt.Errorf("node %s: %s: %s", node.Name, resp.Status, strings.TrimSpace(string(body)))
	}
	if limit == 0 {
		return nil, nil // an answer without a body (204)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", node.Name, err)
	}
	if int64(len(body)) > limit {
		return nil, fmt.Errorf("node %s: the answer to %s is over %d bytes", node.Name, path, limit)
	}
	return body, nil
}

// Proxy serves r from node's kubelet API at path with query: the response
// streams back as it comes (a followed log), and a protocol upgrade
// (exec, port-forward) is passed through. An error the node answers with
// becomes a Kubernetes Status with its code and message, as kubectl shows
// it.
func (c *Client) Proxy(w http.ResponseWriter, r *http.Request, node *corev1.Node, path string, query url.Values) error {
	addr, err := Address(node)
	if err != nil {
		return err
	}
	target := &url.URL{Scheme: "https", Host: addr, Path: path, RawQuery: query.Encode()}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL = target
			pr.Out.Host = addr
			pr.Out.Header.Del("Authorization") // the user's credentials are not the node's business
		},
		Transport:     c.transport,
		FlushInterval: -1,
		ModifyResponse: func(resp *http.Response) error {
			if resp.StatusCode < 300 || resp.StatusCode == http.StatusSwitchingProtocols {
				return nil
			}
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			_ = resp.Body.Close()
			status := metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
				Code: int32(resp.StatusCode), Reason: reasonFor(resp.StatusCode), Message: strings.TrimSpace(string(body))}
			data, err := json.Marshal(status)
			if err != nil {
				return err
			}
			resp.Body = io.NopCloser(strings.NewReader(string(data)))
			resp.ContentLength = int64(len(data))
			resp.Header = http.Header{"Content-Type": {"application/json"}, "Content-Length": {strconv.Itoa(len(data))}}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			status := apierrors.NewServiceUnavailable(fmt.Sprintf("node %q unreachable: %v", node.Name, err)).ErrStatus
			status.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_ = json.NewEncoder(w).Encode(status)
		},
	}
	rp.ServeHTTP(w, r)
	return nil
}

func reasonFor(code int) metav1.StatusReason {
	switch code {
	case http.StatusBadRequest:
		return metav1.StatusReasonBadRequest
	case http.StatusNotFound:
		return metav1.StatusReasonNotFound
	case http.StatusForbidden:
		return metav1.StatusReasonForbidden
	case http.StatusServiceUnavailable:
		return metav1.StatusReasonServiceUnavailable
	}
	return metav1.StatusReasonInternalError
}
