package netproxy

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/orch-dev/orch/internal/iptables"
	"github.com/orch-dev/orch/internal/kube"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
)

// Config is what a node's service proxy needs.
type Config struct {
	Informers *kube.Informers
	IPTables  iptables.Interface
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
}

// Proxy keeps a node's iptables rules in step with the cluster's
// Services and EndpointSlices, as kube-proxy's iptables mode does.
type Proxy struct {
	cfg      Config
	services corelisters.ServiceLister
	slices   discoverylisters.EndpointSliceLister
	synced   []toolscache.InformerSynced
	changed  chan struct{}
	log      *slog.Logger
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
	p := &Proxy{cfg: cfg, services: svcs.Lister(), slices: eps.Lister(), changed: make(chan struct{}, 1),
		synced: []toolscache.InformerSynced{svcs.Informer().HasSynced, eps.Informer().HasSynced}, log: cfg.Logger.With("component", "netproxy")}
	wake := toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { p.wake() }, UpdateFunc: func(any, any) { p.wake() }, DeleteFunc: func(any) { p.wake() },
	}
	for _, inf := range []toolscache.SharedIndexInformer{svcs.Informer(), eps.Informer()} {
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

// Run syncs the rules until ctx ends: after changes, no more often than
// MinSyncPeriod, and every SyncPeriod whatever happened. The rules stay
// when it ends: the node's traffic goes on flowing while the agent
// restarts, as with kube-proxy.
func (p *Proxy) Run(ctx context.Context) {
	if !toolscache.WaitForCacheSync(ctx.Done(), p.synced...) {
		return
	}
	full := p.cfg.Clock.NewTicker(p.cfg.SyncPeriod)
	defer full.Stop()
	for {
		start := p.cfg.Clock.Now()
		if err := p.Sync(); err != nil {
			p.log.Warn("service rules not synced: trying again", "err", err)
			p.wake()
		}
		// Changes meanwhile wait for the next sync, MinSyncPeriod after
		// this one began.
		select {
		case <-ctx.Done():
			return
		case <-p.cfg.Clock.After(p.cfg.MinSyncPeriod - p.cfg.Clock.Since(start)):
		}
		select {
		case <-ctx.Done():
			return
		case <-p.changed:
		case <-full.C():
		}
	}
}

// Sync writes every rule of the proxy, as kube-proxy's full sync does:
// the jumps from the built-in chains, then the proxy's chains in one
// iptables-restore per table, deleting the chains of Services gone.
func (p *Proxy) Sync() error {
	start := time.Now()
	for _, table := range []string{"nat", "filter"} {
		for _, c := range []string{chainServices, chainNodePorts, chainPostrouting, chainMarkMasq, chainExternalServices, chainForward} {
			if table == "filter" && (c == chainPostrouting || c == chainMarkMasq) || table == "nat" && (c == chainExternalServices || c == chainForward) {
				continue
			}
			if err := p.cfg.IPTables.EnsureChain(table, c); err != nil {
				return err
			}
		}
	}
	for _, j := range jumps {
		if err := p.cfg.IPTables.EnsureRule(j.table, j.chain, j.rule...); err != nil {
			return err
		}
	}
	ports, err := p.servicePorts()
	if err != nil {
		return err
	}
	existing, err := p.cfg.IPTables.Chains("nat")
	if err != nil {
		return err
	}
	rs := buildRules(node{clusterCIDR: p.cfg.ClusterCIDR}, ports, existing)
	// filter first: a Service losing its endpoints is refused before its
	// DNAT goes.
	if err := p.cfg.IPTables.Restore("filter", rs.filter.Bytes()); err != nil {
		return err
	}
	if err := p.cfg.IPTables.Restore("nat", rs.nat.Bytes()); err != nil {
		return err
	}
	p.log.Debug("service rules synced", "servicePorts", len(ports), "rules", rs.rules, "took", time.Since(start).Round(time.Microsecond))
	return nil
}

// servicePorts are the ports of every Service with a cluster IP, with
// their endpoints from the Service's EndpointSlices.
func (p *Proxy) servicePorts() ([]*servicePort, error) {
	svcs, err := p.services.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	var out []*servicePort
	for _, svc := range svcs {
		ip := svc.Spec.ClusterIP
		if ip == "" || ip == corev1.ClusterIPNone || svc.Spec.Type == corev1.ServiceTypeExternalName {
			continue // headless and ExternalName Services have no rules
		}
		sel := labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: svc.Name})
		slices, err := p.slices.EndpointSlices(svc.Namespace).List(sel)
		if err != nil {
			return nil, err
		}
		name := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
		for _, port := range svc.Spec.Ports {
			protocol := port.Protocol
			if protocol == "" {
				protocol = corev1.ProtocolTCP
			}
			sp := &servicePort{name: portName(name, port.Name), service: name, protocol: protocol, clusterIP: ip, port: port.Port,
				externalIPs: svc.Spec.ExternalIPs}
			if svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
				sp.nodePort = port.NodePort
			}
			sp.externalLocal = svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
			sp.internalLocal = svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
			if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
				sp.affinitySeconds = corev1.DefaultClientIPServiceAffinitySeconds
				if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
					sp.affinitySeconds = *c.ClientIP.TimeoutSeconds
				}
			}
			sp.endpoints = endpointsFor(slices, port.Name, protocol, p.cfg.NodeName)
			out = append(out, sp)
		}
	}
	return out, nil
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
			if deref(sp.Name) == name && p == protocol && sp.Port != nil {
				port, found = *sp.Port, true
			}
		}
		if !found {
			continue
		}
		for _, e := range s.Endpoints {
			if len(e.Addresses) == 0 {
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
	slices.SortFunc(out, func(a, b endpoint) int {
		if a.ip != b.ip {
			return compareIP(a.ip, b.ip)
		}
		return int(a.port - b.port)
	})
	return out
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// compareIP orders addresses as strings of equal length would, so that
// rules come out in the same order every sync.
func compareIP(a, b string) int {
	if len(a) != len(b) {
		return len(a) - len(b)
	}
	if a < b {
		return -1
	}
	if a > b {
		return 1
	}
	return 0
}
