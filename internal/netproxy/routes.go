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

// routeProtocol marks the routes the pod network makes (the kernel's
// route protocol field; 0x4f, "O"), so that a sync finds its own routes,
// those of nodes gone included, and touches no other.
const routeProtocol = netlink.RouteProtocol(0x4f)

// RoutesConfig is what the host-gw pod network needs.
type RoutesConfig struct {
	Informers *kube.Informers
	IPTables  iptables.Interface
	// NodeName is this node's: the others' pod networks are routed.
	NodeName string
	// ClusterCIDR is every node's pods' network, forwarded whatever the
	// host's FORWARD policy.
	ClusterCIDR string
	// Every is how often the routes are checked even without a change
	// (30 s), repairing routes removed by hand.
	Every  time.Duration
	Logger *slog.Logger
}

// Routes is the host-gw pod network, flannel's backend of that name: a
// route to every other node's podCIDR through that node's address, for
// nodes on one L2 segment. Pods keep their addresses end to end. The
// routes stay when the API server goes away (the informer keeps the last
// nodes it saw) and when the agent stops.
type Routes struct {
	cfg     RoutesConfig
	nodes   corelisters.NodeLister
	synced  toolscache.InformerSynced
	changed chan struct{}
	log     *slog.Logger
	mu      sync.Mutex
}

// NewRoutes registers the node informer; Run syncs.
func NewRoutes(cfg RoutesConfig) (*Routes, error) {
	if cfg.Every == 0 {
		cfg.Every = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	nodes := cfg.Informers.Nodes()
	r := &Routes{cfg: cfg, nodes: nodes.Lister(), synced: nodes.Informer().HasSynced, changed: make(chan struct{}, 1),
		log: cfg.Logger.With("component", "podnetwork")}
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

// Run keeps the routes until ctx ends.
func (r *Routes) Run(ctx context.Context) {
	if !toolscache.WaitForCacheSync(ctx.Done(), r.synced) {
		return
	}
	t := time.NewTicker(r.cfg.Every)
	defer t.Stop()
	for {
		if err := r.Sync(); err != nil {
			r.log.Warn("pod network routes not synced", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-r.changed:
		case <-t.C:
		}
	}
}

// Sync makes the route to every other node's pod network and removes the
// routes of nodes gone; it lets pod traffic through FORWARD.
func (r *Routes) Sync() error {
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
	want := map[string]netlink.Route{}
	for _, n := range nodes {
		if n.Name == r.cfg.NodeName {
			continue
		}
		route, ok := routeTo(n)
		if !ok {
			continue
		}
		want[route.Dst.String()] = route
	}
	have, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Protocol: routeProtocol}, netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return fmt.Errorf("list routes: %w", err)
	}
	var errs []error
	for _, h := range have {
		if w, ok := want[h.Dst.String()]; ok && w.Gw.Equal(h.Gw) {
			delete(want, h.Dst.String())
			continue
		}
		if _, ok := want[h.Dst.String()]; ok {
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

// routeTo is the route to node's pods: its podCIDR through its first
// InternalIP.
func routeTo(n *corev1.Node) (netlink.Route, bool) {
	if n.Spec.PodCIDR == "" {
		return netlink.Route{}, false
	}
	_, dst, err := net.ParseCIDR(n.Spec.PodCIDR)
	if err != nil || dst.IP.To4() == nil {
		return netlink.Route{}, false
	}
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		if gw := net.ParseIP(a.Address); gw != nil && gw.To4() != nil {
			return netlink.Route{Dst: dst, Gw: gw, Protocol: routeProtocol}, true
		}
	}
	return netlink.Route{}, false
}
