package kubelet

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// tunnelProtocol is the upgrade the agent's /podTunnel answers (the
// agent's TunnelProtocol; the packages do not import each other).
const tunnelProtocol = "orch-pod-tcp"

// DialPod connects to port of the named pod through the kubelet API of
// node, the pod's node: the way to pods of a server that is not on the
// pod network itself. The connection carries the bytes of a TCP
// connection from node to the pod.
func (c *Client) DialPod(ctx context.Context, node *corev1.Node, namespace, name, port string) (net.Conn, error) {
	addr, err := Address(node)
	if err != nil {
		return nil, err
	}
	host, _, _ := net.SplitHostPort(addr)
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 10 * time.Second}, Config: &tls.Config{MinVersion: tls.VersionTLS12,
		ServerName: host, NextProtos: []string{"http/1.1"}, // an upgrade is HTTP/1.1's
		InsecureSkipVerify:   true, //nolint:gosec // VerifyConnection checks the chain and name
		VerifyConnection:     c.verify,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return c.cert.Load(), nil }}}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("node %q: %w", node.Name, err)
	}
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	}
	path := "/podTunnel/" + url.PathEscape(namespace) + "/" + url.PathEscape(name) + "/" + url.PathEscape(port)
	req := "GET " + path + " HTTP/1.1\r\nHost: " + addr + "\r\nConnection: Upgrade\r\nUpgrade: " + tunnelProtocol + "\r\n\r\n"
	br := bufio.NewReader(conn)
	resp, err := func() (*http.Response, error) {
		if _, err := io.WriteString(conn, req); err != nil {
			return nil, err
		}
		return http.ReadResponse(br, nil)
	}()
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("node %q: tunnel to pod %s/%s: %w", node.Name, namespace, name, err)
	}
	defer func() { _ = resp.Body.Close() }() // a 101 has none: the bytes after it are the pod's
	if resp.StatusCode != http.StatusSwitchingProtocols {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		_ = conn.Close()
		return nil, fmt.Errorf("node %q: tunnel to pod %s/%s: %s: %s", node.Name, namespace, name, resp.Status, strings.TrimSpace(string(body)))
	}
	_ = conn.SetDeadline(time.Time{})
	return &tunnelConn{Conn: conn, r: br}, nil
}

// tunnelConn reads first what the reader of the upgrade answer buffered.
type tunnelConn struct {
	net.Conn
	r *bufio.Reader
}

func (t *tunnelConn) Read(p []byte) (int, error) { return t.r.Read(p) }
