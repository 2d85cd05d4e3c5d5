package netproxy

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/orch-dev/orch/internal/iptables"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

func webPort(eps ...endpoint) *servicePort {
	return &servicePort{name: "default/web:http", service: types.NamespacedName{Namespace: "default", Name: "web"},
		protocol: corev1.ProtocolTCP, clusterIP: "10.43.0.10", port: 80, endpoints: eps}
}

func lines(b []byte) []string { return strings.Split(strings.TrimSpace(string(b)), "\n") }

func has(t *testing.T, table []byte, want ...string) {
	t.Helper()
	got := lines(table)
	for _, w := range want {
		found := false
		for _, l := range got {
			if l == w {
				found = true
			}
		}
		if !found {
			t.Errorf("no line\n  %s\nin\n  %s", w, strings.Join(got, "\n  "))
		}
	}
}

func hasNo(t *testing.T, table []byte, substr string) {
	t.Helper()
	for _, l := range lines(table) {
		if strings.Contains(l, substr) {
			t.Errorf("unexpected line %s", l)
		}
	}
}

// TestChainNames: kube-proxy's names, so that what users read in
// iptables-save matches what guides and kube-proxy's own tests show.
// (The expected names are kube-proxy's for the same service port.)
func TestChainNames(t *testing.T) {
	sp := &servicePort{name: "ns1/svc1:p80", protocol: corev1.ProtocolTCP}
	if got, want := sp.serviceChain(), "KUBE-SVC-XPGD46QRK7WJZT7O"; got != want {
		t.Errorf("service chain %s, want %s", got, want)
	}
	if got, want := sp.externalChain(), "KUBE-EXT-XPGD46QRK7WJZT7O"; got != want {
		t.Errorf("external chain %s, want %s", got, want)
	}
	if got, want := sp.endpointChain(endpoint{ip: "10.180.0.1", port: 80}), "KUBE-SEP-SXIVWICOYRO3J4NJ"; got != want {
		t.Errorf("endpoint chain %s, want %s", got, want)
	}
}

// TestClusterIP: a ClusterIP spreads over its ready endpoints evenly
// (1/3, 1/2, the rest), DNATs to each, masquerades traffic from outside
// the pod network and a pod's traffic to itself.
func TestClusterIP(t *testing.T) {
	sp := webPort(endpoint{ip: "10.42.0.5", port: 8080, ready: true}, endpoint{ip: "10.42.1.7", port: 8080, ready: true}, endpoint{ip: "10.42.2.9", port: 8080, ready: true})
	rs := buildRules(node{clusterCIDR: "10.42.0.0/16"}, []*servicePort{sp}, nil)
	svc := sp.serviceChain()
	sep := func(i int) string { return sp.endpointChain(sp.endpoints[i]) }
	has(t, rs.natText(),
		"*nat",
		":"+svc+" - [0:0]",
		`-A KUBE-SERVICES -d 10.43.0.10/32 -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j `+svc,
		`-A `+svc+` ! -s 10.42.0.0/16 -d 10.43.0.10/32 -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ`,
		`-A `+svc+` -m comment --comment "default/web:http -> 10.42.0.5:8080" -m statistic --mode random --probability 0.3333333333 -j `+sep(0),
		`-A `+svc+` -m comment --comment "default/web:http -> 10.42.1.7:8080" -m statistic --mode random --probability 0.5000000000 -j `+sep(1),
		`-A `+svc+` -m comment --comment "default/web:http -> 10.42.2.9:8080" -j `+sep(2),
		`-A `+sep(0)+` -s 10.42.0.5/32 -m comment --comment "default/web:http" -j KUBE-MARK-MASQ`,
		`-A `+sep(0)+` -p tcp -m comment --comment "default/web:http" -m tcp -j DNAT --to-destination 10.42.0.5:8080`,
		`-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS`,
		`-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`,
		"COMMIT")
	hasNo(t, rs.filterText(), "REJECT")
	// The mark for masquerading comes before the jumps to endpoints (the
	// last of which takes every packet left): the node's own connections
	// to a pod on another node must leave as the node.
	var order []string
	for _, l := range lines(rs.natText()) {
		if strings.HasPrefix(l, "-A "+svc+" ") {
			order = append(order, l)
		}
	}
	if len(order) != 4 || !strings.HasSuffix(order[0], "-j KUBE-MARK-MASQ") {
		t.Errorf("%s's rules in order:\n%s", svc, strings.Join(order, "\n"))
	}
	// The node ports jump stays last in KUBE-SERVICES.
	var last string
	for _, l := range lines(rs.natText()) {
		if strings.HasPrefix(l, "-A KUBE-SERVICES ") {
			last = l
		}
	}
	if !strings.Contains(last, "-j KUBE-NODEPORTS") {
		t.Errorf("last KUBE-SERVICES rule %q, want the node ports jump", last)
	}
}

// TestSCTP: SCTP ports get the rules TCP ports get, with SCTP's match
// and their own chains (the protocol is in kube-proxy's chain hash).
// TestDatapath has the kernel take them; SCTP traffic needs the kernel's
// sctp module, which test machines may lack.
func TestSCTP(t *testing.T) {
	sp := webPort(endpoint{ip: "10.42.0.5", port: 8080, ready: true})
	sp.protocol = corev1.ProtocolSCTP
	tcp := webPort()
	if sp.serviceChain() == tcp.serviceChain() {
		t.Errorf("SCTP and TCP ports of one name share the chain %s", sp.serviceChain())
	}
	rs := buildRules(node{clusterCIDR: "10.42.0.0/16"}, []*servicePort{sp}, nil)
	has(t, rs.natText(),
		`-A KUBE-SERVICES -d 10.43.0.10/32 -p sctp -m comment --comment "default/web:http cluster IP" -m sctp --dport 80 -j `+sp.serviceChain(),
		`-A `+sp.endpointChain(sp.endpoints[0])+` -p sctp -m comment --comment "default/web:http" -m sctp -j DNAT --to-destination 10.42.0.5:8080`)
}

// TestNoEndpoints: a Service with no endpoint to take its traffic refuses
// connections at once (ICMP port unreachable), on its ClusterIP and its
// node port, and has no DNAT; terminating endpoints still serving take
// traffic only when no endpoint is ready.
func TestNoEndpoints(t *testing.T) {
	sp := webPort(endpoint{ip: "10.42.0.5", port: 8080, ready: false})
	sp.nodePort = 30080
	rs := buildRules(node{clusterCIDR: "10.42.0.0/16"}, []*servicePort{sp}, nil)
	has(t, rs.filterText(),
		`-A KUBE-SERVICES -d 10.43.0.10/32 -p tcp -m comment --comment "default/web:http has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable`,
		`-A KUBE-EXTERNAL-SERVICES -m addrtype --dst-type LOCAL -p tcp -m comment --comment "default/web:http has no endpoints" -m tcp --dport 30080 -j REJECT --reject-with icmp-port-unreachable`)
	hasNo(t, rs.natText(), "DNAT")

	terminating := webPort(endpoint{ip: "10.42.0.5", port: 8080, serving: true, terminating: true})
	rs = buildRules(node{clusterCIDR: "10.42.0.0/16"}, []*servicePort{terminating}, nil)
	has(t, rs.natText(), `-A `+terminating.endpointChain(terminating.endpoints[0])+` -p tcp -m comment --comment "default/web:http" -m tcp -j DNAT --to-destination 10.42.0.5:8080`)

	mixed := webPort(endpoint{ip: "10.42.0.5", port: 8080, serving: true, terminating: true}, endpoint{ip: "10.42.0.6", port: 8080, ready: true, serving: true})
	rs = buildRules(node{clusterCIDR: "10.42.0.0/16"}, []*servicePort{mixed}, nil)
	hasNo(t, rs.natText(), "10.42.0.5:8080")
}

// TestNodePortAndExternalIPs: node ports on every local address and
// external IPs go through the Service's KUBE-EXT chain, masqueraded
// (externalTrafficPolicy Cluster).
func TestNodePortAndExternalIPs(t *testing.T) {
	sp := webPort(endpoint{ip: "10.42.0.5", port: 8080, ready: true})
	sp.nodePort, sp.externalIPs = 30080, []string{"192.0.2.50"}
	rs := buildRules(node{clusterCIDR: "10.42.0.0/16"}, []*servicePort{sp}, nil)
	ext, svc := sp.externalChain(), sp.serviceChain()
	has(t, rs.natText(),
		`-A KUBE-NODEPORTS -p tcp -m comment --comment "default/web:http" -m tcp --dport 30080 -j `+ext,
		`-A KUBE-SERVICES -d 192.0.2.50/32 -p tcp -m comment --comment "default/web:http external IP" -m tcp --dport 80 -j `+ext,
		`-A `+ext+` -m comment --comment "masquerade traffic for default/web:http external destinations" -j KUBE-MARK-MASQ`,
		`-A `+ext+` -j `+svc)
}

// TestSessionAffinity: ClientIP affinity sends a client seen within the
// timeout back to the endpoint it had.
func TestSessionAffinity(t *testing.T) {
	sp := webPort(endpoint{ip: "10.42.0.5", port: 8080, ready: true})
	sp.affinitySeconds = 600
	rs := buildRules(node{clusterCIDR: "10.42.0.0/16"}, []*servicePort{sp}, nil)
	sep := sp.endpointChain(sp.endpoints[0])
	has(t, rs.natText(),
		`-A `+sp.serviceChain()+` -m comment --comment "default/web:http -> 10.42.0.5:8080" -m recent --name `+sep+` --mask 255.255.255.255 --rsource --rcheck --seconds 600 --reap -j `+sep,
		`-A `+sep+` -p tcp -m comment --comment "default/web:http" -m recent --name `+sep+` --mask 255.255.255.255 --rsource --set -m tcp -j DNAT --to-destination 10.42.0.5:8080`)
}

// TestStaleChains: the chains of Services and endpoints gone are flushed
// and deleted; the proxy's own and other programs' chains are left alone.
func TestStaleChains(t *testing.T) {
	sp := webPort(endpoint{ip: "10.42.0.5", port: 8080, ready: true})
	existing := []string{"PREROUTING", "KUBE-SERVICES", sp.serviceChain(), "KUBE-SVC-GONEGONEGONEGONE", "KUBE-SEP-GONEGONEGONEGONE", "DOCKER"}
	rs := buildRules(node{clusterCIDR: "10.42.0.0/16"}, []*servicePort{sp}, existing)
	has(t, rs.natText(), ":KUBE-SVC-GONEGONEGONEGONE - [0:0]", "-X KUBE-SVC-GONEGONEGONEGONE", "-X KUBE-SEP-GONEGONEGONEGONE")
	hasNo(t, rs.natText(), "-X "+sp.serviceChain())
	hasNo(t, rs.natText(), "DOCKER")
}

// TestTrafficPolicyLocal: externalTrafficPolicy Local keeps an outside
// client's address and sends it only to this node's endpoints (pods and
// the node itself still reach all, masqueraded as Cluster would);
// internalTrafficPolicy Local keeps ClusterIP traffic on the node. With
// no local endpoint that traffic is dropped, not sent elsewhere.
func TestTrafficPolicyLocal(t *testing.T) {
	eps := []endpoint{{ip: "10.42.0.5", port: 8080, ready: true, local: true}, {ip: "10.42.1.7", port: 8080, ready: true}}
	sp := webPort(eps...)
	sp.nodePort, sp.externalLocal = 30080, true
	rs := buildRules(node{clusterCIDR: "10.42.0.0/16"}, []*servicePort{sp}, nil)
	ext, svc, svl := sp.externalChain(), sp.serviceChain(), sp.localChain()
	has(t, rs.natText(),
		`-A `+ext+` -m comment --comment "pod traffic for default/web:http external destinations" -s 10.42.0.0/16 -j `+svc,
		`-A `+ext+` -m comment --comment "masquerade LOCAL traffic for default/web:http external destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ`,
		`-A `+ext+` -m comment --comment "route LOCAL traffic for default/web:http external destinations" -m addrtype --src-type LOCAL -j `+svc,
		`-A `+ext+` -j `+svl,
		`-A `+svl+` -m comment --comment "default/web:http -> 10.42.0.5:8080" -j `+sp.endpointChain(eps[0]),
		`-A KUBE-SERVICES -d 10.43.0.10/32 -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j `+svc)
	for _, l := range lines(rs.natText()) {
		if strings.HasPrefix(l, "-A "+svl+" ") && strings.Contains(l, "10.42.1.7") {
			t.Errorf("the local chain sends to another node's endpoint: %s", l)
		}
		if strings.HasPrefix(l, "-A "+ext+" ") && strings.Contains(l, "KUBE-MARK-MASQ") && !strings.Contains(l, "--src-type LOCAL") {
			t.Errorf("outside clients masqueraded under Local: %s", l)
		}
	}

	internal := webPort(eps...)
	internal.internalLocal = true
	rs = buildRules(node{clusterCIDR: "10.42.0.0/16"}, []*servicePort{internal}, nil)
	has(t, rs.natText(), `-A KUBE-SERVICES -d 10.43.0.10/32 -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j `+internal.localChain())
	hasNo(t, rs.natText(), ":"+internal.serviceChain())

	remote := webPort(endpoint{ip: "10.42.1.7", port: 8080, ready: true})
	remote.internalLocal, remote.externalLocal, remote.nodePort = true, true, 30080
	rs = buildRules(node{clusterCIDR: "10.42.0.0/16"}, []*servicePort{remote}, nil)
	has(t, rs.filterText(),
		`-A KUBE-SERVICES -d 10.43.0.10/32 -p tcp -m comment --comment "default/web:http has no local endpoints" -m tcp --dport 80 -j DROP`,
		`-A KUBE-EXTERNAL-SERVICES -m addrtype --dst-type LOCAL -p tcp -m comment --comment "default/web:http has no local endpoints" -m tcp --dport 30080 -j DROP`)
	hasNo(t, rs.natText(), ":"+remote.localChain())
}

type forgotten []string

func (f *forgotten) ForgetUDP(dst net.IP, port uint16, endpoint net.IP) error {
	*f = append(*f, fmt.Sprintf("%v:%d<-%v", dst, port, endpoint))
	return nil
}

// TestForgetRemovedUDP: when a UDP endpoint goes, what it answered on the
// ClusterIP, the external IPs and the node port is forgotten, and nothing
// of the endpoints that stay or of TCP Services.
func TestForgetRemovedUDP(t *testing.T) {
	dns := &servicePort{name: "kube-system/dns:dns", protocol: corev1.ProtocolUDP, clusterIP: "10.43.0.10", port: 53, nodePort: 30053,
		externalIPs: []string{"192.0.2.50"}, endpoints: []endpoint{{ip: "10.42.0.5", port: 53, ready: true}, {ip: "10.42.0.6", port: 53, ready: true}}}
	tcp := webPort(endpoint{ip: "10.42.0.7", port: 8080, ready: true})
	before := udpState([]*servicePort{dns, tcp})
	dns.endpoints = dns.endpoints[1:]
	tcp.endpoints = nil
	var f forgotten
	if err := forgetRemoved(&f, before, udpState([]*servicePort{dns, tcp})); err != nil {
		t.Fatal(err)
	}
	want := []string{"10.43.0.10:53<-10.42.0.5", "192.0.2.50:53<-10.42.0.5", "<nil>:30053<-10.42.0.5"}
	if !slices.Equal(f, want) {
		t.Errorf("forgot %q, want %q", f, want)
	}
}

// TestRestoreInParts: a sync split into transactions (iptables-nft's
// restore is quadratic in a transaction's chains) leaves the tables as
// one transaction would, each part jumping only to chains that exist by
// then (the fake refuses a jump to a missing chain), stale chains deleted
// last, over an empty table and over one holding an older rule set.
func TestRestoreInParts(t *testing.T) {
	build := func(services, endpoints int, existing []string) *ruleSet {
		var ports []*servicePort
		for i := range services {
			sp := webPort()
			sp.name, sp.clusterIP, sp.nodePort = fmt.Sprintf("default/web-%d:http", i), fmt.Sprintf("10.43.0.%d", i+1), int32(30000+i)
			for j := range endpoints {
				sp.endpoints = append(sp.endpoints, endpoint{ip: fmt.Sprintf("10.42.%d.%d", j, i+1), port: 8080, ready: true})
			}
			ports = append(ports, sp)
		}
		return buildRules(node{clusterCIDR: "10.42.0.0/16"}, ports, existing)
	}
	whole, split := iptables.NewFake(), iptables.NewFake()
	for _, ipt := range []*iptables.Fake{whole, split} {
		for _, c := range []string{chainServices, chainNodePorts, chainPostrouting, chainMarkMasq} {
			if err := ipt.EnsureChain("nat", c); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, step := range []struct{ services, endpoints int }{{30, 3}, {20, 2}} {
		existing, err := split.Chains("nat")
		if err != nil {
			t.Fatal(err)
		}
		rs := build(step.services, step.endpoints, existing)
		if len(rs.stale) == 0 && step.services == 20 {
			t.Fatal("the smaller rule set leaves no stale chains to delete")
		}
		if err := whole.Restore("nat", rs.natText()); err != nil {
			t.Fatal(err)
		}
		parts := rs.nat.restoreParts("nat", nil, rs.stale, 7)
		if len(parts) < 5 {
			t.Fatalf("%d parts, want many of at most 7 chains", len(parts))
		}
		for i, part := range parts {
			if err := split.Restore("nat", part); err != nil {
				t.Fatalf("part %d of %d: %v", i+1, len(parts), err)
			}
		}
		wantChains, _ := whole.Chains("nat")
		gotChains, _ := split.Chains("nat")
		if !slices.Equal(gotChains, wantChains) {
			t.Fatalf("%d services: chains in parts\n%q\nwant\n%q", step.services, gotChains, wantChains)
		}
		for _, c := range wantChains {
			want, _ := whole.Rules("nat", c)
			got, _ := split.Rules("nat", c)
			if !slices.Equal(got, want) {
				t.Errorf("%d services: chain %s in parts\n%q\nwant\n%q", step.services, c, got, want)
			}
		}
	}
}
