package dns

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// upstream is a resolver for the names outside the cluster: example.com
// names have an address, others do not exist; it counts the questions.
type upstream struct {
	addr  string
	asked atomic.Int32
}

func startUpstream(t testing.TB) *upstream {
	t.Helper()
	u := &upstream{}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.addr = pc.LocalAddr().String()
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		u.asked.Add(1)
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		if dns.IsSubDomain("example.com.", q.Name) && q.Qtype == dns.TypeA {
			rr, _ := dns.NewRR(q.Name + " 30 IN A 192.0.2.7")
			m.Answer = append(m.Answer, rr)
		} else {
			m.Rcode = dns.RcodeNameError
			soa, _ := dns.NewRR(". 30 IN SOA a.root. nstld. 1 1800 900 604800 60")
			m.Ns = append(m.Ns, soa)
		}
		_ = w.WriteMsg(m)
	})}
	done := make(chan struct{})
	go func() { _ = srv.ActivateAndServe(); close(done) }()
	// Shutdown misses a server not yet serving: closing its socket ends it either way.
	t.Cleanup(func() { _ = srv.Shutdown(); _ = pc.Close(); <-done })
	return u
}

// listenBoth is a UDP socket and a TCP listener on one loopback port, as
// a DNS server has: the UDP port the kernel picks may be taken for TCP,
// so another is tried.
func listenBoth(t testing.TB) (net.PacketConn, net.Listener) {
	t.Helper()
	for range 20 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("tcp", pc.LocalAddr().String())
		if err == nil {
			return pc, l
		}
		_ = pc.Close()
	}
	t.Fatal("no loopback port free for both UDP and TCP")
	return nil, nil
}

// startServer runs the cluster DNS on a loopback port, for clients in
// allowed (all when nil), over the test's cluster and upstream.
func startServer(t testing.TB, up *upstream, allowed *netip.Prefix, objs ...runtime.Object) string {
	t.Helper()
	cfg := Config{Cluster: fakeCluster(t, objs...), Upstreams: []string{up.addr}}
	if allowed != nil {
		cfg.Allow = allowed.Contains
	}
	s := New(cfg)
	pc, l := listenBoth(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.ServeOn(ctx, pc, l); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return pc.LocalAddr().String()
}

func ask(t testing.TB, net, server, name string) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	c := &dns.Client{Net: net, Timeout: 2 * time.Second}
	r, _, err := c.Exchange(m, server)
	if err != nil {
		t.Fatalf("%s over %s: %v", name, net, err)
	}
	return r
}

// TestServer: over real sockets, the cluster's names from the zone and
// everything else from the upstream, kept for its TTL (negative answers
// too); an ExternalName's target resolved upstream; a headless Service
// too large for UDP truncated there and whole over TCP; clients not
// allowed refused.
func TestServer(t *testing.T) {
	up := startUpstream(t)
	objs := []runtime.Object{service("default", "web", "10.43.0.10"), service("default", "search", "")}
	objs[1].(*corev1.Service).Spec.Type, objs[1].(*corev1.Service).Spec.ExternalName = corev1.ServiceTypeExternalName, "www.example.com"
	big := service("default", "big", corev1.ClusterIPNone)
	var eps []ep
	for i := range 60 {
		eps = append(eps, ep{addr: fmt.Sprintf("10.42.%d.%d", i/200, i%200+1), ready: true})
	}
	objs = append(objs, big, slice("default", "big", 80, "", eps...))
	server := startServer(t, up, nil, objs...)

	if r := ask(t, "udp", server, "web.default.svc.cluster.local."); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 || !r.Authoritative {
		t.Errorf("a Service's name: %v", r)
	}
	if r := ask(t, "udp", server, "nope.default.svc.cluster.local."); r.Rcode != dns.RcodeNameError || len(r.Ns) != 1 {
		t.Errorf("a missing Service: %v, want NXDOMAIN with the zone's SOA", r)
	}
	if up.asked.Load() != 0 {
		t.Errorf("the cluster's names went upstream %d times", up.asked.Load())
	}

	for range 3 {
		if r := ask(t, "udp", server, "www.example.com."); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != "192.0.2.7" {
			t.Fatalf("an outside name: %v", r)
		}
		if r := ask(t, "udp", server, "nowhere.test."); r.Rcode != dns.RcodeNameError {
			t.Fatalf("an outside name that does not exist: %v", r)
		}
	}
	if n := up.asked.Load(); n != 2 {
		t.Errorf("three askings of two outside names went upstream %d times, want 2 (the rest from the cache)", n)
	}

	r := ask(t, "udp", server, "search.default.svc.cluster.local.")
	if len(r.Answer) != 2 || r.Answer[0].Header().Rrtype != dns.TypeCNAME || r.Answer[1].(*dns.A).A.String() != "192.0.2.7" {
		t.Errorf("an ExternalName Service: %v, want its CNAME and the target's address", r)
	}

	if r := ask(t, "udp", server, "big.default.svc.cluster.local."); !r.Truncated || len(r.Answer) >= 60 {
		t.Errorf("60 addresses over UDP without EDNS: truncated %v with %d", r.Truncated, len(r.Answer))
	}
	if r := ask(t, "tcp", server, "big.default.svc.cluster.local."); r.Truncated || len(r.Answer) != 60 {
		t.Errorf("60 addresses over TCP: truncated %v with %d", r.Truncated, len(r.Answer))
	}

	only := netip.MustParsePrefix("10.42.0.0/16")
	refusing := startServer(t, up, &only, objs...)
	if r := ask(t, "udp", refusing, "www.example.com."); r.Rcode != dns.RcodeRefused {
		t.Errorf("a client outside the pod network: %v, want REFUSED", r)
	}
}

// TestHostileQuestions: garbage, a question count that is not one, an
// opcode that is not a query and oversized names are answered or dropped,
// and the server goes on answering.
func TestHostileQuestions(t *testing.T) {
	up := startUpstream(t)
	server := startServer(t, up, nil, service("default", "web", "10.43.0.10"))
	conn, err := net.Dial("udp", server)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	two := new(dns.Msg)
	two.SetQuestion("web.default.svc.cluster.local.", dns.TypeA)
	two.Question = append(two.Question, two.Question[0])
	packedTwo, _ := two.Pack()
	update := new(dns.Msg)
	update.SetUpdate("cluster.local.")
	packedUpdate, _ := update.Pack()
	for _, packet := range [][]byte{
		{0x00}, []byte("not a DNS message at all"), make([]byte, 65000), packedTwo, packedUpdate,
		// A header claiming 65535 questions and nothing after it.
		{0x12, 0x34, 0x01, 0x00, 0xff, 0xff, 0, 0, 0, 0, 0, 0},
	} {
		if _, err := conn.Write(packet); err != nil {
			t.Fatal(err)
		}
	}
	// The longest name DNS allows (four labels of 60 and the zone) and one
	// of many labels: answered (NXDOMAIN), not crashed on.
	label := strings.Repeat("a", 60) + "."
	for _, name := range []string{strings.Repeat(label, 3) + "x.svc.cluster.local.", strings.Repeat("x.", 100) + "svc.cluster.local."} {
		if r := ask(t, "udp", server, name); r.Rcode != dns.RcodeNameError {
			t.Errorf("%s: %s", name, dns.RcodeToString[r.Rcode])
		}
	}
	if r := ask(t, "udp", server, "web.default.svc.cluster.local."); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Errorf("after the garbage: %v", r)
	}
}

// TestUpstreams: the node's resolvers from its resolv.conf.
func TestUpstreams(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(conf, []byte("search lan\nnameserver 192.168.1.1\nnameserver 9.9.9.9\noptions edns0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := Upstreams(conf)
	if err != nil || len(got) != 2 || got[0] != "192.168.1.1:53" || got[1] != "9.9.9.9:53" {
		t.Errorf("Upstreams = %v, %v", got, err)
	}
	empty := filepath.Join(dir, "empty.conf")
	if err := os.WriteFile(empty, []byte("search lan\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Upstreams(empty); err == nil {
		t.Error("a resolv.conf without nameservers gave upstreams")
	}
}

// TestCacheBounded: the upstream cache holds at most its size, making
// room by dropping the answer expiring soonest (an expired one first),
// and keeps no answer past its TTL.
func TestCacheBounded(t *testing.T) {
	answer := func(name string, ttl uint32) *dns.Msg {
		m := new(dns.Msg)
		m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: ttl}, A: net.IPv4(192, 0, 2, 1)}}
		return m
	}
	c := newCache(2)
	t0 := time.Now()
	c.put("short", answer("short.", 1), t0)
	c.put("long", answer("long.", 100), t0)
	c.put("new", answer("new.", 100), t0.Add(2*time.Second))
	if len(c.entries) != 2 {
		t.Fatalf("%d entries, want 2", len(c.entries))
	}
	if _, ok := c.entries["short"]; ok {
		t.Error("the expired answer kept, a live one dropped")
	}
	if m, ok := c.get("long", t0.Add(30*time.Second)); !ok || m.Answer[0].Header().Ttl != 70 {
		t.Errorf("long after 30 s: %v %v, want its TTL counted down to 70", ok, m)
	}
	if _, ok := c.get("long", t0.Add(101*time.Second)); ok {
		t.Error("an answer kept past its TTL")
	}
}

// TestServeEndsWithItsContext: a server whose context ends before its
// sockets are served returns and leaves nothing serving (goleak checks
// the package at its end): shutting down a server that has not begun is
// a no-op in miekg/dns.
func TestServeEndsWithItsContext(t *testing.T) {
	for range 10 {
		pc, l := listenBoth(t)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := New(Config{Cluster: fakeCluster(t), Logger: slog.New(slog.DiscardHandler)}).ServeOn(ctx, pc, l); err != nil {
			t.Fatalf("ServeOn after its context ended: %v", err)
		}
	}
}
