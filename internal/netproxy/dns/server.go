package dns

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// Port is where each node answers, on its own address: the kube-dns
// Service's port 53 reaches it through the node's own endpoint
// (internalTrafficPolicy Local), so a pod's question never leaves its
// node. Not 53, which a resolver of the node's own (dnsmasq, a Pi-hole)
// may hold.
const Port = 10053

// Config is what the cluster DNS needs.
type Config struct {
	// Domain is the cluster domain (cluster.local).
	Domain  string
	Cluster Cluster
	// Upstreams are the resolvers (host:port) asked for every other name.
	Upstreams []string
	// Allow says who may ask: the pods and the node itself, not whoever
	// else reaches the node's address (an open resolver for the LAN).
	Allow func(netip.Addr) bool
	// CacheSize bounds the upstream answers kept (10,000).
	CacheSize int
	// MaxInFlight bounds the questions answered at once (256); more are
	// refused rather than queued without end.
	MaxInFlight int
	Logger      *slog.Logger
}

// Server answers DNS over UDP and TCP.
type Server struct {
	cfg      Config
	zone     *Zone
	fwd      *forwarder
	inFlight chan struct{}
	log      *slog.Logger
}

// New makes the server; Serve listens.
func New(cfg Config) *Server {
	if cfg.Domain == "" {
		cfg.Domain = "cluster.local"
	}
	if cfg.CacheSize == 0 {
		cfg.CacheSize = 10000
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = 256
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Server{cfg: cfg, zone: NewZone(cfg.Domain, cfg.Cluster), fwd: newForwarder(cfg.Upstreams, cfg.CacheSize),
		inFlight: make(chan struct{}, cfg.MaxInFlight), log: cfg.Logger.With("component", "dns")}
}

// Serve answers on addr (host:port), UDP and TCP, until ctx ends.
func (s *Server) Serve(ctx context.Context, addr string) error {
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return fmt.Errorf("cluster DNS: %w", err)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		_ = pc.Close()
		return fmt.Errorf("cluster DNS: %w", err)
	}
	return s.ServeOn(ctx, pc, l)
}

// ServeOn answers on pc (UDP) and l (TCP) until ctx ends.
func (s *Server) ServeOn(ctx context.Context, pc net.PacketConn, l net.Listener) error {
	servers := []*dns.Server{
		{PacketConn: pc, Handler: s, UDPSize: dns.DefaultMsgSize},
		// A TCP client gets 30 s of quiet and 128 questions per connection.
		{Listener: l, Handler: s, IdleTimeout: func() time.Duration { return 30 * time.Second }, MaxTCPQueries: 128},
	}
	errs := make(chan error, len(servers)) // never blocks a server's end
	var wg sync.WaitGroup
	for _, srv := range servers {
		wg.Go(func() { errs <- srv.ActivateAndServe() })
	}
	s.log.Info("cluster DNS answering", "addr", pc.LocalAddr().String(), "domain", s.zone.Origin(), "upstreams", s.cfg.Upstreams)
	var err error
	select {
	case <-ctx.Done():
	case err = <-errs:
		s.log.Error("cluster DNS stopped", "err", err)
	}
	// Shutdown alone misses a server whose serving has not begun yet (it
	// would begin after, and serve forever): closing the sockets ends
	// either, and each server's goroutine is waited for.
	for _, srv := range servers {
		_ = srv.Shutdown() // "server not started" when it had not
	}
	_, _ = pc.Close(), l.Close()
	wg.Wait()
	return err
}

// ServeDNS answers one question: the cluster's names from the zone, the
// rest from the upstream resolvers.
func (s *Server) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	m := s.answer(w.RemoteAddr(), r)
	if _, udp := w.RemoteAddr().(*net.UDPAddr); udp {
		size := dns.MinMsgSize
		if opt := r.IsEdns0(); opt != nil {
			size = max(int(opt.UDPSize()), dns.MinMsgSize)
		}
		m.Truncate(size)
	}
	if err := w.WriteMsg(m); err != nil {
		s.log.Debug("DNS answer not sent", "client", w.RemoteAddr().String(), "err", err)
	}
}

// answer is the reply to r from client.
func (s *Server) answer(client net.Addr, r *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(r)
	m.RecursionAvailable = true
	if opt := r.IsEdns0(); opt != nil {
		m.SetEdns0(dns.DefaultMsgSize, opt.Do())
	}
	if addr, ok := clientAddr(client); !ok || s.cfg.Allow != nil && !s.cfg.Allow(addr) {
		m.Rcode = dns.RcodeRefused
		return m
	}
	if r.Opcode != dns.OpcodeQuery || len(r.Question) != 1 {
		m.Rcode = dns.RcodeNotImplemented
		return m
	}
	select {
	case s.inFlight <- struct{}{}:
		defer func() { <-s.inFlight }()
	default:
		m.Rcode = dns.RcodeRefused
		return m
	}
	q := r.Question[0]
	dnssec := r.IsEdns0() != nil && r.IsEdns0().Do()
	if q.Qclass != dns.ClassINET || !s.zone.Authoritative(q.Name, q.Qtype) {
		s.forwarded(m, q, dnssec)
		return m
	}
	res := s.zone.Answer(q)
	m.Authoritative = true
	m.Rcode, m.Answer = res.Rcode, res.Answer
	m.Extra = append(res.Extra, m.Extra...)
	if res.CNAME != "" && q.Qtype != dns.TypeCNAME {
		// An ExternalName's target, resolved in turn (once: the zone's
		// CNAMEs point outside it).
		target := dns.Question{Name: res.CNAME, Qtype: q.Qtype, Qclass: q.Qclass}
		if s.zone.Authoritative(target.Name, target.Qtype) {
			next := s.zone.Answer(target)
			m.Answer = append(m.Answer, next.Answer...)
		} else if resp, err := s.fwd.forward(target, dnssec); err == nil {
			m.Answer = append(m.Answer, resp.Answer...)
			m.Rcode = resp.Rcode
		}
	}
	if len(m.Answer) == 0 {
		m.Ns = []dns.RR{s.zone.soa()}
	}
	return m
}

// forwarded fills m with the upstream's answer to q, or SERVFAIL.
func (s *Server) forwarded(m *dns.Msg, q dns.Question, dnssec bool) {
	resp, err := s.fwd.forward(q, dnssec)
	if err != nil {
		s.log.Debug("DNS question not answered upstream", "name", q.Name, "type", dns.TypeToString[q.Qtype], "err", err)
		m.Rcode = dns.RcodeServerFailure
		return
	}
	m.Rcode, m.Answer, m.Ns = resp.Rcode, resp.Answer, resp.Ns
	m.AuthenticatedData = resp.AuthenticatedData
	for _, rr := range resp.Extra {
		if rr.Header().Rrtype != dns.TypeOPT {
			m.Extra = append(m.Extra, rr)
		}
	}
}

// clientAddr is a UDP or TCP client's address.
func clientAddr(a net.Addr) (netip.Addr, bool) {
	ap, ok := a.(interface{ AddrPort() netip.AddrPort })
	if !ok {
		return netip.Addr{}, false
	}
	ip := ap.AddrPort().Addr().Unmap()
	return ip, ip.IsValid()
}
