// Package dns is the cluster DNS every agent answers, Kubernetes' DNS
// specification (1.1.0) over the node's watch cache of Services and
// EndpointSlices, with every other name forwarded to the node's own
// resolvers through a cache. It answers from the cache it has when the
// API server is away.
package dns

import (
	"net/netip"
	"slices"
	"sort"
	"strings"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
)

// ttl is the cluster records' time to live, CoreDNS's default for its
// kubernetes plugin: short, as Services and pods come and go.
const ttl = 5

// specVersion is the DNS specification's version, the dns-version TXT
// record's answer.
const specVersion = "1.1.0"

// Cluster is the cluster state the zone answers from.
type Cluster interface {
	// Service is the Service namespace/name.
	Service(namespace, name string) (*corev1.Service, bool)
	// Slices are the Service's EndpointSlices.
	Slices(namespace, name string) []*discoveryv1.EndpointSlice
	// ServicesByIP are the Services whose cluster IP is ip.
	ServicesByIP(ip string) []*corev1.Service
	// SlicesByIP are the EndpointSlices with an endpoint at ip.
	SlicesByIP(ip string) []*discoveryv1.EndpointSlice
	// HasNamespace says whether a Service is in namespace.
	HasNamespace(namespace string) bool
}

// Zone answers for the cluster domain (cluster.local by default) and
// the reverse names of the cluster's Service and endpoint addresses.
type Zone struct {
	origin  string // "cluster.local."
	cluster Cluster
}

// NewZone answers for domain from cluster.
func NewZone(domain string, cluster Cluster) *Zone {
	return &Zone{origin: dns.Fqdn(strings.ToLower(domain)), cluster: cluster}
}

// Origin is the zone's name, with its final dot.
func (z *Zone) Origin() string { return z.origin }

// Result is what the zone says of a question.
type Result struct {
	Rcode int
	// Answer, and Extra for the additional section (SRV targets' A).
	Answer, Extra []dns.RR
	// CNAME is an ExternalName Service's target, which the server
	// resolves in turn.
	CNAME string
}

// Authoritative says whether the zone answers name: the cluster domain,
// and reverse names of addresses the cluster holds.
func (z *Zone) Authoritative(name string, qtype uint16) bool {
	name = strings.ToLower(name)
	if dns.IsSubDomain(z.origin, name) {
		return true
	}
	if qtype != dns.TypePTR {
		return false
	}
	ip, ok := reverseIP(name)
	if !ok {
		return false
	}
	return len(z.cluster.ServicesByIP(ip.String())) > 0 || len(z.cluster.SlicesByIP(ip.String())) > 0
}

// Answer answers q, which Authoritative said is the zone's.
func (z *Zone) Answer(q dns.Question) Result {
	name := strings.ToLower(q.Name)
	if q.Qtype == dns.TypePTR && !dns.IsSubDomain(z.origin, name) {
		return z.ptr(name)
	}
	labels := dns.SplitDomainName(strings.TrimSuffix(name, z.origin))
	switch {
	case len(labels) == 0:
		return z.apex(q)
	case len(labels) == 1 && labels[0] == "dns-version":
		if q.Qtype != dns.TypeTXT {
			return z.nodata()
		}
		return Result{Answer: []dns.RR{&dns.TXT{Hdr: hdr(q.Name, dns.TypeTXT), Txt: []string{specVersion}}}}
	case labels[len(labels)-1] == "svc":
		return z.service(q, labels[:len(labels)-1])
	case labels[len(labels)-1] == "pod":
		return z.pod(q, labels[:len(labels)-1])
	}
	return z.nxdomain()
}

func hdr(name string, t uint16) dns.RR_Header {
	return dns.RR_Header{Name: name, Rrtype: t, Class: dns.ClassINET, Ttl: ttl}
}

// soa is the zone's SOA record, in negative answers' authority section:
// its minimum is how long resolvers cache the negative answer.
func (z *Zone) soa() dns.RR {
	return &dns.SOA{Hdr: hdr(z.origin, dns.TypeSOA), Ns: "ns.dns." + z.origin, Mbox: "hostmaster." + z.origin,
		Serial: 1, Refresh: 7200, Retry: 1800, Expire: 86400, Minttl: ttl}
}

// The name exists without records of the type (NODATA), or not at all.
func (z *Zone) nodata() Result   { return Result{Rcode: dns.RcodeSuccess} }
func (z *Zone) nxdomain() Result { return Result{Rcode: dns.RcodeNameError} }

// apex answers the zone's own name: its SOA and NS.
func (z *Zone) apex(q dns.Question) Result {
	switch q.Qtype {
	case dns.TypeSOA:
		return Result{Answer: []dns.RR{z.soa()}}
	case dns.TypeNS:
		return Result{Answer: []dns.RR{&dns.NS{Hdr: hdr(z.origin, dns.TypeNS), Ns: "ns.dns." + z.origin}}}
	}
	return z.nodata()
}

// service answers <svc>.<ns>.svc, <endpoint>.<svc>.<ns>.svc and
// _<port>._<proto>.<svc>.<ns>.svc (labels without "svc").
func (z *Zone) service(q dns.Question, labels []string) Result {
	switch len(labels) {
	case 1: // <ns>.svc: a name when the namespace has Services
		if z.cluster.HasNamespace(labels[0]) {
			return z.nodata()
		}
		return z.nxdomain()
	case 2:
		svc, ok := z.cluster.Service(labels[1], labels[0])
		if !ok {
			return z.nxdomain()
		}
		return z.serviceRecords(q, svc)
	case 3:
		svc, ok := z.cluster.Service(labels[2], labels[1])
		if !ok || !headless(svc) {
			return z.nxdomain()
		}
		var addrs []string
		for _, e := range z.endpoints(svc) {
			if e.name == labels[0] {
				addrs = append(addrs, e.addr)
			}
		}
		if len(addrs) == 0 {
			return z.nxdomain()
		}
		return addressRecords(q, addrs)
	case 4:
		port, proto, ok := srvLabels(labels[0], labels[1])
		if !ok {
			return z.nxdomain()
		}
		svc, found := z.cluster.Service(labels[3], labels[2])
		if !found {
			return z.nxdomain()
		}
		return z.srv(q, svc, port, proto)
	}
	return z.nxdomain()
}

// srvLabels reads _<port>._<proto>.
func srvLabels(port, proto string) (string, corev1.Protocol, bool) {
	if !strings.HasPrefix(port, "_") || !strings.HasPrefix(proto, "_") {
		return "", "", false
	}
	p := corev1.Protocol(strings.ToUpper(proto[1:]))
	if p != corev1.ProtocolTCP && p != corev1.ProtocolUDP && p != corev1.ProtocolSCTP {
		return "", "", false
	}
	return port[1:], p, true
}

func headless(svc *corev1.Service) bool { return svc.Spec.ClusterIP == corev1.ClusterIPNone }

// serviceRecords answers a Service's own name: its cluster IP, its
// ready endpoints' addresses when headless, or a CNAME to its external
// name.
func (z *Zone) serviceRecords(q dns.Question, svc *corev1.Service) Result {
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		target := dns.Fqdn(strings.ToLower(svc.Spec.ExternalName))
		if _, ok := dns.IsDomainName(target); !ok || svc.Spec.ExternalName == "" {
			return z.nodata()
		}
		return Result{Answer: []dns.RR{&dns.CNAME{Hdr: hdr(q.Name, dns.TypeCNAME), Target: target}}, CNAME: target}
	}
	if headless(svc) {
		var addrs []string
		for _, e := range z.endpoints(svc) {
			if !slices.Contains(addrs, e.addr) {
				addrs = append(addrs, e.addr)
			}
		}
		return addressRecords(q, addrs)
	}
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	return addressRecords(q, ips)
}

// addressRecords are A or AAAA records of addrs for q's type; a name with
// addresses of the other family only has no data of this one.
func addressRecords(q dns.Question, addrs []string) Result {
	var out []dns.RR
	for _, a := range addrs {
		ip, err := netip.ParseAddr(a)
		if err != nil {
			continue
		}
		switch {
		case ip.Is4() && (q.Qtype == dns.TypeA || q.Qtype == dns.TypeANY):
			out = append(out, &dns.A{Hdr: hdr(q.Name, dns.TypeA), A: ip.AsSlice()})
		case ip.Is6() && (q.Qtype == dns.TypeAAAA || q.Qtype == dns.TypeANY):
			out = append(out, &dns.AAAA{Hdr: hdr(q.Name, dns.TypeAAAA), AAAA: ip.AsSlice()})
		}
	}
	return Result{Answer: out}
}

// endpoint is one address behind a headless Service, named as the
// specification says: its hostname, or its address with dashes.
type endpoint struct {
	name, addr string
	ports      []discoveryv1.EndpointPort
}

// endpoints are the Service's ready endpoints (all of them with
// publishNotReadyAddresses), deduplicated by address.
func (z *Zone) endpoints(svc *corev1.Service) []endpoint {
	var out []endpoint
	seen := map[string]bool{}
	for _, s := range z.cluster.Slices(svc.Namespace, svc.Name) {
		if s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		for _, e := range s.Endpoints {
			ready := e.Conditions.Ready == nil || *e.Conditions.Ready
			if (!ready && !svc.Spec.PublishNotReadyAddresses) || len(e.Addresses) == 0 || seen[e.Addresses[0]] {
				continue
			}
			seen[e.Addresses[0]] = true
			name := dashed(e.Addresses[0])
			if e.Hostname != nil && *e.Hostname != "" {
				name = strings.ToLower(*e.Hostname)
			}
			out = append(out, endpoint{name: name, addr: e.Addresses[0], ports: s.Ports})
		}
	}
	// sort.Slice, not slices.SortFunc: a generic sort of a struct type
	// costs the binary budget (design.md) some 13 KB.
	sort.Slice(out, func(i, j int) bool { return out[i].addr < out[j].addr })
	return out
}

// dashed is an address as a DNS label: 10.42.0.5 is 10-42-0-5.
func dashed(addr string) string { return dasher.Replace(addr) }

var dasher = strings.NewReplacer(".", "-", ":", "-")

// srv answers _<port>._<proto>.<svc>.<ns>.svc: the Service's name and
// port, or for a headless Service each endpoint's name and port, with
// their addresses in the additional section.
func (z *Zone) srv(q dns.Question, svc *corev1.Service, port string, proto corev1.Protocol) Result {
	if q.Qtype != dns.TypeSRV && q.Qtype != dns.TypeANY {
		return z.nodata()
	}
	svcName := svc.Name + "." + svc.Namespace + ".svc." + z.origin
	if !headless(svc) {
		for _, p := range svc.Spec.Ports {
			if p.Name == port && protocolOf(p.Protocol) == proto {
				target := addressRecords(dns.Question{Name: svcName, Qtype: dns.TypeA}, []string{svc.Spec.ClusterIP})
				return Result{Answer: []dns.RR{&dns.SRV{Hdr: hdr(q.Name, dns.TypeSRV), Priority: 0, Weight: 100, Port: uint16(p.Port), Target: svcName}},
					Extra: target.Answer}
			}
		}
		return z.nxdomain()
	}
	var out Result
	eps := z.endpoints(svc)
	for _, e := range eps {
		for _, p := range e.ports {
			if p.Name == nil || *p.Name != port || p.Port == nil || protocolOf(ptr.Deref(p.Protocol, "")) != proto {
				continue
			}
			target := e.name + "." + svcName
			out.Answer = append(out.Answer, &dns.SRV{Hdr: hdr(q.Name, dns.TypeSRV), Priority: 0, Weight: uint16(max(1, 100/len(eps))),
				Port: uint16(*p.Port), Target: target})
			out.Extra = append(out.Extra, addressRecords(dns.Question{Name: target, Qtype: dns.TypeANY}, []string{e.addr}).Answer...)
		}
	}
	if len(out.Answer) == 0 {
		return z.nxdomain()
	}
	return out
}

func protocolOf(p corev1.Protocol) corev1.Protocol {
	if p == "" {
		return corev1.ProtocolTCP
	}
	return p
}

// pod answers <a-b-c-d>.<ns>.pod with the address its name spells, as
// CoreDNS's "pods insecure" mode (kubeadm's and k3s's default) does.
func (z *Zone) pod(q dns.Question, labels []string) Result {
	if len(labels) != 2 {
		if len(labels) == 1 { // <ns>.pod
			return z.nodata()
		}
		return z.nxdomain()
	}
	addr := labels[0]
	if strings.Count(addr, "-") == 3 {
		addr = strings.ReplaceAll(addr, "-", ".")
	} else {
		addr = strings.ReplaceAll(addr, "-", ":")
	}
	if _, err := netip.ParseAddr(addr); err != nil {
		return z.nxdomain()
	}
	return addressRecords(q, []string{addr})
}

// ptr answers the reverse name of a Service's cluster IP (its name) or
// of a headless Service's endpoint (the endpoint's name under it).
func (z *Zone) ptr(name string) Result {
	ip, ok := reverseIP(name)
	if !ok {
		return z.nxdomain()
	}
	var out []dns.RR
	for _, svc := range z.cluster.ServicesByIP(ip.String()) {
		out = append(out, &dns.PTR{Hdr: hdr(name, dns.TypePTR), Ptr: svc.Name + "." + svc.Namespace + ".svc." + z.origin})
	}
	for _, s := range z.cluster.SlicesByIP(ip.String()) {
		svcName := s.Labels[discoveryv1.LabelServiceName]
		svc, ok := z.cluster.Service(s.Namespace, svcName)
		if !ok || !headless(svc) {
			continue
		}
		for _, e := range z.endpoints(svc) {
			if e.addr == ip.String() {
				out = append(out, &dns.PTR{Hdr: hdr(name, dns.TypePTR), Ptr: e.name + "." + svcName + "." + s.Namespace + ".svc." + z.origin})
			}
		}
	}
	if len(out) == 0 {
		return z.nxdomain()
	}
	return Result{Answer: out}
}

// reverseIP is the address a reverse (in-addr.arpa or ip6.arpa) name
// stands for.
func reverseIP(name string) (netip.Addr, bool) {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	if rest, ok := strings.CutSuffix(name, ".in-addr.arpa"); ok {
		parts := strings.Split(rest, ".")
		if len(parts) != 4 {
			return netip.Addr{}, false
		}
		slices.Reverse(parts)
		ip, err := netip.ParseAddr(strings.Join(parts, "."))
		return ip, err == nil && ip.Is4()
	}
	if rest, ok := strings.CutSuffix(name, ".ip6.arpa"); ok {
		nibbles := strings.Split(rest, ".")
		if len(nibbles) != 32 {
			return netip.Addr{}, false
		}
		slices.Reverse(nibbles)
		var b strings.Builder
		for i, n := range nibbles {
			if len(n) != 1 {
				return netip.Addr{}, false
			}
			if i > 0 && i%4 == 0 {
				b.WriteByte(':')
			}
			b.WriteString(n)
		}
		ip, err := netip.ParseAddr(b.String())
		return ip, err == nil && ip.Is6()
	}
	return netip.Addr{}, false
}
