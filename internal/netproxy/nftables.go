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
	nftHairpin             = "endpoint-hairpin"      // set of endpoint . endpoint

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
	// Traffic marked on its way in leaves masqueraded as the node, as
	// does a pod's connection to itself through a Service.
	nftMasquerading: {
		"ct status dnat ip saddr . ip daddr @" + nftHairpin + " masquerade fully-random",
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

// buildPort is sp's chains, sets and elements, with the same meaning as
// portRules' iptables rules.
func buildPort(n node, sp *servicePort) *nftRules {
	r := newNFTRules()
	nftPortRules(r, n, sp)
	for _, c := range r.order {
		r.digests[c] = r.digest(c)
	}
	return r
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

// nftDispatch spreads chain's connections over eps evenly, by a random
// number. Without ClientIP affinity one rule picks the endpoint and
// DNATs to it from a map: no chain per endpoint (a tenth of the chains at
// ten endpoints a Service, which is what a sync's time goes on); a pod
// reaching itself through its Service (hairpin) is masqueraded in
// postrouting from the endpoint-hairpin set. With affinity each endpoint
// has its chain, as kube-proxy's: a client seen lately goes where it
// went, and the chain that DNATs remembers it.
func nftDispatch(r *nftRules, sp *servicePort, chain string, eps []endpoint) {
	n := strconv.Itoa(len(eps))
	if sp.affinitySeconds == 0 {
		targets := make([]string, len(eps))
		for i, e := range eps {
			targets[i] = strconv.Itoa(i) + " : " + e.ip + " . " + strconv.Itoa(int(e.port))
			r.element(nftHairpin, "", e.ip, e.ip)
		}
		r.rule(chain, "meta l4proto "+sp.proto()+" dnat ip addr . port to numgen random mod "+n+" map { "+strings.Join(targets, " , ")+" }")
		return
	}
	var vmap []string
	for i, e := range eps {
		sep := nftName(nftPrefixEndpoint, sp, "__"+e.ip+"/"+strconv.Itoa(int(e.port)))
		affinity := nftName(nftPrefixAffinity, sp, "__"+e.ip+"/"+strconv.Itoa(int(e.port)))
		r.rule(chain, "ip saddr @"+affinity+" goto "+sep)
		vmap = append(vmap, strconv.Itoa(i)+" : goto "+sep)
		if _, written := r.chains[sep]; written {
			continue // for the other chain already
		}
		r.chain(sep)
		// Hairpin: masqueraded, or the pod's reply to itself would skip
		// the DNAT's undoing.
		r.rule(sep, "ip saddr "+e.ip+" jump "+nftMarkForMasquerade)
		r.affinity[affinity] = sp.affinitySeconds
		r.rule(sep, "update @"+affinity+" { ip saddr }")
		r.rule(sep, "meta l4proto "+sp.proto()+" dnat to "+e.String())
	}
	r.rule(chain, "numgen random mod "+n+" vmap { "+strings.Join(vmap, " , ")+" }")
}

// nftWriter keeps the nftables mode's rules in the kernel: every sync one
// transaction, of what changed since the last — the chains, sets and
// elements of the service ports that changed, built again from their
// Service and endpoints alone; the first, and one after a failure,
// makes the whole table anew.
type nftWriter struct {
	nft knftables.Interface
	// ready says a full sync succeeded and the rest is what the kernel
	// holds: built is each service port's rules as written, elements
	// every element with how many ports want it (an endpoint's hairpin
	// element, a Service's cluster IP are shared).
	ready    bool
	built    map[string]builtPort
	elements map[string]*nftElementRefs
	// stale are chains flushed, no longer wanted, not yet deleted.
	stale map[string]bool
}

type nftElementRefs struct {
	nftElement
	refs int
}

// portChange is a service port's rules before and after a sync
// (noRules: a port new or gone).
type portChange struct{ old, new *nftRules }

// kept says chain's rules stay as they are. A set made again (its
// timeout changed) cannot go while rules name it, so a port whose
// affinity sets change has all its chains written again, though their
// text is the same.
func (c portChange) kept(chain string) bool {
	for name, seconds := range c.old.affinity {
		if now, ok := c.new.affinity[name]; ok && now != seconds {
			return false
		}
	}
	d, ok := c.old.digests[chain]
	return ok && d == c.new.digests[chain]
}

// noRules are a port's rules when it has none: its maps are nil, which
// read as empty.
var noRules = &nftRules{}

// write programs ports; full rewrites everything, refresh the fixed
// chains (repairing what a hand changed in them).
func (w *nftWriter) write(ctx context.Context, n node, ports []*servicePort, full, refresh bool) (stats string, err error) {
	full = full || !w.ready
	tx := w.nft.NewTransaction()
	if full {
		// The table is made anew in the same transaction: deleting it
		// whole is cheap where flushing its chains one by one is not,
		// and packets see the old rules until the new ones are in.
		// (ClientIP affinity is forgotten: an agent restart re-balances
		// sticky clients, which the iptables mode's recent lists do not.)
		// Adding it first makes the delete one of a table that exists, nft's
		// idiom where `destroy` (nft 1.0.8, Linux 6.3) is missing: listing
		// the table to learn whether it exists took as long as the rest of
		// a resync (0.3 s of nft's time with 1,000 Services).
		tx.Add(&knftables.Table{})
		tx.Delete(&knftables.Table{})
		w.built, w.elements, w.stale = nil, map[string]*nftElementRefs{}, nil
	}
	if full || refresh {
		w.fixed(tx, full)
	}
	// The ports whose rules change: built again, the others kept.
	next := make(map[string]builtPort, len(ports))
	var changes []portChange
	for _, sp := range ports {
		key, from := sp.name+"/"+sp.proto(), sp.fingerprint(n)
		old, ok := w.built[key]
		if ok && old.from == from {
			next[key] = old
			continue
		}
		b := builtPort{from: from, rules: buildPort(n, sp)}
		next[key] = b
		if !ok {
			old.rules = noRules
		}
		changes = append(changes, portChange{old: old.rules, new: b.rules})
	}
	for key, old := range w.built {
		if _, ok := next[key]; !ok {
			changes = append(changes, portChange{old: old.rules, new: noRules})
		}
	}
	var chainsWritten, staleDeleted, added, removed int
	// The order matters within the transaction: an element is removed
	// before the chain it names, a chain's old rules before the set they
	// name, a set before the rules that name it, a chain before the
	// elements that name it.
	for _, c := range changes {
		for id, e := range c.old.elements {
			if now, ok := c.new.elements[id]; ok && now.value == e.value {
				continue
			}
			if ref := w.elements[id]; ref != nil {
				if ref.refs--; ref.refs <= 0 {
					tx.Delete(nftElementOf(ref.nftElement))
					delete(w.elements, id)
					removed++
				}
			}
		}
	}
	stales := maps.Clone(w.stale)
	if stales == nil {
		stales = map[string]bool{}
	}
	var rewrite []string
	for _, c := range changes {
		for _, chain := range c.old.order {
			if c.kept(chain) {
				continue
			}
			tx.Flush(&knftables.Chain{Name: chain})
			if _, wanted := c.new.digests[chain]; !wanted {
				stales[chain] = true
			}
		}
		for _, chain := range c.new.order {
			if c.kept(chain) {
				continue
			}
			delete(stales, chain) // wanted again
			rewrite = append(rewrite, chain)
		}
	}
	for _, c := range changes {
		for name, seconds := range c.old.affinity {
			if now, ok := c.new.affinity[name]; !ok || now != seconds {
				tx.Delete(&knftables.Set{Name: name}) // a set's timeout is fixed when it is made
			}
		}
		for name, seconds := range c.new.affinity {
			if old, ok := c.old.affinity[name]; !ok || old != seconds {
				tx.Add(&knftables.Set{Name: name, Type: "ipv4_addr", Flags: []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag},
					Timeout: knftables.PtrTo(time.Duration(seconds) * time.Second)})
			}
		}
	}
	for _, chain := range rewrite {
		tx.Add(&knftables.Chain{Name: chain}) // all before any rule jumps to one
	}
	for _, c := range changes {
		for _, chain := range c.new.order {
			if c.kept(chain) {
				continue
			}
			for _, rule := range c.new.chains[chain] {
				tx.Add(&knftables.Rule{Chain: chain, Rule: rule})
			}
			chainsWritten++
		}
	}
	for _, c := range changes {
		for id, e := range c.new.elements {
			if old, ok := c.old.elements[id]; ok && old.value == e.value {
				continue
			}
			ref := w.elements[id]
			if ref == nil {
				ref = &nftElementRefs{nftElement: e}
				w.elements[id] = ref
			}
			ref.refs++
			switch {
			case ref.refs == 1:
				tx.Add(nftElementOf(e))
				added++
			case ref.value != e.value:
				// Another port's value for the same key (two Services on
				// one external address and port): the last one's.
				tx.Delete(nftElementOf(ref.nftElement))
				ref.nftElement = e
				tx.Add(nftElementOf(e))
				added++
			}
		}
	}
	// Deleting a chain makes nft read the whole table to check nothing
	// jumps to it (tens of ms with 1,000 Services' chains): a chain that
	// goes is flushed at once, which is all the packets see, and deleted
	// by the next full or periodic sync, as kube-proxy does.
	if full || refresh {
		for _, chain := range slices.Sorted(maps.Keys(stales)) {
			tx.Delete(&knftables.Chain{Name: chain})
			staleDeleted++
		}
		stales = nil
	}
	if tx.NumOperations() > 0 {
		if err := w.nft.Run(ctx, tx); err != nil {
			w.ready = false // the next sync is a full one
			return "", fmt.Errorf("nftables: %w", err)
		}
	}
	w.ready, w.built, w.stale = true, next, stales
	return fmt.Sprintf("ports changed %d, chains written %d, stale deleted %d (%d to delete), elements added %d, removed %d, operations %d",
		len(changes), chainsWritten, staleDeleted, len(stales), added, removed, tx.NumOperations()), nil
}

// fixed declares the table and the chains, maps and sets every sync has
// (add is a no-op for one that exists), maps before the chains that look
// in them, chains before those that jump to them; the chains flushed,
// unless made anew, so that rules a hand added go.
func (w *nftWriter) fixed(tx *knftables.Transaction, anew bool) {
	tx.Add(&knftables.Table{Comment: knftables.PtrTo("orch's service proxy (kube-proxy's nftables mode)")})
	for _, m := range nftMaps {
		tx.Add(&knftables.Map{Name: m.Name, Type: m.Type})
	}
	tx.Add(&knftables.Set{Name: nftClusterIPs, Type: "ipv4_addr"})
	tx.Add(&knftables.Set{Name: nftHairpin, Type: "ipv4_addr . ipv4_addr"})
	for _, name := range slices.Sorted(maps.Keys(nftFixedChains)) {
		tx.Add(&knftables.Chain{Name: name})
		if !anew {
			tx.Flush(&knftables.Chain{Name: name})
		}
		for _, rule := range nftFixedChains[name] {
			tx.Add(&knftables.Rule{Chain: name, Rule: rule})
		}
	}
	for _, c := range nftBaseChains {
		tx.Add(&knftables.Chain{Name: c.name, Type: knftables.PtrTo(c.typ), Hook: knftables.PtrTo(c.hook), Priority: knftables.PtrTo(c.priority)})
		if !anew {
			tx.Flush(&knftables.Chain{Name: c.name})
		}
		for _, rule := range c.rules {
			tx.Add(&knftables.Rule{Chain: c.name, Rule: rule})
		}
	}
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
