package netproxy

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/orch-dev/orch/internal/iptables"
	"github.com/orch-dev/orch/internal/kube"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/validate/content"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/knftables"
)

// Modes of the proxy: the rules kube-proxy's modes of those names write.
const (
	ModeIPTables = "iptables"
	ModeNFTables = "nftables"
)

// Config is what a node's service proxy needs.
type Config struct {
	Informers *kube.Informers
	// Mode is ModeIPTables (the default) or ModeNFTables; the mode's
	// interface to the kernel is IPTables or NFTables.
	Mode     string
	IPTables iptables.Interface
	NFTables knftables.Interface
	// ClusterCIDR is the pods' network (the server's --cluster-cidr).
	ClusterCIDR string
	// NodeName is this node's: its endpoints are the local ones the
	// Local traffic policies keep to.
	NodeName string
	// MinSyncPeriod spaces the syncs changes cause (1 s, kube-proxy's
	// --iptables-min-sync-period); SyncPeriod is how often the rules are
	// rewritten whole even without a change, repairing rules removed by
	// hand (30 s, its --iptables-sync-period).
	MinSyncPeriod, SyncPeriod time.Duration
	Clock                     clock.WithTicker
	Logger                    *slog.Logger
	// AfterFirstSync runs once the first sync's rules are in (the agent
	// removes the other mode's rules then).
	AfterFirstSync func()
}

// Proxy keeps a node's service rules in step with the cluster's Services
// and EndpointSlices, as kube-proxy's nftables or iptables mode does.
type Proxy struct {
	cfg      Config
	services corelisters.ServiceLister
	slices   discoverylisters.EndpointSliceLister
	synced   []toolscache.InformerSynced
	changed  chan struct{}
	log      *slog.Logger

	mu sync.Mutex
	// written is a digest of each nat chain's rules as last written; nil
	// until a full sync has succeeded.
	written map[string]uint64
	// filterWritten is the filter table's rules as last written.
	filterWritten []byte
	lastFull      time.Time
	// udp is the UDP service ports' endpoints as last written, and ct
	// forgets the connections of those removed.
	udp map[string]udpTargets
	ct  conntracker
	// nft writes the nftables mode's rules (nil in the iptables mode).
	nft *nftWriter
	// ports is each Service's ports as the last sync built them.
	ports map[types.NamespacedName]portsOfVersion
}

// New registers the proxy's informers; Run syncs.
func New(cfg Config) (*Proxy, error) {
	if cfg.MinSyncPeriod == 0 {
		cfg.MinSyncPeriod = time.Second
	}
	if cfg.SyncPeriod == 0 {
		cfg.SyncPeriod = 30 * time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	svcs, eps := cfg.Informers.Services(), cfg.Informers.EndpointSlices()
	p := &Proxy{cfg: cfg, ct: kernelConntrack{}, services: svcs.Lister(), slices: eps.Lister(), changed: make(chan struct{}, 1),
		synced: []toolscache.InformerSynced{svcs.Informer().HasSynced, eps.Informer().HasSynced}, log: cfg.Logger.With("component", "netproxy")}
	switch cfg.Mode {
	case "", ModeIPTables:
		if cfg.IPTables == nil {
			return nil, errors.New("service proxy: the iptables mode needs iptables")
		}
	case ModeNFTables:
		if cfg.NFTables == nil {
			return nil, errors.New("service proxy: the nftables mode needs nftables")
		}
		p.nft = &nftWriter{nft: cfg.NFTables}
	default:
		return nil, fmt.Errorf("service proxy: unknown mode %q (%s or %s)", cfg.Mode, ModeIPTables, ModeNFTables)
	}
	wake := toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { p.wake() }, UpdateFunc: func(any, any) { p.wake() }, DeleteFunc: func(any) { p.wake() },
	}
	for _, inf := range []toolscache.SharedIndexInformer{svcs.Informer(), eps.Informer()} {
		if err := inf.SetTransform(slim); err != nil {
			return nil, fmt.Errorf("service proxy: the informers must be its own, not started: %w", err)
		}
		if _, err := inf.AddEventHandler(wake); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func (p *Proxy) wake() {
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

// Run syncs the rules until ctx ends: after changes, at most two syncs
// in a row and then one per MinSyncPeriod (kube-proxy's bounded
// frequency runner, burst 2: a lone change is synced at once, a storm of
// them batched), and every SyncPeriod whatever happened. The rules stay
// when it ends: the node's traffic goes on flowing while the agent
// restarts, as with kube-proxy.
func (p *Proxy) Run(ctx context.Context) {
	if !toolscache.WaitForCacheSync(ctx.Done(), p.synced...) {
		return
	}
	full := p.cfg.Clock.NewTicker(p.cfg.SyncPeriod)
	defer full.Stop()
	limit := rate.NewLimiter(rate.Every(p.cfg.MinSyncPeriod), 2)
	refresh := true
	for {
		// Changes meanwhile wait for the next sync.
		now := p.cfg.Clock.Now()
		if wait := limit.ReserveN(now, 1).DelayFrom(now); wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-p.cfg.Clock.After(wait):
			}
		}
		if err := p.sync(refresh); err != nil {
			p.log.Warn("service rules not synced: trying again", "err", err)
			p.wake()
		} else if after := p.cfg.AfterFirstSync; after != nil {
			p.cfg.AfterFirstSync = nil
			after()
		}
		select {
		case <-ctx.Done():
			return
		case <-p.changed:
			refresh = false
		case <-full.C():
			refresh = true
		}
	}
}

// fullSyncEvery is how often a sync rewrites every chain even though
// nothing changed, as kube-proxy's full resync: the syncs between write
// only the chains that changed (and the top-level ones), because
// iptables-nft's restore of a whole large table costs seconds of CPU.
const fullSyncEvery = time.Hour

// topLevel are the nat chains the periodic sync writes whatever their
// rules, so that what a hand removed from them is back within
// SyncPeriod.
var topLevel = map[string]bool{chainServices: true, chainNodePorts: true, chainPostrouting: true, chainMarkMasq: true}

// Sync writes the proxy's rules in one iptables-restore per table. A full
// sync (the first, one after a failure, then hourly) makes sure of the
// jumps from the built-in chains, rewrites every chain and deletes the
// proxy's chains no longer wanted, found in the kernel; the others write
// the filter table, the top-level nat chains and the Services' chains
// whose rules changed, and delete the chains they wrote before and no
// longer want, as kube-proxy's partial syncs do.
func (p *Proxy) Sync() error { return p.sync(true) }

// sync is Sync; a sync that changes caused (refresh false) writes the
// top-level chains only when their rules changed, the periodic one
// writes them whatever, repairing what a hand removed.
func (p *Proxy) sync(refresh bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.nft != nil {
		return p.syncNFTables(refresh)
	}
	start := time.Now()
	full := p.written == nil || time.Since(p.lastFull) >= fullSyncEvery
	if full {
		if err := p.ensureJumps(); err != nil {
			return err
		}
	}
	ports, err := p.servicePorts()
	if err != nil {
		return err
	}
	var existing []string
	if full {
		if existing, err = p.cfg.IPTables.Chains("nat"); err != nil {
			return err
		}
	} else {
		for c := range p.written {
			existing = append(existing, c)
		}
	}
	rs := buildRules(node{clusterCIDR: p.cfg.ClusterCIDR}, ports, existing)
	changed := func(chain string) bool {
		if full || refresh && topLevel[chain] {
			return true
		}
		old, ok := p.written[chain]
		return !ok || old != rs.nat.digest(chain)
	}
	// filter first: a Service losing its endpoints is refused before its
	// DNAT goes.
	filter := rs.filterText()
	if full || refresh || !bytes.Equal(filter, p.filterWritten) {
		if err := p.cfg.IPTables.Restore("filter", filter); err != nil {
			p.written = nil
			return err
		}
		p.filterWritten = filter
	}
	for _, part := range rs.nat.restoreParts("nat", changed, rs.stale, maxChainsPerRestore) {
		if err := p.cfg.IPTables.Restore("nat", part); err != nil {
			p.written = nil // the next sync is a full one
			return err
		}
	}
	written := make(map[string]uint64, len(rs.nat.chains))
	wrote := 0
	for _, c := range rs.nat.chains {
		if changed(c) {
			wrote++
		}
		written[c] = rs.nat.digest(c)
	}
	p.written = written
	if full {
		p.lastFull = time.Now()
	}
	p.forgetUDP(ports)
	p.log.Debug("service rules synced", "full", full, "servicePorts", len(ports), "rules", rs.rules, "natChainsWritten", wrote,
		"staleChainsDeleted", len(rs.stale), "took", time.Since(start).Round(time.Microsecond))
	return nil
}

// syncNFTables is sync in the nftables mode: one transaction.
func (p *Proxy) syncNFTables(refresh bool) error {
	start := time.Now()
	// Full only when what the kernel holds is not known (the first sync,
	// one after a failure): a full sync makes the table anew, which
	// forgets ClientIP affinity, and the syncs between are exact (the
	// periodic one repairs the fixed chains).
	full := !p.nft.ready
	ports, err := p.servicePorts()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stats, err := p.nft.write(ctx, node{clusterCIDR: p.cfg.ClusterCIDR}, ports, full, refresh)
	if err != nil {
		return err
	}
	p.forgetUDP(ports)
	p.log.Debug("service rules synced", "mode", ModeNFTables, "full", full, "servicePorts", len(ports), "written", stats,
		"took", time.Since(start).Round(time.Microsecond))
	return nil
}

// forgetUDP forgets the conntrack entries of UDP clients of endpoints
// that are gone, which would otherwise keep going there.
func (p *Proxy) forgetUDP(ports []*servicePort) {
	udp := udpState(ports)
	if err := forgetRemoved(p.ct, p.udp, udp); err != nil {
		p.log.Warn("UDP clients of removed endpoints may keep sending to them until their conntrack entries expire", "err", err)
	}
	p.udp = udp
}

// ensureJumps makes the proxy's top-level chains and the jumps to them
// from the built-in chains.
func (p *Proxy) ensureJumps() error {
	for table, chains := range map[string][]string{
		"nat":    {chainServices, chainNodePorts, chainPostrouting, chainMarkMasq},
		"filter": {chainServices, chainNodePorts, chainExternalServices, chainForward, chainFirewall},
	} {
		for _, c := range chains {
			if err := p.cfg.IPTables.EnsureChain(table, c); err != nil {
				return err
			}
		}
	}
	// At the head of the built-in chains, as kube-proxy puts them: a
	// Service with no endpoints is refused even for pods whose traffic a
	// pod network's FORWARD rule accepts. Last first, so that they keep
	// jumps' order.
	for _, j := range slices.Backward(jumps) {
		if err := p.cfg.IPTables.EnsureFirstRule(j.table, j.chain, j.rule...); err != nil {
			return err
		}
	}
	return nil
}

// servicePorts are the ports of every Service with a cluster IP, with
// their endpoints from the Service's EndpointSlices.
func (p *Proxy) servicePorts() ([]*servicePort, error) {
	svcs, err := p.services.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	// Every slice once, by Service: a selector per Service would list
	// the namespace's slices once per Service.
	all, err := p.slices.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	byService := map[types.NamespacedName][]*discoveryv1.EndpointSlice{}
	for _, s := range all {
		if name := s.Labels[discoveryv1.LabelServiceName]; name != "" {
			key := types.NamespacedName{Namespace: s.Namespace, Name: name}
			byService[key] = append(byService[key], s)
		}
	}
	var out []*servicePort
	next := make(map[types.NamespacedName]portsOfVersion, len(svcs))
	for _, svc := range svcs {
		ip := svc.Spec.ClusterIP
		if ip == "" || ip == corev1.ClusterIPNone || svc.Spec.Type == corev1.ServiceTypeExternalName {
			continue // headless and ExternalName Services have no rules
		}
		if _, other := svc.Labels[labelServiceProxyName]; other {
			continue // another proxy's, as kube-proxy leaves them
		}
		// What the API validated is checked again before it becomes rule
		// text: one bad value would fail the whole restore, every
		// Service's rules with it, or write rules of its own.
		if !isIPv4(ip) {
			p.log.Debug("service skipped: its cluster IP is not IPv4", "service", svc.Namespace+"/"+svc.Name, "clusterIP", ip)
			continue
		}
		name := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
		svcSlices := byService[name]
		// A Service whose object and slices are the versions of the last
		// sync has the same ports: a sync after one change reads one
		// Service's slices, not every Service's.
		version := versionOf(svc, svcSlices)
		if c, ok := p.ports[name]; ok && c.version == version && svc.ResourceVersion != "" {
			next[name] = c
			out = append(out, c.ports...)
			continue
		}
		first := len(out)
		for _, port := range svc.Spec.Ports {
			protocol := port.Protocol
			if protocol == "" {
				protocol = corev1.ProtocolTCP
			}
			if !knownProtocol(protocol) || !validPort(port.Port) || !validName(port.Name) {
				continue
			}
			sp := &servicePort{name: portName(name, port.Name), service: name, protocol: protocol, clusterIP: ip, port: port.Port,
				externalIPs: slices.DeleteFunc(slices.Clone(svc.Spec.ExternalIPs), func(a string) bool { return !isIPv4(a) })}
			if svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
				// The load balancer's addresses (ServiceLB's: nodes') take
				// the Service's port as external IPs do.
				for _, in := range svc.Status.LoadBalancer.Ingress {
					if isIPv4(in.IP) && !slices.Contains(sp.externalIPs, in.IP) {
						sp.externalIPs = append(sp.externalIPs, in.IP)
					}
				}
			}
			if (svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer) && validPort(port.NodePort) {
				sp.nodePort = port.NodePort
			}
			sp.externalLocal = svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
			sp.internalLocal = svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
			if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
				sp.affinitySeconds = corev1.DefaultClientIPServiceAffinitySeconds
				if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil &&
					*c.ClientIP.TimeoutSeconds > 0 && *c.ClientIP.TimeoutSeconds <= maxAffinitySeconds {
					sp.affinitySeconds = *c.ClientIP.TimeoutSeconds
				}
			}
			sp.endpoints = endpointsFor(svcSlices, port.Name, protocol, p.cfg.NodeName)
			out = append(out, sp)
		}
		next[name] = portsOfVersion{version: version, ports: slices.Clone(out[first:])}
	}
	p.ports = next
	return out, nil
}

// portsOfVersion is a Service's ports as built from the versions of it
// and its slices that version names.
type portsOfVersion struct {
	version string
	ports   []*servicePort
}

// versionOf names the versions of svc and its slices (resourceVersions
// change with every write of an object).
func versionOf(svc *corev1.Service, from []*discoveryv1.EndpointSlice) string {
	parts := make([]string, 0, len(from))
	for _, s := range from {
		parts = append(parts, s.Name+"@"+s.ResourceVersion)
	}
	slices.Sort(parts)
	return svc.ResourceVersion + " " + strings.Join(parts, " ")
}

// portName is Kubernetes' ServicePortName string.
func portName(svc types.NamespacedName, port string) string {
	if port == "" {
		return svc.String()
	}
	return svc.String() + ":" + port
}

// endpointsFor are the endpoints of the slices' port named name, each
// address once; those on node are local.
func endpointsFor(from []*discoveryv1.EndpointSlice, name string, protocol corev1.Protocol, node string) []endpoint {
	seen := map[string]bool{}
	var out []endpoint
	for _, s := range from {
		if s.AddressType != discoveryv1.AddressTypeIPv4 {
			continue
		}
		var port int32
		found := false
		for _, sp := range s.Ports {
			p := corev1.ProtocolTCP
			if sp.Protocol != nil {
				p = *sp.Protocol
			}
			if ptr.Deref(sp.Name, "") == name && p == protocol && sp.Port != nil && validPort(*sp.Port) {
				port, found = *sp.Port, true
			}
		}
		if !found {
			continue
		}
		for _, e := range s.Endpoints {
			if len(e.Addresses) == 0 || !isIPv4(e.Addresses[0]) {
				continue
			}
			ep := endpoint{ip: e.Addresses[0], port: port,
				// Unset ready is ready, as the EndpointSlice API says.
				ready:       e.Conditions.Ready == nil || *e.Conditions.Ready,
				serving:     e.Conditions.Serving == nil || *e.Conditions.Serving,
				terminating: e.Conditions.Terminating != nil && *e.Conditions.Terminating,
				local:       node != "" && e.NodeName != nil && *e.NodeName == node}
			if ep.ready && ep.terminating {
				ep.ready = false
			}
			if seen[ep.String()] {
				continue
			}
			seen[ep.String()] = true
			out = append(out, ep)
		}
	}
	// Any fixed order: the same endpoints give the same rules, so an
	// unchanged Service's chains are not rewritten.
	// sort.Slice, not slices.SortFunc: a generic sort of a struct type
	// costs the binary budget (design.md) some 11 KB.
	sort.Slice(out, func(i, j int) bool {
		return cmp.Or(strings.Compare(out[i].ip, out[j].ip), cmp.Compare(out[i].port, out[j].port)) < 0
	})
	return out
}

// maxAffinitySeconds is the longest ClientIP affinity the API allows (a
// day).
const maxAffinitySeconds = 86400

func isIPv4(s string) bool {
	a, err := netip.ParseAddr(s)
	return err == nil && a.Is4()
}

func validPort(p int32) bool { return p > 0 && p <= 65535 }

func knownProtocol(p corev1.Protocol) bool {
	return p == corev1.ProtocolTCP || p == corev1.ProtocolUDP || p == corev1.ProtocolSCTP
}

// validName is a port name as the API allows it (a DNS label), which the
// rules quote in comments.
func validName(name string) bool { return name == "" || len(content.IsDNS1123Label(name)) == 0 }

// labelServiceProxyName marks a Service another proxy serves: kube-proxy,
// and so orch's, gives it no rules.
const labelServiceProxyName = "service.kubernetes.io/service-proxy-name"

// slim drops, as the informers store them, what the proxy never reads of
// Services and EndpointSlices: kubectl apply's annotation, managed
// fields, owners, selectors, labels other than the proxy's, and each
// endpoint's pod reference and zone (its host name the cluster DNS
// answers); endpoints' conditions
// share their booleans. With 1,000 Services of 10 endpoints as a cluster
// holds them, the proxy's memory went from 9.3 MB to about 5.
func slim(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Service:
		slimMeta(&o.ObjectMeta)
		// The proxy is IPv4's, from spec.clusterIP.
		o.Spec.Selector, o.Spec.ClusterIPs, o.Spec.IPFamilies, o.Status.Conditions = nil, nil, nil, nil
	case *discoveryv1.EndpointSlice:
		slimMeta(&o.ObjectMeta)
		for i := range o.Endpoints {
			e := &o.Endpoints[i]
			e.TargetRef, e.Zone, e.DeprecatedTopology, e.Hints = nil, nil, nil, nil
			e.Conditions.Ready, e.Conditions.Serving, e.Conditions.Terminating = shared(e.Conditions.Ready), shared(e.Conditions.Serving), shared(e.Conditions.Terminating)
			e.NodeName = nodeNames.intern(e.NodeName)
		}
	}
	return obj, nil
}

// The labels the proxy reads.
var proxyLabels = []string{discoveryv1.LabelServiceName, labelServiceProxyName}

func slimMeta(m *metav1.ObjectMeta) {
	m.Annotations, m.ManagedFields, m.OwnerReferences, m.GenerateName, m.UID = nil, nil, nil, "", ""
	var kept map[string]string
	for _, k := range proxyLabels {
		if v, ok := m.Labels[k]; ok {
			if kept == nil {
				kept = map[string]string{}
			}
			kept[k] = v
		}
	}
	m.Labels = kept
}

var yes, no = true, false

// nodeNames are the node names endpoints share: a cluster has few nodes
// and many endpoints.
var nodeNames = &interned{names: map[string]*string{}}

// interned hands out one pointer per name, up to a bound (hostile slices
// naming many nodes get their own copies, not a growing table).
type interned struct {
	mu    sync.Mutex
	names map[string]*string
}

func (in *interned) intern(name *string) *string {
	if name == nil {
		return nil
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if p, ok := in.names[*name]; ok {
		return p
	}
	if len(in.names) < 4096 {
		in.names[*name] = name
	}
	return name
}

// shared is b pointing at one of two booleans every endpoint shares.
func shared(b *bool) *bool {
	switch {
	case b == nil:
		return nil
	case *b:
		return &yes
	}
	return &no
}

// routeLocalnet is the switch that lets the node route packets from
// 127.0.0.1 elsewhere, so that a node port answers on 127.0.0.1 (its
// DNAT sends them to a pod); KUBE-FIREWALL drops what else it would let
// in.
const routeLocalnet = "/proc/sys/net/ipv4/conf/all/route_localnet"

// EnableLocalhostNodePorts makes node ports answer on 127.0.0.1, as
// kube-proxy's --iptables-localhost-nodeports (on by default) does.
func EnableLocalhostNodePorts() error {
	if err := os.WriteFile(routeLocalnet, []byte("1"), 0o644); err != nil {
		return fmt.Errorf("node ports on 127.0.0.1: %w", err)
	}
	return nil
}
