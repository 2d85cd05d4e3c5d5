package dns

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// systemdResolved is where systemd-resolved writes the node's real
// upstream resolvers, when /etc/resolv.conf names only its stub.
const systemdResolved = "/run/systemd/resolve/resolv.conf"

// HostResolvConf is the node's resolv.conf: /etc/resolv.conf, or
// systemd-resolved's list of the real resolvers when /etc/resolv.conf
// names only its stub, 127.0.0.53, which answers on the node's loopback
// alone (k3s and the kubelet's installers pick the same).
func HostResolvConf() string {
	if servers, err := nameservers("/etc/resolv.conf"); err == nil && onlyStub(servers) {
		if _, err := os.Stat(systemdResolved); err == nil {
			return systemdResolved
		}
	}
	return "/etc/resolv.conf"
}

// Upstreams are the node's resolvers (host:port) from the resolv.conf at
// path: its nameservers, or, when they are only systemd-resolved's stub
// (127.0.0.53, which answers on the node's loopback only), the resolvers
// systemd-resolved itself uses.
func Upstreams(path string) ([]string, error) {
	servers, err := nameservers(path)
	if err != nil {
		return nil, err
	}
	if onlyStub(servers) {
		if real, err := nameservers(systemdResolved); err == nil && len(real) > 0 {
			return real, nil
		}
	}
	if len(servers) == 0 {
		return nil, fmt.Errorf("%s names no nameserver", path)
	}
	return servers, nil
}

// onlyStub says whether servers are systemd-resolved's stub alone.
func onlyStub(servers []string) bool {
	return len(servers) > 0 && !slices.ContainsFunc(servers, func(s string) bool { return !strings.HasPrefix(s, "127.0.0.53:") })
}

func nameservers(path string) ([]string, error) {
	cfg, err := dns.ClientConfigFromFile(path)
	if err != nil {
		return nil, fmt.Errorf("resolvers: %w", err)
	}
	var out []string
	for _, s := range cfg.Servers {
		out = append(out, net.JoinHostPort(s, cfg.Port))
	}
	return out, nil
}

// forwarder asks the node's resolvers what the cluster does not know,
// keeping their answers for as long as their TTLs say.
type forwarder struct {
	upstreams []string
	udp, tcp  *dns.Client
	cache     *cache
}

func newForwarder(upstreams []string, cacheSize int) *forwarder {
	return &forwarder{upstreams: upstreams,
		udp:   &dns.Client{Net: "udp", Timeout: 2 * time.Second, UDPSize: dns.DefaultMsgSize},
		tcp:   &dns.Client{Net: "tcp", Timeout: 2 * time.Second},
		cache: newCache(cacheSize)}
}

// errNoUpstream is a question no upstream answered.
var errNoUpstream = errors.New("no upstream resolver answered")

// forward answers q (recursion desired, DNSSEC OK as asked) from the cache
// or an upstream, trying each in turn; SERVFAIL answers are not kept.
func (f *forwarder) forward(q dns.Question, dnssec bool) (*dns.Msg, error) {
	key := cacheKey(q, dnssec)
	if m, ok := f.cache.get(key, time.Now()); ok {
		return m, nil
	}
	req := new(dns.Msg)
	req.SetQuestion(q.Name, q.Qtype)
	req.Question[0].Qclass = q.Qclass
	req.SetEdns0(dns.DefaultMsgSize, dnssec)
	last := errNoUpstream
	for _, up := range f.upstreams {
		resp, _, err := f.udp.Exchange(req, up)
		if err == nil && resp.Truncated {
			resp, _, err = f.tcp.Exchange(req, up)
		}
		if err != nil {
			last = fmt.Errorf("%s: %w", up, err)
			continue
		}
		if resp.Rcode == dns.RcodeServerFailure || resp.Rcode == dns.RcodeRefused {
			last = fmt.Errorf("%s: %s", up, dns.RcodeToString[resp.Rcode])
			continue
		}
		f.cache.put(key, resp, time.Now())
		return resp, nil
	}
	return nil, last
}

func cacheKey(q dns.Question, dnssec bool) string {
	return strings.ToLower(q.Name) + "/" + strconv.Itoa(int(q.Qtype)) + "/" + strconv.Itoa(int(q.Qclass)) + "/" + strconv.FormatBool(dnssec)
}

// The bounds on how long answers are kept: CoreDNS's cache plugin's
// defaults (an hour for positive answers, half that for negative ones).
const (
	maxPositiveTTL = time.Hour
	maxNegativeTTL = 30 * time.Minute
)

// cache keeps upstream answers until their TTL runs out, at most size of
// them (the oldest to expire go first when it is full).
type cache struct {
	mu      sync.Mutex
	size    int
	entries map[string]cached
}

type cached struct {
	msg             *dns.Msg
	stored, expires time.Time
}

func newCache(size int) *cache { return &cache{size: size, entries: map[string]cached{}} }

// get is a copy of the answer kept for key with its TTLs counted down.
func (c *cache) get(key string, now time.Time) (*dns.Msg, bool) {
	c.mu.Lock()
	e, ok := c.entries[key]
	if ok && !now.Before(e.expires) {
		delete(c.entries, key)
		ok = false
	}
	c.mu.Unlock()
	if !ok {
		return nil, false
	}
	m := e.msg.Copy()
	elapsed := uint32(now.Sub(e.stored) / time.Second)
	for _, section := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
		for _, rr := range section {
			if h := rr.Header(); h.Rrtype != dns.TypeOPT {
				h.Ttl -= min(h.Ttl, elapsed)
			}
		}
	}
	return m, true
}

// put keeps m for its TTL: its answers' least, or for a negative answer
// its SOA's minimum; an answer with a zero TTL is not kept.
func (c *cache) put(key string, m *dns.Msg, now time.Time) {
	ttl, ok := cacheTTL(m)
	if !ok || c.size <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, exists := c.entries[key]; !exists && len(c.entries) >= c.size {
		c.evict()
	}
	c.entries[key] = cached{msg: m.Copy(), stored: now, expires: now.Add(ttl)}
}

// evict makes room: the entry expiring soonest (an expired one, if the
// sample has one) among a sample of 16, a map's order being random; a
// full scan per insertion would cost 10,000 steps on every miss.
func (c *cache) evict() {
	var victim string
	var soonest time.Time
	n := 0
	for k, e := range c.entries {
		if victim == "" || e.expires.Before(soonest) {
			victim, soonest = k, e.expires
		}
		if n++; n == 16 {
			break
		}
	}
	delete(c.entries, victim)
}

func cacheTTL(m *dns.Msg) (time.Duration, bool) {
	if m.Rcode == dns.RcodeSuccess && len(m.Answer) > 0 {
		ttl := m.Answer[0].Header().Ttl
		for _, rr := range m.Answer[1:] {
			ttl = min(ttl, rr.Header().Ttl)
		}
		return min(time.Duration(ttl)*time.Second, maxPositiveTTL), ttl > 0
	}
	if m.Rcode != dns.RcodeSuccess && m.Rcode != dns.RcodeNameError {
		return 0, false
	}
	// Negative: NXDOMAIN or NODATA, kept for the SOA's minimum (RFC 2308).
	for _, rr := range m.Ns {
		if soa, ok := rr.(*dns.SOA); ok {
			ttl := min(soa.Minttl, soa.Hdr.Ttl)
			return min(time.Duration(ttl)*time.Second, maxNegativeTTL), ttl > 0
		}
	}
	return 0, false
}
