package netproxy

import (
	"errors"
	"fmt"
	"strings"

	"github.com/orch-dev/orch/internal/iptables"
	"github.com/vishvananda/netlink"
)

// Cleanup removes what the service proxy and the pod network made on the
// node, as kube-proxy --cleanup does for its rules: kube-proxy's chains
// in nat and filter and the jumps to them, the pod network's FORWARD
// rules, its routes and its VXLAN device. It is for a node being
// uninstalled, after orch has stopped: a running agent makes them again.
// It returns what it removed, by kind.
func Cleanup(ipt iptables.Interface) (map[string]int, error) {
	removed := map[string]int{}
	var errs []error
	for _, table := range []string{"nat", "filter"} {
		n, err := iptables.RemoveOwned(ipt, table, proxyChain, func(rule string) bool { return strings.Contains(rule, "orch pod network") })
		if err != nil {
			errs = append(errs, fmt.Errorf("%s table: %w", table, err))
		}
		removed["iptables "+table] = n
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Protocol: routeProtocol}, netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		errs = append(errs, fmt.Errorf("list routes: %w", err))
	}
	for _, r := range routes {
		if err := netlink.RouteDel(&r); err != nil {
			errs = append(errs, fmt.Errorf("remove the route to %s: %w", r.Dst, err))
			continue
		}
		removed["routes"]++
	}
	if link, err := netlink.LinkByName(vxlanDevice); err == nil {
		if err := netlink.LinkDel(link); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", vxlanDevice, err))
		} else {
			removed["links"]++
		}
	} else if !errors.As(err, new(netlink.LinkNotFoundError)) {
		errs = append(errs, fmt.Errorf("%s: %w", vxlanDevice, err))
	}
	return removed, errors.Join(errs...)
}

// proxyChain says whether chain is one the service proxy makes.
func proxyChain(chain string) bool {
	switch chain {
	case chainServices, chainExternalServices, chainNodePorts, chainPostrouting, chainMarkMasq, chainForward, chainFirewall:
		return true
	}
	return perServiceChain(chain)
}
