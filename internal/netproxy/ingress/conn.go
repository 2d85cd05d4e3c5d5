package ingress

import (
	"context"
	"encoding/binary"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// A Gateway's traffic reaches a node's proxy through the node's service
// proxy, which rewrote its destination (the Gateway's address) to the
// node's own: the address the client asked for is the connection's
// original destination, which conntrack keeps (SO_ORIGINAL_DST).

type connKey struct{}

// connInfo is what the proxy knows of a request's connection.
type connInfo struct {
	// dest is where the client sent it, before any NAT.
	dest netip.AddrPort
}

// originalDestination is the destination of an accepted connection
// before NAT, or its local address when it was not rewritten (or the
// kernel cannot say).
func originalDestination(c net.Conn) netip.AddrPort {
	local, _ := netip.ParseAddrPort(c.LocalAddr().String())
	tcp, ok := c.(*net.TCPConn)
	if !ok || !local.Addr().Unmap().Is4() {
		return local
	}
	raw, err := tcp.SyscallConn()
	if err != nil {
		return local
	}
	var dest netip.AddrPort
	_ = raw.Control(func(fd uintptr) {
		// struct sockaddr_in, read through the ipv6_mreq getter that
		// has its size (16 bytes), as transparent proxies do.
		mreq, err := unix.GetsockoptIPv6Mreq(int(fd), syscall.SOL_IP, unix.SO_ORIGINAL_DST)
		if err != nil {
			return
		}
		b := mreq.Multiaddr
		port := binary.BigEndian.Uint16(b[2:4])
		dest = netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), port)
	})
	if !dest.IsValid() {
		return local
	}
	return dest
}

// connContext records each connection's original destination.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(interface{ NetConn() net.Conn }); ok { // a TLS connection
		c = tc.NetConn()
	}
	return context.WithValue(ctx, connKey{}, connInfo{dest: originalDestination(c)})
}

func connOf(r *http.Request) connInfo {
	ci, _ := r.Context().Value(connKey{}).(connInfo)
	return ci
}

func withBackend(ctx context.Context, be *backend) context.Context {
	return context.WithValue(ctx, backendKey{}, be)
}

type responseFiltersKey struct{}

func withResponseFilters(ctx context.Context, fs []*gatewayv1.HTTPHeaderFilter) context.Context {
	return context.WithValue(ctx, responseFiltersKey{}, fs)
}

// modifyResponse applies a route's ResponseHeaderModifier filters.
func modifyResponse(resp *http.Response) error {
	if resp.Request == nil {
		return nil
	}
	fs, _ := resp.Request.Context().Value(responseFiltersKey{}).([]*gatewayv1.HTTPHeaderFilter)
	for _, f := range fs {
		modifyHeaders(resp.Header, f)
	}
	return nil
}

type backendTimeoutKey struct{}

// retryKey carries a route rule's retry policy to the transport.
type retryKey struct{}

func withBackendTimeout(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, backendTimeoutKey{}, d)
}

// cancelOnClose ends a backend request's deadline when its body is done.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

// mirror sends a copy of the request to a mirror backend, without its
// body, and forgets the answer, as the spec's mirror does.
func (p *Proxy) mirror(r *http.Request, m *gwMirror) {
	if len(m.backend.endpoints) == 0 || m.percent < 100 && rand.Float64()*100 >= m.percent {
		return
	}
	out := r.Clone(context.WithoutCancel(r.Context()))
	out.Body, out.ContentLength, out.GetBody = http.NoBody, 0, nil
	out.RequestURI = ""
	out.URL.Scheme, out.URL.Host = "http", m.backend.endpoints[int(m.backend.next.Add(1))%len(m.backend.endpoints)]
	go func() {
		ctx, cancel := context.WithTimeout(out.Context(), 10*time.Second)
		defer cancel()
		resp, err := p.mirrorClient.Do(out.WithContext(ctx))
		if err != nil {
			p.log.Debug("ingress: mirror failed", "err", err)
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}()
}
