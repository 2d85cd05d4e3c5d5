package netpolicy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// prefixTemp names the set a whole new membership is built in before it
// is swapped for the set the rules match (kube-router's own `ipset
// restore` of a set in use fails with "Resource busy": k3s #6328).
const prefixTemp = "KUBE-TMP-"

// Sets is the kernel's ipsets, as the engine uses them.
type Sets interface {
	// Names lists the sets there are.
	Names() ([]string, error)
	// Members lists a set's members; ok is false if there is no such set.
	Members(name string) (members []string, ok bool, err error)
	// Replace makes set name hold exactly s's members, atomically for the
	// rules that match it.
	Replace(name string, s *Set) error
	// Update adds and removes members one by one: each change is atomic,
	// and the set passes through the states between was and s's.
	Update(name string, s *Set, was []string) error
	// Destroy removes set name; it is not an error that it is gone.
	Destroy(name string) error
}

// KernelSets is the node's ipsets, through netlink (no ipset binary), on
// one socket of the network namespace it is first used in.
type KernelSets struct {
	mu sync.Mutex
	h  *netlink.Handle
}

func (k *KernelSets) handle() (*netlink.Handle, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.h == nil {
		h, err := netlink.NewHandle(unix.NETLINK_NETFILTER)
		if err != nil {
			return nil, fmt.Errorf("netlink: %w", err)
		}
		k.h = h
	}
	return k.h, nil
}

// Names lists the node's sets.
func (k *KernelSets) Names() ([]string, error) {
	h, err := k.handle()
	if err != nil {
		return nil, err
	}
	all, err := h.IpsetListAll()
	if err != nil {
		return nil, fmt.Errorf("ipset list: %w", err)
	}
	names := make([]string, 0, len(all))
	for _, s := range all {
		names = append(names, s.SetName)
	}
	return names, nil
}

// Members lists a set's members as the engine writes them: addresses, or
// prefixes for hash:net.
func (k *KernelSets) Members(name string) ([]string, bool, error) {
	h, err := k.handle()
	if err != nil {
		return nil, false, err
	}
	res, err := h.IpsetList(name)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) || strings.Contains(err.Error(), "not exist") {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("ipset list %s: %w", name, err)
	}
	members := make([]string, 0, len(res.Entries))
	for _, e := range res.Entries {
		a, ok := netip.AddrFromSlice(e.IP)
		if !ok {
			continue
		}
		a = a.Unmap()
		if res.TypeName == "hash:net" {
			members = append(members, netip.PrefixFrom(a, int(e.CIDR)).String())
		} else {
			members = append(members, a.String())
		}
	}
	slices.Sort(members)
	return members, true, nil
}

// Replace builds the members in a temporary set and swaps it in; a set
// that does not exist yet is made and filled in place, since no rule
// matches it before it is written.
func (k *KernelSets) Replace(name string, s *Set) error {
	h, err := k.handle()
	if err != nil {
		return err
	}
	entries, err := entries(s.Net, s.Members)
	if err != nil {
		return fmt.Errorf("ipset %s: %w", name, err)
	}
	target := name
	_, err = h.IpsetList(name)
	exists := err == nil
	if exists {
		target = prefixTemp + strings.TrimPrefix(strings.TrimPrefix(name, prefixSrc), prefixDst)
		if err := k.destroy(h, target); err != nil {
			return err
		}
	}
	// maxelem beyond the default 65,536: a selector may select every pod.
	if err := h.IpsetCreate(target, s.Type(), netlink.IpsetCreateOptions{MaxElements: max(65536, uint32(2*len(entries)))}); err != nil {
		return fmt.Errorf("ipset create %s %s: %w", target, s.Type(), err)
	}
	for i := range entries {
		if err := h.IpsetAdd(target, &entries[i]); err != nil && !errors.Is(err, syscall.EEXIST) {
			return fmt.Errorf("ipset add %s %s: %w", target, entries[i].IP, err)
		}
	}
	if !exists {
		return nil
	}
	if err := h.IpsetSwap(target, name); err != nil {
		return fmt.Errorf("ipset swap %s %s: %w", target, name, err)
	}
	return k.destroy(h, target)
}

// Update applies the difference between was and s's members.
func (k *KernelSets) Update(name string, s *Set, was []string) error {
	h, err := k.handle()
	if err != nil {
		return err
	}
	added, removed := diff(was, s.Members)
	add, err := entries(s.Net, added)
	if err != nil {
		return fmt.Errorf("ipset %s: %w", name, err)
	}
	del, err := entries(s.Net, removed)
	if err != nil {
		return fmt.Errorf("ipset %s: %w", name, err)
	}
	for i := range add {
		if err := h.IpsetAdd(name, &add[i]); err != nil && !errors.Is(err, syscall.EEXIST) {
			return fmt.Errorf("ipset add %s %s: %w", name, add[i].IP, err)
		}
	}
	for i := range del {
		if err := h.IpsetDel(name, &del[i]); err != nil && !errors.Is(err, syscall.ENOENT) && !strings.Contains(err.Error(), "not added") {
			return fmt.Errorf("ipset del %s %s: %w", name, del[i].IP, err)
		}
	}
	return nil
}

// Destroy removes a set no rule matches any more.
func (k *KernelSets) Destroy(name string) error {
	h, err := k.handle()
	if err != nil {
		return err
	}
	return k.destroy(h, name)
}

func (k *KernelSets) destroy(h *netlink.Handle, name string) error {
	if err := h.IpsetDestroy(name); err != nil && !errors.Is(err, syscall.ENOENT) {
		if _, lerr := h.IpsetList(name); lerr != nil {
			return nil // gone
		}
		return fmt.Errorf("ipset destroy %s: %w", name, err)
	}
	return nil
}

// diff is what to add to a sorted was, and remove from it, to make the
// sorted now.
func diff(was, now []string) (added, removed []string) {
	i, j := 0, 0
	for i < len(was) || j < len(now) {
		switch {
		case j == len(now) || i < len(was) && was[i] < now[j]:
			removed = append(removed, was[i])
			i++
		case i == len(was) || now[j] < was[i]:
			added = append(added, now[j])
			j++
		default:
			i++
			j++
		}
	}
	return added, removed
}

func entries(isNet bool, members []string) ([]netlink.IPSetEntry, error) {
	out := make([]netlink.IPSetEntry, 0, len(members))
	for _, m := range members {
		if isNet {
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

// KernelSupport says why this node cannot enforce policies, if it cannot:
// no ip sets (kube-router's users find their policies silently skipped
// then: k3s #3327), or bridged traffic between a node's pods not passing
// iptables (br_netfilter).
func KernelSupport() error {
	if _, _, err := netlink.IpsetProtocol(); err != nil {
		return fmt.Errorf("the kernel has no ip sets (modprobe ip_set ip_set_hash_ip ip_set_hash_net xt_set): %w", err)
	}
	if v, err := os.ReadFile("/proc/sys/net/bridge/bridge-nf-call-iptables"); err != nil || strings.TrimSpace(string(v)) != "1" {
		return errors.New("traffic between a node's pods does not pass iptables (modprobe br_netfilter; sysctl net.bridge.bridge-nf-call-iptables=1)")
	}
	return nil
}
