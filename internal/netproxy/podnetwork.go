package netproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/orch-dev/orch/internal/iptables"
	"github.com/orch-dev/orch/internal/kube"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
)

// The backends of the pod network across nodes, flannel's names.
const (
	// VXLAN tunnels pod traffic in UDP between the nodes' addresses, so
	// nodes may sit on different (routed) networks.
	VXLAN = "vxlan"
	// HostGW routes each node's pods through the node's address, for
	// nodes on one L2 segment: no encapsulation, no MTU cost.
	HostGW = "host-gw"
)

// routeProtocol marks the routes the pod network makes (the kernel's
// route protocol field; 0x4f, "O"), so that a sync finds its own routes,
// those of nodes gone included, and touches no other.
const routeProtocol = netlink.RouteProtocol(0x4f)

// PodNetworkConfig is what the pod network across nodes needs.
type PodNetworkConfig struct {
	Informers *kube.Informers
	IPTables  iptables.Interface
	// Backend is VXLAN or HostGW.
	Backend string
	// NodeName is this node's: the others' pod networks are routed.
	NodeName string
	// NodeIP is the address the other nodes reach this one at (VXLAN's
	// tunnel end); empty: the node's first InternalIP.
	NodeIP string
	// ClusterCIDR is every node's pods' network, forwarded whatever the
	// host's FORWARD policy.
	ClusterCIDR string
	// Annotate merges annotations into this node's Node (VXLAN publishes
	// its tunnel end there, as flannel does). The pod network itself
	// reads Nodes as kube-proxy may; writing the node's own object is the
	// node's identity's business.
	Annotate func(ctx context.Context, annotations map[string]string) error
	// Every is how often the routes are checked even without a change
	// (30 s), repairing routes removed by hand.
	Every  time.Duration
	Logger *slog.Logger
}

// PodNetwork is the pod network across nodes, flannel's job in k3s: every
// other node's podCIDR is reachable from this node (VXLAN or host-gw),
// and pods keep their addresses end to end. What it made stays when the
// API server goes away (the informer keeps the last nodes it saw) and
// when the agent stops.
type PodNetwork struct {
	cfg     PodNetworkConfig
	nodes   corelisters.NodeLister
	synced  toolscache.InformerSynced
	changed chan struct{}
	log     *slog.Logger
	mu      sync.Mutex
}

// NewPodNetwork registers the node informer; Run syncs.
func NewPodNetwork(cfg PodNetworkConfig) (*PodNetwork, error) {
	switch cfg.Backend {
	case VXLAN, HostGW:
	default:
		return nil, fmt.Errorf("pod network backend %q: want %s or %s", cfg.Backend, VXLAN, HostGW)
	}
	if cfg.Every == 0 {
		cfg.Every = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	nodes := cfg.Informers.Nodes()
	r := &PodNetwork{cfg: cfg, nodes: nodes.Lister(), synced: nodes.Informer().HasSynced, changed: make(chan struct{}, 1),
		log: cfg.Logger.With("component", "podnetwork", "backend", cfg.Backend)}
	wake := func() {
		select {
		case r.changed <- struct{}{}:
		default:
		}
	}
	if _, err := nodes.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { wake() }, UpdateFunc: func(any, any) { wake() }, DeleteFunc: func(any) { wake() },
	}); err != nil {
		return nil, err
	}
	return r, nil
}

// Run keeps the pod network until ctx ends.
func (r *PodNetwork) Run(ctx context.Context) {
	if !toolscache.WaitForCacheSync(ctx.Done(), r.synced) {
		return
	}
	t := time.NewTicker(r.cfg.Every)
	defer t.Stop()
	for {
		if err := r.Sync(ctx); err != nil {
			r.log.Warn("pod network not synced", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-r.changed:
		case <-t.C:
		}
	}
}

// Sync makes the way to every other node's pods and removes that of
// nodes gone; it lets pod traffic through FORWARD.
func (r *PodNetwork) Sync(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rule := range [][]string{
		{"-s", r.cfg.ClusterCIDR, "-m", "comment", "--comment", "orch pod network", "-j", "ACCEPT"},
		{"-d", r.cfg.ClusterCIDR, "-m", "comment", "--comment", "orch pod network", "-j", "ACCEPT"},
	} {
		if err := r.cfg.IPTables.EnsureRule("filter", "FORWARD", rule...); err != nil {
			return err
		}
	}
	nodes, err := r.nodes.List(labels.Everything())
	if err != nil {
		return err
	}
	var peers []*corev1.Node
	var self *corev1.Node
	for _, n := range nodes {
		if n.Name == r.cfg.NodeName {
			self = n
		} else {
			peers = append(peers, n)
		}
	}
	if r.cfg.Backend == HostGW {
		want := map[string]netlink.Route{}
		for _, n := range peers {
			if route, ok := hostGWRoute(n); ok {
				want[route.Dst.String()] = route
			}
		}
		return r.syncRoutes(want)
	}
	return r.syncVXLAN(ctx, self, peers)
}

// syncRoutes makes the routes want (by destination) and removes the pod
// network's other routes.
func (r *PodNetwork) syncRoutes(want map[string]netlink.Route) error {
	have, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Protocol: routeProtocol}, netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return fmt.Errorf("list routes: %w", err)
	}
	var errs []error
	for _, h := range have {
		w, ok := want[h.Dst.String()]
		if ok && w.Gw.Equal(h.Gw) && (w.LinkIndex == 0 || w.LinkIndex == h.LinkIndex) {
			delete(want, h.Dst.String())
			continue
		}
		if ok {
			continue // replaced below
		}
		if err := netlink.RouteDel(&h); err != nil {
			errs = append(errs, fmt.Errorf("remove the route to %s: %w", h.Dst, err))
		} else {
			r.log.Info("route to a node's pods removed", "podCIDR", h.Dst.String(), "via", h.Gw.String())
		}
	}
	for _, w := range want {
		if err := netlink.RouteReplace(&w); err != nil {
			errs = append(errs, fmt.Errorf("route %s via %s: %w", w.Dst, w.Gw, err))
			continue
		}
		r.log.Info("route to a node's pods", "podCIDR", w.Dst.String(), "via", w.Gw.String())
	}
	return errors.Join(errs...)
}

// hostGWRoute is the route to node's pods: its podCIDR through its first
// InternalIP.
func hostGWRoute(n *corev1.Node) (netlink.Route, bool) {
	dst, ok := podCIDR(n)
	if !ok {
		return netlink.Route{}, false
	}
	if gw := internalIP(n); gw != nil {
		return netlink.Route{Dst: dst, Gw: gw, Protocol: routeProtocol}, true
	}
	return netlink.Route{}, false
}

func podCIDR(n *corev1.Node) (*net.IPNet, bool) {
	if n == nil || n.Spec.PodCIDR == "" {
		return nil, false
	}
	_, dst, err := net.ParseCIDR(n.Spec.PodCIDR)
	if err != nil || dst.IP.To4() == nil {
		return nil, false
	}
	return dst, true
}

func internalIP(n *corev1.Node) net.IP {
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		if ip := net.ParseIP(a.Address); ip != nil && ip.To4() != nil {
			return ip.To4()
		}
	}
	return nil
}
