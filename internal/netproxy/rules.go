package netproxy

import (
	"bytes"
	"crypto/sha256"
	"encoding/base32"
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The chains kube-proxy's iptables mode makes, with its names, so that
// iptables-save reads as on any Kubernetes node.
const (
	chainServices         = "KUBE-SERVICES"
	chainExternalServices = "KUBE-EXTERNAL-SERVICES"
	chainNodePorts        = "KUBE-NODEPORTS"
	chainPostrouting      = "KUBE-POSTROUTING"
	chainMarkMasq         = "KUBE-MARK-MASQ"
	chainForward          = "KUBE-FORWARD"
	chainFirewall         = "KUBE-FIREWALL"

	prefixService  = "KUBE-SVC-"
	prefixExternal = "KUBE-EXT-"
	prefixEndpoint = "KUBE-SEP-"
	prefixLocal    = "KUBE-SVL-"

	// masqMark marks packets to be masqueraded on their way out, as
	// kube-proxy's --iptables-masquerade-bit 14 does.
	masqMark = "0x4000"
)

// perServiceChain says whether chain is one of the chains the proxy
// makes for a Service port or endpoint.
func perServiceChain(chain string) bool {
	for _, prefix := range []string{prefixService, prefixExternal, prefixEndpoint, prefixLocal} {
		if strings.HasPrefix(chain, prefix) {
			return true
		}
	}
	return false
}

// servicePort is one port of one Service as the proxy programs it.
type servicePort struct {
	// name is Kubernetes' ServicePortName: "namespace/name" or
	// "namespace/name:port" for a named port.
	name      string
	service   types.NamespacedName
	protocol  corev1.Protocol
	clusterIP string
	port      int32
	nodePort  int32
	// externalIPs are more addresses the Service takes traffic on.
	externalIPs []string
	// affinitySeconds is ClientIP session affinity's timeout; 0 for none.
	affinitySeconds int32
	// externalLocal and internalLocal are the Local traffic policies.
	externalLocal, internalLocal bool
	endpoints                    []endpoint
}

// endpoint is one address behind a service port.
type endpoint struct {
	ip    string
	port  int32
	ready bool
	// serving is ready or, while terminating, still able to serve:
	// used only when no endpoint is ready, as kube-proxy does.
	serving     bool
	terminating bool
	// local is on this node.
	local bool
}

func (e endpoint) String() string { return e.ip + ":" + strconv.Itoa(int(e.port)) }

// hash is kube-proxy's chain suffix: the first 16 characters of the
// base32 SHA-256 of what names the chain.
func hash(parts ...string) string {
	sum := sha256.Sum256([]byte(strings.Join(parts, "")))
	return base32.StdEncoding.EncodeToString(sum[:])[:16]
}

func (sp *servicePort) proto() string { return strings.ToLower(string(sp.protocol)) }

func (sp *servicePort) serviceChain() string {
	return prefixService + hash(sp.name, sp.proto())
}

func (sp *servicePort) externalChain() string {
	return prefixExternal + hash(sp.name, sp.proto())
}

func (sp *servicePort) localChain() string {
	return prefixLocal + hash(sp.name, sp.proto())
}

func (sp *servicePort) endpointChain(e endpoint) string {
	return prefixEndpoint + hash(sp.name, sp.proto(), e.String())
}

// usable are the endpoints traffic goes to: the ready ones, or when none
// is, the terminating ones still serving, as kube-proxy picks them.
func (sp *servicePort) usable() []endpoint { return usable(sp.endpoints) }

// usableLocal are the usable endpoints on this node, picked among them
// alone.
func (sp *servicePort) usableLocal() []endpoint {
	var local []endpoint
	for _, e := range sp.endpoints {
		if e.local {
			local = append(local, e)
		}
	}
	return usable(local)
}

func usable(eps []endpoint) []endpoint {
	var ready, serving []endpoint
	for _, e := range eps {
		switch {
		case e.ready:
			ready = append(ready, e)
		case e.serving && e.terminating:
			serving = append(serving, e)
		}
	}
	if len(ready) > 0 {
		return ready
	}
	return serving
}

// node is what the rules need to know of the node they run on.
type node struct {
	// clusterCIDR is the pods' network: traffic to a ClusterIP from
	// outside it is masqueraded, so that replies come back this way.
	clusterCIDR string
}

// ruleSet is every rule of the proxy, by table and chain, and the
// proxy's chains that exist but are no longer wanted.
type ruleSet struct {
	nat, filter writer
	stale       []string
	// rules counts the rules, for the sync's log line.
	rules int
}

// writer holds one table's chains and their rules, in the order they
// were declared.
type writer struct {
	chains []string
	rules  map[string][]string
	// groups is the service port each per-Service chain belongs to, and
	// group the one whose chains are being declared.
	groups map[string]string
	group  string
}

func (w *writer) chain(name string) {
	if w.rules == nil {
		w.rules, w.groups = map[string][]string{}, map[string]string{}
	}
	if _, ok := w.rules[name]; !ok {
		w.rules[name] = []string{}
		w.chains = append(w.chains, name)
		if w.group != "" {
			w.groups[name] = w.group
		}
	}
}

// has says whether chain is declared.
func (w *writer) has(chain string) bool {
	_, ok := w.rules[chain]
	return ok
}

func (w *writer) rule(chain string, args ...string) {
	w.rules[chain] = append(w.rules[chain], "-A "+chain+" "+strings.Join(args, " "))
}

// digest stands for chain's rules, to compare with what was written
// before without keeping every rule's text.
func (w *writer) digest(chain string) uint64 {
	h := sha256.New()
	for _, r := range w.rules[chain] {
		h.Write([]byte(r))
		h.Write([]byte{'\n'})
	}
	return binary.BigEndian.Uint64(h.Sum(nil))
}

// restore is iptables-restore --noflush input for every chain: each
// declared, which flushes it, then its rules; stale chains flushed and
// deleted last.
func (w *writer) restore(table string, stale []string) []byte {
	return w.text(table, w.chains, stale)
}

func (w *writer) chosen(write func(chain string) bool) []string {
	var chosen []string
	for _, c := range w.chains {
		if write == nil || write(c) {
			chosen = append(chosen, c)
		}
	}
	return chosen
}

func (w *writer) text(table string, chains, stale []string) []byte {
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "*%s\n", table)
	for _, c := range append(slices.Clip(chains), stale...) {
		fmt.Fprintf(&buf, ":%s - [0:0]\n", c)
	}
	for _, c := range chains {
		for _, r := range w.rules[c] {
			buf.WriteString(r)
			buf.WriteByte('\n')
		}
	}
	for _, c := range stale {
		fmt.Fprintf(&buf, "-X %s\n", c)
	}
	buf.WriteString("COMMIT\n")
	return buf.Bytes()
}

// maxChainsPerRestore bounds the chains one iptables-restore writes in a
// large sync. iptables-nft's restore (1.8.9, Debian 12's) costs time
// that grows with the square of its transaction's chains: 1,000 Services
// of 10 endpoints (11,000 chains) took it 5 s in one transaction and a
// second in parts of this size; iptables-legacy is fast either way.
const maxChainsPerRestore = 1000

// restoreParts is restore's input split into transactions of at most
// about limit chains. Each service port's chains go together, so that a
// Service moves from its old rules to its new ones at once and its
// chains jump within their own part (iptables-nft is slow at jumps to
// chains outside the transaction); the top-level chains, which jump to
// them, and the deletion of stale chains, once nothing jumps to them, go
// in the last part.
func (w *writer) restoreParts(table string, write func(chain string) bool, stale []string, limit int) [][]byte {
	chosen := w.chosen(write)
	if len(chosen)+len(stale) <= limit {
		return [][]byte{w.text(table, chosen, stale)}
	}
	var order []string
	byGroup := map[string][]string{}
	var last []string
	for _, c := range chosen {
		g, ok := w.groups[c]
		if !ok {
			last = append(last, c)
			continue
		}
		if _, seen := byGroup[g]; !seen {
			order = append(order, g)
		}
		byGroup[g] = append(byGroup[g], c)
	}
	var parts [][]byte
	var part []string
	for _, g := range order {
		if len(part) > 0 && len(part)+len(byGroup[g]) > limit {
			parts = append(parts, w.text(table, part, nil))
			part = nil
		}
		part = append(part, byGroup[g]...)
	}
	return append(parts, w.text(table, append(part, last...), stale))
}

// natText and filterText are the whole tables' restore input.
func (rs *ruleSet) natText() []byte    { return rs.nat.restore("nat", rs.stale) }
func (rs *ruleSet) filterText() []byte { return rs.filter.restore("filter", nil) }

// comment is an iptables comment match, quoted as iptables-save quotes it.
func comment(text string) string { return `-m comment --comment "` + text + `"` }

// buildRules is every rule of the proxy for ports, as kube-proxy's full
// sync writes them; existing are the KUBE- chains now in the nat table,
// those no longer wanted are deleted.
func buildRules(n node, ports []*servicePort, existing []string) *ruleSet {
	slices.SortFunc(ports, func(a, b *servicePort) int { return strings.Compare(a.name+a.proto(), b.name+b.proto()) })
	var nat, filter writer
	nat.chain(chainServices)
	nat.chain(chainNodePorts)
	nat.chain(chainPostrouting)
	nat.chain(chainMarkMasq)
	filter.chain(chainServices)
	filter.chain(chainExternalServices)
	filter.chain(chainForward)
	filter.chain(chainNodePorts)
	filter.chain(chainFirewall)

	// Traffic marked on its way in leaves masqueraded as the node.
	nat.rule(chainPostrouting, "-m mark ! --mark "+masqMark+"/"+masqMark, "-j RETURN")
	nat.rule(chainPostrouting, "-j MARK --xor-mark "+masqMark)
	nat.rule(chainPostrouting, comment("kubernetes service traffic requiring SNAT"), "-j MASQUERADE --random-fully")
	nat.rule(chainMarkMasq, "-j MARK --or-mark "+masqMark)

	// Forwarded service traffic is let through whatever the host's
	// FORWARD policy; invalid packets are dropped before conntrack can
	// mistake them for new connections (kube-proxy's fix for spurious
	// resets).
	filter.rule(chainForward, "-m conntrack --ctstate INVALID", "-j DROP")
	filter.rule(chainForward, comment("kubernetes forwarding rules"), "-m mark --mark "+masqMark+"/"+masqMark, "-j ACCEPT")
	filter.rule(chainForward, comment("kubernetes forwarding conntrack rule"), "-m conntrack --ctstate RELATED,ESTABLISHED", "-j ACCEPT")

	// Node ports answer on 127.0.0.1 too (route_localnet, which the
	// agent turns on as kube-proxy does); packets for 127.0.0.0/8 that
	// come from elsewhere, which route_localnet would let in, are
	// dropped unless a Service's DNAT made them (CVE-2020-8558's fix).
	filter.rule(chainFirewall, comment("block incoming localnet connections"), "-d 127.0.0.0/8", "! -s 127.0.0.0/8",
		"-m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT", "-j DROP")

	for _, sp := range ports {
		nat.group = sp.name
		portRules(&nat, &filter, n, sp)
	}
	nat.group = ""
	// Node ports last: anything addressed to the node itself.
	nat.rule(chainServices, comment("kubernetes service nodeports; NOTE: this must be the last rule in this chain"), "-m addrtype --dst-type LOCAL", "-j "+chainNodePorts)

	wanted := map[string]bool{}
	for _, c := range nat.chains {
		wanted[c] = true
	}
	var stale []string
	for _, c := range existing {
		if !wanted[c] && perServiceChain(c) {
			stale = append(stale, c)
		}
	}
	slices.Sort(stale)
	rs := &ruleSet{nat: nat, filter: filter, stale: stale}
	for _, w := range []*writer{&nat, &filter} {
		for _, rules := range w.rules {
			rs.rules += len(rules)
		}
	}
	return rs
}

// portRules are one service port's rules. Traffic to the ClusterIP goes
// to the Service's chain (KUBE-SVC-*, every usable endpoint), or with
// internalTrafficPolicy Local to its local chain (KUBE-SVL-*, this node's
// endpoints only); traffic to node ports and external IPs goes through
// KUBE-EXT-*, which masquerades it and goes to the Service's chain, or
// with externalTrafficPolicy Local keeps the client's address and goes to
// this node's endpoints (pods and the node itself still reach all). With
// no endpoint to go to, connections are refused (or, for Local policies
// with endpoints elsewhere only, dropped), as kube-proxy does.
func portRules(nat, filter *writer, n node, sp *servicePort) {
	proto := sp.proto()
	port := func(p int32) string { return "--dport " + strconv.Itoa(int(p)) }
	match := func(dest string, p int32, what string) []string {
		return []string{"-d " + dest + "/32", "-p " + proto, comment(sp.name + " " + what), "-m " + proto, port(p)}
	}
	all, local := sp.usable(), sp.usableLocal()
	external, usesSVC, usesSVL := sp.plan()
	refuse := func(chain, dest string, p int32, why, target string) {
		args := []string{"-p " + proto, comment(sp.name + " " + why), "-m " + proto, port(p), target}
		if dest == "" {
			args = append([]string{"-m addrtype --dst-type LOCAL"}, args...)
		} else {
			args = append([]string{"-d " + dest + "/32"}, args...)
		}
		filter.rule(chain, args...)
	}
	const reject, drop = "-j REJECT --reject-with icmp-port-unreachable", "-j DROP"
	if len(all) == 0 {
		refuse(chainServices, sp.clusterIP, sp.port, "has no endpoints", reject)
		for _, ip := range sp.externalIPs {
			refuse(chainExternalServices, ip, sp.port, "has no endpoints", reject)
		}
		if sp.nodePort != 0 {
			refuse(chainExternalServices, "", sp.nodePort, "has no endpoints", reject)
		}
		return
	}
	svc, svl := sp.serviceChain(), sp.localChain()
	if usesSVC {
		nat.chain(svc)
	}
	if usesSVL {
		nat.chain(svl)
	}

	// The ClusterIP. Traffic to it from outside the pod network (the node
	// itself, a host-network pod) is marked for masquerading, before the
	// jump to an endpoint, so that a pod on another node replies through
	// this one.
	internal := svc
	if sp.internalLocal {
		internal = svl
	}
	if sp.internalLocal && len(local) == 0 {
		refuse(chainServices, sp.clusterIP, sp.port, "has no local endpoints", drop)
	} else {
		nat.rule(chainServices, append(match(sp.clusterIP, sp.port, "cluster IP"), "-j "+internal)...)
		nat.rule(internal, "! -s "+n.clusterCIDR, "-d "+sp.clusterIP+"/32", "-p "+proto, comment(sp.name+" cluster IP"), "-m "+proto, port(sp.port), "-j "+chainMarkMasq)
	}
	if usesSVC {
		dispatch(nat, sp, svc, all)
	}
	if usesSVL {
		dispatch(nat, sp, svl, local)
	}
	if !external {
		return
	}
	ext := sp.externalChain()
	nat.chain(ext)
	if !sp.externalLocal {
		nat.rule(ext, comment("masquerade traffic for "+sp.name+" external destinations"), "-j "+chainMarkMasq)
		nat.rule(ext, "-j "+svc)
	} else {
		// Pods and the node itself reach every endpoint; clients from
		// outside only this node's, keeping their address.
		nat.rule(ext, comment("pod traffic for "+sp.name+" external destinations"), "-s "+n.clusterCIDR, "-j "+svc)
		nat.rule(ext, comment("masquerade LOCAL traffic for "+sp.name+" external destinations"), "-m addrtype --src-type LOCAL", "-j "+chainMarkMasq)
		nat.rule(ext, comment("route LOCAL traffic for "+sp.name+" external destinations"), "-m addrtype --src-type LOCAL", "-j "+svc)
		if len(local) > 0 {
			nat.rule(ext, "-j "+svl)
		} else {
			for _, ip := range sp.externalIPs {
				refuse(chainExternalServices, ip, sp.port, "has no local endpoints", drop)
			}
			if sp.nodePort != 0 {
				refuse(chainExternalServices, "", sp.nodePort, "has no local endpoints", drop)
			}
		}
	}
	for _, ip := range sp.externalIPs {
		nat.rule(chainServices, append(match(ip, sp.port, "external IP"), "-j "+ext)...)
	}
	if sp.nodePort != 0 {
		nat.rule(chainNodePorts, "-p "+proto, comment(sp.name), "-m "+proto, port(sp.nodePort), "-j "+ext)
	}
}

// plan says what a port's rules need: whether it takes traffic from
// outside (a node port, external IPs), the Service's chain (every usable
// endpoint: ClusterIP traffic under the Cluster policy, and external
// traffic from pods and the node) and its local chain (this node's
// endpoints: a Local policy's, when it has some).
func (sp *servicePort) plan() (external, usesCluster, usesLocal bool) {
	external = len(sp.externalIPs) > 0 || sp.nodePort != 0
	usesCluster = !sp.internalLocal || external
	usesLocal = (sp.internalLocal || sp.externalLocal && external) && len(sp.usableLocal()) > 0
	return external, usesCluster, usesLocal
}

// dispatch writes chain's spread over eps and the endpoints' own chains:
// with ClientIP affinity a client seen lately goes where it went; then
// each endpoint in turn takes 1/(those left) of what comes, an even
// spread, as kube-proxy's random mode.
func dispatch(nat *writer, sp *servicePort, chain string, eps []endpoint) {
	proto := sp.proto()
	if sp.affinitySeconds > 0 {
		for _, e := range eps {
			sep := sp.endpointChain(e)
			nat.rule(chain, comment(sp.name+" -> "+e.String()), "-m recent --name "+sep+" --mask 255.255.255.255 --rsource --rcheck --seconds "+strconv.Itoa(int(sp.affinitySeconds))+" --reap", "-j "+sep)
		}
	}
	for i, e := range eps {
		sep := sp.endpointChain(e)
		args := []string{comment(sp.name + " -> " + e.String())}
		if left := len(eps) - i; left > 1 {
			args = append(args, "-m statistic --mode random --probability "+probability(left))
		}
		nat.rule(chain, append(args, "-j "+sep)...)
		if nat.has(sep) {
			continue // written for the other chain already
		}
		nat.chain(sep)
		// A pod reaching itself through its Service (hairpin) is
		// masqueraded, or its reply would skip the DNAT's undoing.
		nat.rule(sep, "-s "+e.ip+"/32", comment(sp.name), "-j "+chainMarkMasq)
		dnat := []string{"-p " + proto, comment(sp.name)}
		if sp.affinitySeconds > 0 {
			dnat = append(dnat, "-m recent --name "+sep+" --mask 255.255.255.255 --rsource --set")
		}
		nat.rule(sep, append(dnat, "-m "+proto, "-j DNAT --to-destination "+e.String())...)
	}
}

// probability is kube-proxy's statistic match probability for an
// endpoint with n left: 1/n with ten decimals.
func probability(n int) string {
	return fmt.Sprintf("%0.10f", 1.0/float64(n))
}

// jumps are the rules in the built-in chains that lead to the proxy's,
// kept in place with EnsureRule (table, chain, rule).
var jumps = []struct {
	table, chain string
	rule         []string
}{
	{"nat", "PREROUTING", []string{"-m", "comment", "--comment", "kubernetes service portals", "-j", chainServices}},
	{"nat", "OUTPUT", []string{"-m", "comment", "--comment", "kubernetes service portals", "-j", chainServices}},
	{"nat", "POSTROUTING", []string{"-m", "comment", "--comment", "kubernetes postrouting rules", "-j", chainPostrouting}},
	{"filter", "INPUT", []string{"-m", "conntrack", "--ctstate", "NEW", "-m", "comment", "--comment", "kubernetes externally-visible service portals", "-j", chainExternalServices}},
	{"filter", "FORWARD", []string{"-m", "comment", "--comment", "kubernetes forwarding rules", "-j", chainForward}},
	{"filter", "FORWARD", []string{"-m", "conntrack", "--ctstate", "NEW", "-m", "comment", "--comment", "kubernetes service portals", "-j", chainServices}},
	{"filter", "FORWARD", []string{"-m", "conntrack", "--ctstate", "NEW", "-m", "comment", "--comment", "kubernetes externally-visible service portals", "-j", chainExternalServices}},
	{"filter", "OUTPUT", []string{"-m", "conntrack", "--ctstate", "NEW", "-m", "comment", "--comment", "kubernetes service portals", "-j", chainServices}},
	{"filter", "INPUT", []string{"-j", chainFirewall}},
	{"filter", "OUTPUT", []string{"-j", chainFirewall}},
}
