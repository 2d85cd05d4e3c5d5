package netpolicy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
)

// prefixTemp names the set a new membership is built in before it is
// swapped for the set the rules match (kube-router's own `ipset restore`
// of a set in use fails with "Resource busy": k3s #6328).
const prefixTemp = "KUBE-TMP-"

// Sets is the kernel's ipsets, as the engine uses them.
type Sets interface {
	// Names lists the sets there are.
	Names() ([]string, error)
	// Write makes set name hold exactly s's members, atomically for the
	// rules that match it.
	Write(name string, s *Set) error
	// Destroy removes set name; it is not an error that it is gone.
	Destroy(name string) error
}

// KernelSets is the node's ipsets, through netlink: no ipset binary.
type KernelSets struct{}

// Names lists the node's sets.
func (KernelSets) Names() ([]string, error) {
	all, err := netlink.IpsetListAll()
	if err != nil {
		return nil, fmt.Errorf("ipset list: %w", err)
	}
	names := make([]string, 0, len(all))
	for _, s := range all {
		names = append(names, s.SetName)
	}
	return names, nil
}

// Write builds the members in a temporary set and swaps it in; a set
// that does not exist yet is made and filled in place, since no rule
// matches it before it is written.
func (KernelSets) Write(name string, s *Set) error {
	entries, err := entries(s)
	if err != nil {
		return fmt.Errorf("ipset %s: %w", name, err)
	}
	target := name
	_, err = netlink.IpsetList(name)
	exists := err == nil
	if exists {
		target = prefixTemp + strings.TrimPrefix(strings.TrimPrefix(name, prefixSrc), prefixDst)
		if err := destroy(target); err != nil {
			return err
		}
	}
	// maxelem beyond the default 65,536: a selector may select every pod.
	if err := netlink.IpsetCreate(target, s.Type(), netlink.IpsetCreateOptions{MaxElements: max(65536, uint32(2*len(entries)))}); err != nil {
		return fmt.Errorf("ipset create %s %s: %w", target, s.Type(), err)
	}
	for i := range entries {
		if err := netlink.IpsetAdd(target, &entries[i]); err != nil && !errors.Is(err, syscall.EEXIST) {
			return fmt.Errorf("ipset add %s %s: %w", target, entries[i].IP, err)
		}
	}
	if !exists {
		return nil
	}
	if err := netlink.IpsetSwap(target, name); err != nil {
		return fmt.Errorf("ipset swap %s %s: %w", target, name, err)
	}
	return destroy(target)
}

// Destroy removes a set no rule matches any more.
func (KernelSets) Destroy(name string) error { return destroy(name) }

func destroy(name string) error {
	if err := netlink.IpsetDestroy(name); err != nil && !errors.Is(err, syscall.ENOENT) {
		if _, lerr := netlink.IpsetList(name); lerr != nil {
			return nil // gone
		}
		return fmt.Errorf("ipset destroy %s: %w", name, err)
	}
	return nil
}

func entries(s *Set) ([]netlink.IPSetEntry, error) {
	out := make([]netlink.IPSetEntry, 0, len(s.Members))
	for _, m := range s.Members {
		if s.Net {
			p, err := netip.ParsePrefix(m)
			if err != nil {
				return nil, err
			}
			p = p.Masked()
			if !p.Addr().Is4() {
				continue // an IPv4 node's sets
			}
			out = append(out, netlink.IPSetEntry{IP: net.IP(p.Addr().AsSlice()), CIDR: uint8(p.Bits())})
			continue
		}
		a, err := netip.ParseAddr(m)
		if err != nil {
			return nil, err
		}
		if !a.Is4() {
			continue
		}
		out = append(out, netlink.IPSetEntry{IP: net.IP(a.AsSlice())})
	}
	return out, nil
}
