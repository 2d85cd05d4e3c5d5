package netproxy

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/knftables"
)

// The nftables mode writes kube-proxy's nftables layout (GA in Kubernetes
// 1.33), with its names, in a table of its own, "ip kube-proxy": verdict
// maps from a Service's address, protocol and port to its chain instead
// of a rule per Service, a numgen vmap spreading connections over the
// endpoints' chains, one transaction per sync. Unlike the iptables mode it
// takes no node ports on 127.0.0.1, as kube-proxy's nftables mode does
// not (it would need route_localnet).
const (
	nftTable = "kube-proxy"

	nftServices              = "services"
	nftMasquerading          = "masquerading"
	nftMarkForMasquerade     = "mark-for-masquerade"
	nftServiceEndpointsCheck = "service-endpoints-check"
	nftNodePortEndpoints     = "nodeport-endpoints-check"
	nftClusterIPsCheck       = "cluster-ips-check"
	nftRejectChain           = "reject-chain"

	nftServiceIPs          = "service-ips"           // address . protocol . port : verdict
	nftServiceNodePorts    = "service-nodeports"     // protocol . port : verdict
	nftNoEndpointServices  = "no-endpoint-services"  // address . protocol . port : verdict
	nftNoEndpointNodePorts = "no-endpoint-nodeports" // protocol . port : verdict
	nftClusterIPs          = "cluster-ips"           // set of addresses

	nftPrefixService  = "service-"
	nftPrefixLocal    = "local-"
	nftPrefixExternal = "external-"
	nftPrefixEndpoint = "endpoint-"
	nftPrefixAffinity = "affinity-"
)

// nftBaseChain is a chain the kernel's hooks call.
type nftBaseChain struct {
	name     string
	typ      knftables.BaseChainType
	hook     knftables.BaseChainHook
	priority knftables.BaseChainPriority
	rules    []string
}

// nftBaseChains are kube-proxy's: the filter chains run just before
// iptables' filter table (priority filter-10), the checks after DNAT's
// at dstnat+10.
var nftBaseChains = []nftBaseChain{
	{"filter-forward", knftables.FilterType, knftables.ForwardHook, knftables.FilterPriority + "-10", []string{
		// Invalid packets are dropped before conntrack can mistake them
		// for new connections (kube-proxy's fix for spurious resets).
		"ct state invalid drop",
		"ct state new jump " + nftServiceEndpointsCheck,
		"ct state new jump " + nftClusterIPsCheck}},
	{"filter-input", knftables.FilterType, knftables.InputHook, knftables.FilterPriority + "-10", []string{
		"ct state new jump " + nftNodePortEndpoints,
		"ct state new jump " + nftServiceEndpointsCheck}},
	{"filter-output", knftables.FilterType, knftables.OutputHook, knftables.FilterPriority + "-10", []string{
		"ct state new jump " + nftServiceEndpointsCheck}},
	{"filter-output-post-dnat", knftables.FilterType, knftables.OutputHook, knftables.DNATPriority + "+10", []string{
		"ct state new jump " + nftClusterIPsCheck}},
	{"nat-prerouting", knftables.NATType, knftables.PreroutingHook, knftables.DNATPriority, []string{"jump " + nftServices}},
	{"nat-output", knftables.NATType, knftables.OutputHook, knftables.DNATPriority, []string{"jump " + nftServices}},
	{"nat-postrouting", knftables.NATType, knftables.PostroutingHook, knftables.SNATPriority, []string{"jump " + nftMasquerading}},
}

// nftFixedChains are the regular chains every sync has.
var nftFixedChains = map[string][]string{
	nftServices: {
		"ip daddr . meta l4proto . th dport vmap @" + nftServiceIPs,
		"fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @" + nftServiceNodePorts},
	// Traffic marked on its way in leaves masqueraded as the node.
	nftMasquerading: {
		"meta mark & " + masqMark + " == 0 return",
		"meta mark set meta mark ^ " + masqMark,
		"masquerade fully-random"},
	nftMarkForMasquerade:     {"meta mark set meta mark | " + masqMark},
	nftServiceEndpointsCheck: {"ip daddr . meta l4proto . th dport vmap @" + nftNoEndpointServices},
	nftNodePortEndpoints:     {"fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @" + nftNoEndpointNodePorts},
	// A ClusterIP's ports that no Service has are refused, not left to
	// time out.
	nftClusterIPsCheck: {"ip daddr @" + nftClusterIPs + " reject"},
	nftRejectChain:     {"reject"},
}

// nftMaps are the verdict maps and the set the fixed chains look in.
var nftMaps = []*knftables.Map{
	{Name: nftServiceIPs, Type: "ipv4_addr . inet_proto . inet_service : verdict"},
	{Name: nftServiceNodePorts, Type: "inet_proto . inet_service : verdict"},
	{Name: nftNoEndpointServices, Type: "ipv4_addr . inet_proto . inet_service : verdict"},
	{Name: nftNoEndpointNodePorts, Type: "inet_proto . inet_service : verdict"},
}

// nftElement is one element of a map or of the cluster-ips set.
type nftElement struct {
	in    string // map or set
	key   []string
	value string // a verdict; "" in a set
}

func (e nftElement) id() string { return e.in + " " + strings.Join(e.key, " . ") }

// nftRules is every chain, set and element of the proxy's table but the
// fixed ones.
type nftRules struct {
	chains   map[string][]string
	order    []string
	digests  map[string]uint64 // of each chain's rules
	affinity map[string]int32  // set name: timeout in seconds
	elements map[string]nftElement
}

func newNFTRules() *nftRules {
	return &nftRules{chains: map[string][]string{}, digests: map[string]uint64{}, affinity: map[string]int32{}, elements: map[string]nftElement{}}
}

// add puts o's chains, sets and elements in r.
func (r *nftRules) add(o *nftRules) {
	for _, c := range o.order {
		if _, ok := r.chains[c]; !ok {
			r.order = append(r.order, c)
		}
		r.chains[c], r.digests[c] = o.chains[c], o.digests[c]
	}
	maps.Copy(r.affinity, o.affinity)
	maps.Copy(r.elements, o.elements)
}

func (r *nftRules) chain(name string) {
	if _, ok := r.chains[name]; !ok {
		r.chains[name] = []string{}
		r.order = append(r.order, name)
	}
}

func (r *nftRules) rule(chain string, rule string) { r.chains[chain] = append(r.chains[chain], rule) }

func (r *nftRules) element(in string, value string, key ...string) {
	e := nftElement{in: in, key: key, value: value}
	r.elements[e.id()] = e
}

func (r *nftRules) digest(chain string) uint64 {
	h := sha256.New()
	for _, rule := range r.chains[chain] {
		h.Write([]byte(rule))
		h.Write([]byte{'\n'})
	}
	return binary.BigEndian.Uint64(h.Sum(nil))
}

// nftName is kube-proxy's name of a Service port's chain:
// PREFIX-HASH-namespace/name/protocol/port, the hash telling apart names
// that would read the same.
func nftName(prefix string, sp *servicePort, suffix string) string {
	port := sp.service.Namespace + "/" + sp.service.Name + "/" + sp.proto() + "/"
	if _, name, ok := strings.Cut(sp.name, ":"); ok {
		port += name
	}
	return prefix + hash(sp.name, sp.proto(), suffix)[:8] + "-" + port + suffix
}

// builtPort is one service port's rules as last built, and what they
// were built from.
type builtPort struct {
	from  string
	rules *nftRules
}

// buildNFTRules is every Service port's chains and elements, with the
// same meaning as buildRules' iptables rules. A port whose Service and
// endpoints are as in built is not built again: a change to one Service
// costs the sync that one Service's rules, not every Service's. It
// returns the ports built, for the next sync.
func buildNFTRules(n node, ports []*servicePort, built map[string]builtPort) (*nftRules, map[string]builtPort) {
	r := newNFTRules()
	next := make(map[string]builtPort, len(ports))
	for _, sp := range ports {
		key, from := sp.name+"/"+sp.proto(), sp.fingerprint(n)
		b, ok := built[key]
		if !ok || b.from != from {
			pr := newNFTRules()
			nftPortRules(pr, n, sp)
			for _, c := range pr.order {
				pr.digests[c] = pr.digest(c)
			}
			b = builtPort{from: from, rules: pr}
		}
		next[key] = b
		r.add(b.rules)
	}
	return r, next
}

// fingerprint is everything of sp (and of the node) its rules are built
// from.
func (sp *servicePort) fingerprint(n node) string {
	var b strings.Builder
	b.Grow(64 + 32*len(sp.endpoints))
	for _, f := range []string{n.clusterCIDR, sp.name, sp.service.String(), string(sp.protocol), sp.clusterIP} {
		b.WriteString(f)
		b.WriteByte(' ')
	}
	for _, v := range []int32{sp.port, sp.nodePort, sp.affinitySeconds} {
		b.WriteString(strconv.Itoa(int(v)))
		b.WriteByte(' ')
	}
	b.WriteString(strconv.FormatBool(sp.externalLocal) + strconv.FormatBool(sp.internalLocal))
	for _, ip := range sp.externalIPs {
		b.WriteString(" x" + ip)
	}
	for _, e := range sp.endpoints {
		b.WriteString(" " + e.String())
		for _, f := range []bool{e.ready, e.serving, e.terminating, e.local} {
			if f {
				b.WriteByte('1')
			} else {
				b.WriteByte('0')
			}
		}
	}
	return b.String()
}

const (
	nftGotoReject = "goto " + nftRejectChain
	nftDrop       = "drop"
)

func nftPortRules(r *nftRules, n node, sp *servicePort) {
	proto := sp.proto()
	port := strconv.Itoa(int(sp.port))
	nodePort := strconv.Itoa(int(sp.nodePort))
	r.element(nftClusterIPs, "", sp.clusterIP)
	all, local := sp.usable(), sp.usableLocal()
	external, usesSVC, usesSVL := sp.plan()
	refuse := func(verdict string, internal bool) {
		if internal {
			r.element(nftNoEndpointServices, verdict, sp.clusterIP, proto, port)
		}
		for _, ip := range sp.externalIPs {
			r.element(nftNoEndpointServices, verdict, ip, proto, port)
		}
		if sp.nodePort != 0 {
			r.element(nftNoEndpointNodePorts, verdict, proto, nodePort)
		}
	}
	if len(all) == 0 {
		refuse(nftGotoReject, true)
		return
	}
	svc, svl := nftName(nftPrefixService, sp, ""), nftName(nftPrefixLocal, sp, "")
	if usesSVC {
		r.chain(svc)
	}
	if usesSVL {
		r.chain(svl)
	}
	internal := svc
	if sp.internalLocal {
		internal = svl
	}
	if sp.internalLocal && len(local) == 0 {
		r.element(nftNoEndpointServices, nftDrop, sp.clusterIP, proto, port)
	} else {
		r.element(nftServiceIPs, "goto "+internal, sp.clusterIP, proto, port)
		// Traffic to the ClusterIP from outside the pod network (the node
		// itself, a host-network pod) is masqueraded, so that a pod on
		// another node replies through this one.
		r.rule(internal, "ip daddr "+sp.clusterIP+" "+proto+" dport "+port+" ip saddr != "+n.clusterCIDR+" jump "+nftMarkForMasquerade)
	}
	if usesSVC {
		nftDispatch(r, sp, svc, all)
	}
	if usesSVL {
		nftDispatch(r, sp, svl, local)
	}
	if !external {
		return
	}
	ext := nftName(nftPrefixExternal, sp, "")
	r.chain(ext)
	if !sp.externalLocal {
		r.rule(ext, "jump "+nftMarkForMasquerade)
		r.rule(ext, "goto "+svc)
	} else {
		// Pods and the node itself reach every endpoint; clients from
		// outside only this node's, keeping their address.
		r.rule(ext, "ip saddr "+n.clusterCIDR+" goto "+svc)
		r.rule(ext, "fib saddr type local jump "+nftMarkForMasquerade)
		r.rule(ext, "fib saddr type local goto "+svc)
		if len(local) > 0 {
			r.rule(ext, "goto "+svl)
		} else {
			refuse(nftDrop, false)
		}
	}
	for _, ip := range sp.externalIPs {
		r.element(nftServiceIPs, "goto "+ext, ip, proto, port)
	}
	if sp.nodePort != 0 {
		r.element(nftServiceNodePorts, "goto "+ext, proto, nodePort)
	}
}

// nftDispatch spreads chain's connections over eps: with ClientIP
// affinity a client seen lately goes where it went, the others by a
// random number, evenly.
func nftDispatch(r *nftRules, sp *servicePort, chain string, eps []endpoint) {
	var vmap []string
	for i, e := range eps {
		sep := nftName(nftPrefixEndpoint, sp, "__"+e.ip+"/"+strconv.Itoa(int(e.port)))
		affinity := nftName(nftPrefixAffinity, sp, "__"+e.ip+"/"+strconv.Itoa(int(e.port)))
		if sp.affinitySeconds > 0 {
			r.rule(chain, "ip saddr @"+affinity+" goto "+sep)
		}
		vmap = append(vmap, strconv.Itoa(i)+" : goto "+sep)
		if _, written := r.chains[sep]; written {
			continue // for the other chain already
		}
		r.chain(sep)
		// A pod reaching itself through its Service (hairpin) is
		// masqueraded, or its reply would skip the DNAT's undoing.
		r.rule(sep, "ip saddr "+e.ip+" jump "+nftMarkForMasquerade)
		if sp.affinitySeconds > 0 {
			r.affinity[affinity] = sp.affinitySeconds
			r.rule(sep, "update @"+affinity+" { ip saddr }")
		}
		r.rule(sep, "meta l4proto "+sp.proto()+" dnat to "+e.String())
	}
	r.rule(chain, "numgen random mod "+strconv.Itoa(len(eps))+" vmap { "+strings.Join(vmap, " , ")+" }")
}

// nftWriter keeps the nftables mode's rules in the kernel: every sync one
// transaction, of the chains whose rules changed and the elements added
// and removed since the last; the first, and one after a failure,
// rewrites the whole table.
type nftWriter struct {
	nft knftables.Interface
	// written is a digest of each chain as last written, elements the
	// elements and affinity the sets; nil until a full sync succeeded.
	written  map[string]uint64
	elements map[string]nftElement
	affinity map[string]int32
	// built is each service port's rules as last built.
	built map[string]builtPort
	// stale are chains flushed, no longer wanted, not yet deleted.
	stale map[string]bool
}

// write programs ports; full rewrites everything, refresh the fixed
// chains (repairing what a hand changed in them).
func (w *nftWriter) write(ctx context.Context, n node, ports []*servicePort, full, refresh bool) (stats string, err error) {
	full = full || w.written == nil
	r, built := buildNFTRules(n, ports, w.built)
	tx := w.nft.NewTransaction()
	var chainsWritten, stale, added, removed int
	if full {
		// The table is made anew in the same transaction: deleting it
		// whole is cheap where flushing its 10,000 chains one by one is
		// not, and packets see the old rules until the new ones are in.
		// (ClientIP affinity is forgotten, as at a restart of kube-proxy.)
		if _, err := w.nft.List(ctx, "chain"); err == nil {
			tx.Delete(&knftables.Table{})
		} else if !knftables.IsNotFound(err) {
			return "", fmt.Errorf("nftables: %w", err)
		}
		w.written, w.affinity, w.elements, w.stale = map[string]uint64{}, nil, nil, nil
	}
	if full || refresh {
		// Declared (add is a no-op for one that exists), maps before the
		// chains that look in them, chains before those that jump to
		// them; the chains flushed, so that rules a hand added go.
		tx.Add(&knftables.Table{Comment: knftables.PtrTo("orch's service proxy (kube-proxy's nftables mode)")})
		for _, m := range nftMaps {
			tx.Add(&knftables.Map{Name: m.Name, Type: m.Type})
		}
		tx.Add(&knftables.Set{Name: nftClusterIPs, Type: "ipv4_addr"})
		for _, name := range slices.Sorted(maps.Keys(nftFixedChains)) {
			tx.Add(&knftables.Chain{Name: name})
			if !full {
				tx.Flush(&knftables.Chain{Name: name})
			}
			for _, rule := range nftFixedChains[name] {
				tx.Add(&knftables.Rule{Chain: name, Rule: rule})
			}
		}
		for _, c := range nftBaseChains {
			tx.Add(&knftables.Chain{Name: c.name, Type: knftables.PtrTo(c.typ), Hook: knftables.PtrTo(c.hook), Priority: knftables.PtrTo(c.priority)})
			if !full {
				tx.Flush(&knftables.Chain{Name: c.name})
			}
			for _, rule := range c.rules {
				tx.Add(&knftables.Rule{Chain: c.name, Rule: rule})
			}
		}
	}
	// The order matters within the transaction: an element is removed
	// before the chain it names, a chain's old rules before the set they
	// name, a set before the rules that name it, a chain before the
	// elements that name it.
	if !full {
		for id, e := range w.elements {
			if now, ok := r.elements[id]; !ok || now.value != e.value {
				tx.Delete(nftElementOf(e))
				removed++
			}
		}
	}
	written := make(map[string]uint64, len(r.order))
	var rewrite []string
	for _, c := range r.order {
		d := r.digests[c]
		written[c] = d
		if old, ok := w.written[c]; ok && old == d && !full {
			continue
		}
		if _, ok := w.written[c]; ok {
			tx.Flush(&knftables.Chain{Name: c})
		}
		rewrite = append(rewrite, c)
	}
	var gone []string
	for c := range w.written {
		if _, ok := written[c]; !ok && nftServiceChain(c) {
			gone = append(gone, c)
		}
	}
	slices.Sort(gone)
	for _, c := range gone {
		tx.Flush(&knftables.Chain{Name: c})
	}
	for name, seconds := range w.affinity {
		if now, ok := r.affinity[name]; !ok || now != seconds {
			tx.Delete(&knftables.Set{Name: name}) // a set's timeout is fixed when it is made
		}
	}
	for name, seconds := range r.affinity {
		if old, ok := w.affinity[name]; !ok || old != seconds {
			tx.Add(&knftables.Set{Name: name, Type: "ipv4_addr", Flags: []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag},
				Timeout: knftables.PtrTo(time.Duration(seconds) * time.Second)})
		}
	}
	for _, c := range rewrite {
		tx.Add(&knftables.Chain{Name: c}) // all before any rule jumps to one
	}
	for _, c := range rewrite {
		for _, rule := range r.chains[c] {
			tx.Add(&knftables.Rule{Chain: c, Rule: rule})
		}
		chainsWritten++
	}
	for id, e := range r.elements {
		if old, ok := w.elements[id]; full || !ok || old.value != e.value {
			tx.Add(nftElementOf(e))
			added++
		}
	}
	// Deleting a chain makes nft read the whole table to check nothing
	// jumps to it (some 100 ms with 10,000 Services' chains): a chain that
	// goes is flushed at once, which is all the packets see, and deleted
	// by the next full or periodic sync, as kube-proxy does.
	stales := maps.Clone(w.stale)
	if stales == nil {
		stales = map[string]bool{}
	}
	for _, c := range gone {
		stales[c] = true
	}
	for c := range written {
		delete(stales, c) // wanted again
	}
	if full || refresh {
		for _, c := range slices.Sorted(maps.Keys(stales)) {
			tx.Delete(&knftables.Chain{Name: c})
			stale++
		}
		stales = nil
	}
	if tx.NumOperations() > 0 {
		if err := w.nft.Run(ctx, tx); err != nil {
			w.written = nil // the next sync is a full one
			return "", fmt.Errorf("nftables: %w", err)
		}
	}
	w.written, w.elements, w.affinity, w.built, w.stale = written, r.elements, r.affinity, built, stales
	return fmt.Sprintf("chains written %d, stale deleted %d (%d to delete), elements added %d, removed %d, operations %d",
		chainsWritten, stale, len(stales), added, removed, tx.NumOperations()), nil
}

func nftElementOf(e nftElement) *knftables.Element {
	el := &knftables.Element{Key: e.key}
	if e.value == "" {
		el.Set = e.in
	} else {
		el.Map, el.Value = e.in, []string{e.value}
	}
	return el
}

// nftServiceChain says whether chain is one the proxy makes for a
// Service port or an endpoint (their names hold the Service's
// namespace/name; the fixed chains' do not).
func nftServiceChain(chain string) bool {
	for _, p := range []string{nftPrefixService, nftPrefixLocal, nftPrefixExternal, nftPrefixEndpoint} {
		if strings.HasPrefix(chain, p) && strings.Contains(chain, "/") {
			return true
		}
	}
	return false
}

// NewNFTables is the nftables interface of the proxy's table, or why the
// machine cannot have one (no nft command, a kernel without nf_tables).
func NewNFTables() (knftables.Interface, error) {
	nft, err := knftables.New(knftables.IPv4Family, nftTable)
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	return nft, nil
}

// RemoveNFTables deletes the nftables mode's table, if the machine has
// one: for the iptables mode, and the uninstall. It says whether there
// was one.
func RemoveNFTables(ctx context.Context) (bool, error) {
	nft, err := NewNFTables()
	if err != nil {
		return false, nil // no nftables here: no table either
	}
	tx := nft.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := nft.Run(ctx, tx); err != nil {
		if knftables.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("delete the nftables table %s: %w", nftTable, err)
	}
	return true, nil
}
