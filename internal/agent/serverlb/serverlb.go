// Package serverlb is the agent's load balancer in front of the API
// servers, as k3s's agent has one: every client of the agent (the node's
// status, its pods, the service proxy's watches, certificate renewal)
// connects to a TCP proxy on the node's loopback, which sends the
// connection on to a server that answers /readyz. When that server fails,
// the proxy moves to another within seconds and cuts the connections to
// the failed one, so client-go's watches reconnect through it at once.
//
// It learns the servers from the kubernetes Service's EndpointSlice (every
// live server lists itself there) and keeps the list on disk, so a node
// restarted while the server it joined is down still finds the others.
package serverlb

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/orch-dev/orch/internal/atomicfile"
)

// Timings: a dead server is noticed within checkEvery plus a timeout.
const (
	checkEvery   = 5 * time.Second
	checkTimeout = 2 * time.Second
	dialTimeout  = 3 * time.Second
)

// Balancer is a running proxy.
type Balancer struct {
	ln       net.Listener
	log      *slog.Logger
	state    string
	tls      *tls.Config
	mu       sync.Mutex
	given    string   // the server the node was told to join (host:port)
	servers  []string // every known server, given first
	healthy  map[string]bool
	current  string
	conns    map[net.Conn]string // client side → the server it goes to
	checking sync.Mutex
}

// New listens on the loopback for the servers given (host:port), plus
// those statePath remembers; ca verifies their /readyz.
func New(given string, statePath string, ca []byte, log *slog.Logger) (*Balancer, error) {
	if _, _, err := net.SplitHostPort(given); err != nil {
		return nil, fmt.Errorf("server address %q: %w", given, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("load balancer for the API servers: %w", err)
	}
	b := &Balancer{ln: ln, log: log, state: statePath, given: given, servers: []string{given},
		healthy: map[string]bool{given: true}, current: given, conns: map[net.Conn]string{}}
	b.tls = trusting(ca)
	if remembered, err := b.load(); err == nil {
		b.add(remembered) // nothing runs yet: no lock needed
	} else if !errors.Is(err, os.ErrNotExist) {
		log.Warn("the remembered API servers cannot be read; starting from the one given", "path", statePath, "err", err)
	}
	return b, nil
}

// Address is where the node's clients connect (host:port on loopback).
func (b *Balancer) Address() string { return b.ln.Addr().String() }

// Servers are the servers it knows, the given one first.
func (b *Balancer) Servers() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.servers)
}

// Current is the server new connections go to.
func (b *Balancer) Current() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.current
}

// SetServers replaces what was learnt (the kubernetes Service's
// endpoints); the given server stays, so the node can always go back.
func (b *Balancer) SetServers(addrs []string) {
	b.mu.Lock()
	before := b.servers
	b.servers = []string{b.given}
	b.add(addrs)
	for addr := range b.healthy {
		if !slices.Contains(b.servers, addr) {
			delete(b.healthy, addr)
		}
	}
	after := slices.Clone(b.servers)
	b.mu.Unlock()
	if !slices.Equal(before, after) {
		b.log.Info("API servers known", "servers", after)
		if err := b.save(after); err != nil {
			b.log.Warn("could not remember the API servers", "path", b.state, "err", err)
		}
	}
}

// add appends the servers not known yet, up until a check says otherwise.
// The caller holds mu.
func (b *Balancer) add(addrs []string) {
	for _, a := range addrs {
		if _, _, err := net.SplitHostPort(a); err != nil || slices.Contains(b.servers, a) {
			continue
		}
		b.servers = append(b.servers, a)
		b.healthy[a] = true
	}
}

func (b *Balancer) load() ([]string, error) {
	if b.state == "" {
		return nil, os.ErrNotExist
	}
	data, err := os.ReadFile(b.state)
	if err != nil {
		return nil, err
	}
	var servers []string
	return servers, json.Unmarshal(data, &servers)
}

func (b *Balancer) save(servers []string) error {
	if b.state == "" {
		return nil
	}
	data, err := json.Marshal(servers)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(b.state), 0o700); err != nil {
		return err
	}
	return atomicfile.Write(b.state, data, 0o600)
}

// Run serves until ctx ends.
func (b *Balancer) Run(ctx context.Context) error {
	context.AfterFunc(ctx, func() { _ = b.ln.Close() })
	go b.checkLoop(ctx)
	for {
		conn, err := b.ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				b.closeAll()
				return nil
			}
			return fmt.Errorf("load balancer: %w", err)
		}
		go b.serve(ctx, conn)
	}
}

// serve pipes one client connection to a server, trying the others when
// the chosen one refuses it.
func (b *Balancer) serve(ctx context.Context, client net.Conn) {
	tried := map[string]bool{}
	for {
		addr := b.pick(tried)
		if addr == "" {
			_ = client.Close()
			return
		}
		tried[addr] = true
		server, err := (&net.Dialer{Timeout: dialTimeout}).DialContext(ctx, "tcp", addr)
		if err != nil {
			b.markDown(addr, err)
			continue
		}
		b.mu.Lock()
		b.conns[client] = addr
		b.mu.Unlock()
		pipe(client, server)
		b.mu.Lock()
		delete(b.conns, client)
		b.mu.Unlock()
		return
	}
}

// pick is the current server when it is up, else the first one up that
// was not tried yet (the given one first), else any not tried.
func (b *Balancer) pick(tried map[string]bool) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !tried[b.current] && b.healthy[b.current] {
		return b.current
	}
	for _, up := range []bool{true, false} {
		for _, a := range b.servers {
			if !tried[a] && b.healthy[a] == up {
				return a
			}
		}
	}
	return ""
}

func (b *Balancer) markDown(addr string, why error) {
	b.mu.Lock()
	was := b.healthy[addr]
	b.healthy[addr] = false
	b.mu.Unlock()
	if was {
		b.log.Warn("API server down", "server", addr, "err", why)
	}
	b.failOver()
}

// failOver moves new connections off a current server that is down, and
// cuts the connections still going to it.
func (b *Balancer) failOver() {
	b.mu.Lock()
	if b.healthy[b.current] {
		b.mu.Unlock()
		return
	}
	old := b.current
	for _, a := range b.servers {
		if b.healthy[a] {
			b.current = a
			break
		}
	}
	var cut []net.Conn
	if b.current != old {
		for c, addr := range b.conns {
			if addr == old {
				cut = append(cut, c)
			}
		}
	}
	now := b.current
	b.mu.Unlock()
	if now != old {
		b.log.Warn("the node's clients move to another API server", "from", old, "to", now)
	}
	for _, c := range cut {
		_ = c.Close()
	}
}

func (b *Balancer) closeAll() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for c := range b.conns {
		_ = c.Close()
	}
}

func (b *Balancer) checkLoop(ctx context.Context) {
	t := time.NewTicker(checkEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		b.CheckNow(ctx)
	}
}

// CheckNow asks every known server's /readyz once and moves off the
// current one if it is not ready.
func (b *Balancer) CheckNow(ctx context.Context) {
	b.checking.Lock()
	defer b.checking.Unlock()
	servers := b.Servers()
	results := make([]error, len(servers))
	var wg sync.WaitGroup
	for i, addr := range servers {
		wg.Go(func() { results[i] = b.ready(ctx, addr) })
	}
	wg.Wait()
	if ctx.Err() != nil {
		return
	}
	for i, addr := range servers {
		b.mu.Lock()
		was, known := b.healthy[addr]
		if known {
			b.healthy[addr] = results[i] == nil
		}
		b.mu.Unlock()
		switch {
		case !known:
		case was && results[i] != nil:
			b.log.Warn("API server not ready", "server", addr, "err", results[i])
		case !was && results[i] == nil:
			b.log.Info("API server ready again", "server", addr)
		}
	}
	b.failOver()
}

// ready is GET /readyz, verified against the cluster's CA.
func (b *Balancer) ready(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: b.tls, DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/readyz", nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/readyz: %s", resp.Status)
	}
	return nil
}

// pipe copies both ways until either side ends, then closes both.
func pipe(a, b net.Conn) {
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	<-done
	_ = a.Close()
	_ = b.Close()
	<-done
}

func trusting(ca []byte) *tls.Config {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}
