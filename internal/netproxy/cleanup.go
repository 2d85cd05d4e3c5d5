package netproxy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/orch-dev/orch/internal/iptables"
	"github.com/vishvananda/netlink"
)

// Cleanup removes what the service proxy and the pod network made on the
// node, as kube-proxy --cleanup does for its rules: the nftables mode's
// table, the iptables mode's chains in nat and filter and the jumps to
// them, the pod network's FORWARD
// rules, its routes and its VXLAN device. It is for a node being
// uninstalled, after orch has stopped: a running agent makes them again.
// It returns what it removed, by kind.
func Cleanup(ipt iptables.Interface) (map[string]int, error) {
	removed := map[string]int{}
	var errs []error
	if had, err := RemoveNFTables(context.Background()); err != nil {
		errs = append(errs, err)
	} else if had {
		removed["nftables tables"]++
	}
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

// RemoveIPTablesRules removes the iptables mode's chains and the jumps to
// them, for a node whose proxy now runs in the nftables mode (two modes'
// DNAT at once would fight). It returns how many rules and chains went.
func RemoveIPTablesRules(ipt iptables.Interface) (int, error) {
	total := 0
	var errs []error
	for _, table := range []string{"nat", "filter"} {
		n, err := iptables.RemoveOwned(ipt, table, proxyChain, func(string) bool { return false })
		if err != nil {
			errs = append(errs, fmt.Errorf("%s table: %w", table, err))
		}
		total += n
	}
	return total, errors.Join(errs...)
}

// DisableLocalhostNodePorts turns route_localnet off again: the nftables
// mode takes no node ports on 127.0.0.1, and the iptables mode's rule
// that kept neighbours off the node's 127.0.0.1 (CVE-2020-8558) is gone
// with that mode.
func DisableLocalhostNodePorts() error {
	if err := os.WriteFile(routeLocalnet, []byte("0"), 0o644); err != nil {
		return fmt.Errorf("route_localnet off: %w", err)
	}
	return nil
}
