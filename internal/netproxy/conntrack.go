package netproxy

import (
	"fmt"
	"net"

	corev1 "k8s.io/api/core/v1"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// conntracker forgets connections: UDP has no connection to end, so a
// client keeps sending to an endpoint that went away for as long as the
// kernel's conntrack entry lasts (DNS through a Service depends on its
// being forgotten at once).
type conntracker interface {
	// ForgetUDP removes the UDP entries to dst (any local address when
	// nil) on port that the endpoint at ip answered.
	ForgetUDP(dst net.IP, port uint16, endpoint net.IP) error
}

// kernelConntrack is the kernel's conntrack table, through netlink.
type kernelConntrack struct{}

func (kernelConntrack) ForgetUDP(dst net.IP, port uint16, endpoint net.IP) error {
	f := &netlink.ConntrackFilter{}
	if err := f.AddProtocol(unix.IPPROTO_UDP); err != nil {
		return err
	}
	if dst != nil {
		if err := f.AddIP(netlink.ConntrackOrigDstIP, dst); err != nil {
			return err
		}
	}
	if err := f.AddPort(netlink.ConntrackOrigDstPort, port); err != nil {
		return err
	}
	if err := f.AddIP(netlink.ConntrackReplySrcIP, endpoint); err != nil {
		return err
	}
	if _, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, f); err != nil {
		return fmt.Errorf("conntrack: forget UDP to %v:%d from %v: %w", dst, port, endpoint, err)
	}
	return nil
}

// udpTargets are where a UDP service port takes traffic, with its
// endpoints, to forget what a removed endpoint answered.
type udpTargets struct {
	clusterIP   string
	port        int32
	nodePort    int32
	externalIPs []string
	endpoints   map[string]endpoint
}

// udpState is the UDP service ports' targets by name and protocol.
func udpState(ports []*servicePort) map[string]udpTargets {
	out := map[string]udpTargets{}
	for _, sp := range ports {
		if sp.protocol != corev1.ProtocolUDP {
			continue
		}
		t := udpTargets{clusterIP: sp.clusterIP, port: sp.port, nodePort: sp.nodePort, externalIPs: sp.externalIPs, endpoints: map[string]endpoint{}}
		for _, e := range sp.usable() {
			t.endpoints[e.String()] = e
		}
		out[sp.name] = t
	}
	return out
}

// forgetRemoved forgets the UDP entries answered by endpoints in before
// that now are not, for every address the service port had.
func forgetRemoved(ct conntracker, before, now map[string]udpTargets) error {
	var errs []error
	for name, old := range before {
		cur := now[name]
		for key, e := range old.endpoints {
			if _, still := cur.endpoints[key]; still {
				continue
			}
			ip := net.ParseIP(e.ip)
			for _, dst := range append([]string{old.clusterIP}, old.externalIPs...) {
				if err := ct.ForgetUDP(net.ParseIP(dst), uint16(old.port), ip); err != nil {
					errs = append(errs, err)
				}
			}
			if old.nodePort != 0 {
				if err := ct.ForgetUDP(nil, uint16(old.nodePort), ip); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%d conntrack deletions failed, the first: %w", len(errs), errs[0])
	}
	return nil
}
