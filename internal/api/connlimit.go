package api

import (
	"net"
	"sync"
)

// DefaultMaxConnectionsPerSource bounds the connections one address holds
// open: a kubectl or an agent needs a handful (HTTP/2 carries all its
// requests and watches); 20,000 idle connections from one address would
// otherwise take the server's memory.
const DefaultMaxConnectionsPerSource = 256

// sourceLimitListener closes, as soon as they are accepted, connections
// from an address that already holds max open.
type sourceLimitListener struct {
	net.Listener
	max  int
	mu   sync.Mutex
	open map[string]int
}

func limitPerSource(l net.Listener, max int) net.Listener {
	if max <= 0 {
		max = DefaultMaxConnectionsPerSource
	}
	return &sourceLimitListener{Listener: l, max: max, open: map[string]int{}}
}

func (l *sourceLimitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		host, _, err := net.SplitHostPort(c.RemoteAddr().String())
		if err != nil {
			host = c.RemoteAddr().String()
		}
		l.mu.Lock()
		if l.open[host] >= l.max {
			l.mu.Unlock()
			_ = c.Close()
			continue
		}
		l.open[host]++
		l.mu.Unlock()
		return &sourceConn{Conn: c, release: sync.OnceFunc(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.open[host]--; l.open[host] <= 0 {
				delete(l.open, host)
			}
		})}, nil
	}
}

// sourceConn gives its source's slot back when closed.
type sourceConn struct {
	net.Conn
	release func()
}

func (c *sourceConn) Close() error {
	c.release()
	return c.Conn.Close()
}
