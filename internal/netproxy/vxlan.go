package netproxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
)

// The VXLAN backend is flannel's, device, port and Node annotations
// alike, as k3s (which embeds flannel) lays them out: `ip -d link show
// flannel.1`, `bridge fdb show dev flannel.1` and the guides that read
// them apply.
const (
	vxlanDevice = "flannel.1"
	vxlanVNI    = 1
	// vxlanPort is flannel's and the Linux kernel's default, not IANA's
	// 4789.
	vxlanPort = 8472
	// VXLANOverhead is what the tunnel takes of the parent link's MTU:
	// the outer IPv4 (20), UDP (8), VXLAN (8) and Ethernet (14) headers.
	VXLANOverhead = 50

	annotationBackendType   = "flannel.alpha.coreos.com/backend-type"
	annotationBackendData   = "flannel.alpha.coreos.com/backend-data"
	annotationPublicIP      = "flannel.alpha.coreos.com/public-ip"
	annotationSubnetManager = "flannel.alpha.coreos.com/kube-subnet-manager"
)

// vxlanBackendData is flannel's backend-data annotation for vxlan.
type vxlanBackendData struct {
	VNI     int    `json:"VNI"`
	VtepMAC string `json:"VtepMAC"`
}

// VXLANMTU is the MTU of the tunnel from the node whose address is
// nodeIP, and so of its pods' interfaces: large transfers between pods on
// two nodes would otherwise stall on packets the tunnel cannot carry.
func VXLANMTU(nodeIP string) (int, error) {
	parent, err := linkWithAddress(net.ParseIP(nodeIP))
	if err != nil {
		return 0, err
	}
	return parent.Attrs().MTU - VXLANOverhead, nil
}

// linkWithAddress is the link holding ip.
func linkWithAddress(ip net.IP) (netlink.Link, error) {
	if ip == nil {
		return nil, errors.New("no node address")
	}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		if a.IP.Equal(ip) {
			link, err := netlink.LinkByIndex(a.LinkIndex)
			if err != nil {
				return nil, fmt.Errorf("the link of %s: %w", ip, err)
			}
			return link, nil
		}
	}
	return nil, fmt.Errorf("no link has the node's address %s", ip)
}

// syncVXLAN keeps the tunnel device, publishes its end on this node's
// Node, and, for every other node that published one, the route to its
// pods through the device, the ARP entry of its gateway (the peer's
// podCIDR's first address, on its device) and the forwarding entry
// sending that MAC to the peer's address: flannel's static
// configuration, with no learning and no multicast.
func (r *PodNetwork) syncVXLAN(ctx context.Context, self *corev1.Node, peers []*corev1.Node) error {
	if self == nil {
		return fmt.Errorf("node %s is not registered yet", r.cfg.NodeName)
	}
	ownCIDR, ok := podCIDR(self)
	if !ok {
		return fmt.Errorf("node %s has no IPv4 spec.podCIDR yet", self.Name)
	}
	local := net.ParseIP(r.cfg.NodeIP).To4()
	if local == nil {
		local = internalIP(self)
	}
	if local == nil {
		return fmt.Errorf("node %s has no IPv4 address for the VXLAN tunnel", self.Name)
	}
	dev, err := r.ensureVXLANDevice(local, ownCIDR)
	if err != nil {
		return err
	}
	data, err := json.Marshal(vxlanBackendData{VNI: vxlanVNI, VtepMAC: dev.Attrs().HardwareAddr.String()})
	if err != nil {
		return err
	}
	publish := map[string]string{annotationBackendType: VXLAN, annotationBackendData: string(data),
		annotationPublicIP: local.String(), annotationSubnetManager: "true"}
	var errs []error
	if r.cfg.Annotate != nil && !hasAnnotations(self, publish) {
		if err := r.cfg.Annotate(ctx, publish); err != nil {
			errs = append(errs, fmt.Errorf("publish the VXLAN tunnel end on node %s: %w", self.Name, err))
		} else {
			r.log.Info("VXLAN tunnel end published", "mac", dev.Attrs().HardwareAddr.String(), "publicIP", local.String())
		}
	}

	index := dev.Attrs().Index
	routes := map[string]netlink.Route{}
	arp := map[string]net.HardwareAddr{} // gateway address → MAC
	fdb := map[string]net.IP{}           // MAC → the peer's address
	for _, n := range peers {
		dst, ok := podCIDR(n)
		if !ok || n.Annotations[annotationBackendType] != VXLAN {
			continue
		}
		var peer vxlanBackendData
		if err := json.Unmarshal([]byte(n.Annotations[annotationBackendData]), &peer); err != nil || peer.VNI != vxlanVNI {
			continue
		}
		mac, err := net.ParseMAC(peer.VtepMAC)
		publicIP := net.ParseIP(n.Annotations[annotationPublicIP]).To4()
		if err != nil || publicIP == nil {
			continue
		}
		gw := dst.IP.To4()
		routes[dst.String()] = netlink.Route{Dst: dst, Gw: gw, LinkIndex: index, Flags: int(netlink.FLAG_ONLINK), Protocol: routeProtocol}
		arp[gw.String()] = mac
		fdb[mac.String()] = publicIP
	}
	// Neighbours first: a route without them would send pods' packets
	// into the tunnel with nowhere to go.
	for gw, mac := range arp {
		if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
			IP: net.ParseIP(gw), HardwareAddr: mac}); err != nil {
			errs = append(errs, fmt.Errorf("ARP entry %s: %w", gw, err))
		}
	}
	for mac, ip := range fdb {
		hw, _ := net.ParseMAC(mac)
		if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: index, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF, State: netlink.NUD_PERMANENT,
			IP: ip, HardwareAddr: hw}); err != nil {
			errs = append(errs, fmt.Errorf("forwarding entry %s → %s: %w", mac, ip, err))
		}
	}
	errs = append(errs, r.syncRoutes(routes))
	errs = append(errs, removeStaleNeighbours(index, arp, fdb))
	return errors.Join(errs...)
}

func hasAnnotations(n *corev1.Node, want map[string]string) bool {
	for k, v := range want {
		if n.Annotations[k] != v {
			return false
		}
	}
	return true
}

// ensureVXLANDevice makes the tunnel device, or keeps the one there (its
// MAC, which the other nodes know, with it) when it matches; it is up,
// with the MTU its parent leaves it and this node's podCIDR's first
// address, the source of what the node itself sends to other nodes' pods.
func (r *PodNetwork) ensureVXLANDevice(local net.IP, ownCIDR *net.IPNet) (netlink.Link, error) {
	parent, err := linkWithAddress(local)
	if err != nil {
		return nil, err
	}
	mtu := parent.Attrs().MTU - VXLANOverhead
	link, err := netlink.LinkByName(vxlanDevice)
	if err != nil && !errors.As(err, new(netlink.LinkNotFoundError)) {
		return nil, fmt.Errorf("%s: %w", vxlanDevice, err)
	}
	if link != nil {
		v, ok := link.(*netlink.Vxlan)
		if !ok || v.VxlanId != vxlanVNI || v.Port != vxlanPort || !v.SrcAddr.Equal(local) || v.VtepDevIndex != parent.Attrs().Index || v.Learning {
			r.log.Info("replacing a VXLAN device that does not match", "device", vxlanDevice)
			if err := netlink.LinkDel(link); err != nil {
				return nil, fmt.Errorf("remove the old %s: %w", vxlanDevice, err)
			}
			link = nil
		}
	}
	if link == nil {
		v := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: vxlanDevice, MTU: mtu}, VxlanId: vxlanVNI,
			VtepDevIndex: parent.Attrs().Index, SrcAddr: local, Port: vxlanPort, Learning: false}
		if err := netlink.LinkAdd(v); err != nil {
			return nil, fmt.Errorf("create %s: %w", vxlanDevice, err)
		}
		if link, err = netlink.LinkByName(vxlanDevice); err != nil {
			return nil, fmt.Errorf("%s: %w", vxlanDevice, err)
		}
		r.log.Info("VXLAN device created", "device", vxlanDevice, "mtu", mtu, "local", local.String())
	}
	if link.Attrs().MTU != mtu {
		if err := netlink.LinkSetMTU(link, mtu); err != nil {
			return nil, fmt.Errorf("%s's MTU: %w", vxlanDevice, err)
		}
	}
	own := &net.IPNet{IP: ownCIDR.IP.To4(), Mask: net.CIDRMask(32, 32)}
	addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("%s's addresses: %w", vxlanDevice, err)
	}
	for _, a := range addrs {
		if !a.IP.Equal(own.IP) {
			if err := netlink.AddrDel(link, &a); err != nil {
				return nil, fmt.Errorf("remove %s from %s: %w", a.IPNet, vxlanDevice, err)
			}
		}
	}
	if err := netlink.AddrReplace(link, &netlink.Addr{IPNet: own}); err != nil {
		return nil, fmt.Errorf("address %s on %s: %w", own, vxlanDevice, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return nil, fmt.Errorf("%s up: %w", vxlanDevice, err)
	}
	return link, nil
}

// removeStaleNeighbours removes the device's ARP and forwarding entries
// of nodes gone or changed.
func removeStaleNeighbours(index int, arp map[string]net.HardwareAddr, fdb map[string]net.IP) error {
	var errs []error
	v4, err := netlink.NeighList(index, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("ARP entries: %w", err)
	}
	for _, n := range v4 {
		if mac, ok := arp[n.IP.String()]; ok && mac.String() == n.HardwareAddr.String() {
			continue
		}
		if err := netlink.NeighDel(&n); err != nil {
			errs = append(errs, fmt.Errorf("remove ARP entry %s: %w", n.IP, err))
		}
	}
	bridge, err := netlink.NeighList(index, unix.AF_BRIDGE)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("forwarding entries: %w", err))...)
	}
	for _, n := range bridge {
		if ip, ok := fdb[n.HardwareAddr.String()]; ok && ip.Equal(n.IP) {
			continue
		}
		n.Flags |= netlink.NTF_SELF
		if err := netlink.NeighDel(&n); err != nil {
			errs = append(errs, fmt.Errorf("remove forwarding entry %s: %w", n.HardwareAddr, err))
		}
	}
	return errors.Join(errs...)
}
