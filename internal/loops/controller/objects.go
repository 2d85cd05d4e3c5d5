package controller

import (
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	corelisters "k8s.io/client-go/listers/core/v1"
)

// What several loops read of the objects they keep, said once.

// NodeReady says whether the node's Ready condition is True.
func NodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// NodeAddress is where clients reach a node: its ExternalIP, else its
// InternalIP, as k3s's ServiceLB picks.
func NodeAddress(n *corev1.Node) string {
	for _, want := range []corev1.NodeAddressType{corev1.NodeExternalIP, corev1.NodeInternalIP} {
		for _, a := range n.Status.Addresses {
			if a.Type == want {
				return a.Address
			}
		}
	}
	return ""
}

// ServingAddresses are the addresses (NodeAddress) of the nodes that take
// traffic for a load balancer, sorted and once each: Ready, schedulable,
// and kept by keep when it is given (ServiceLB's Local policy).
func ServingAddresses(nodes []*corev1.Node, keep func(*corev1.Node) bool) []string {
	var ips []string
	for _, n := range nodes {
		if n.Spec.Unschedulable || !NodeReady(n) || keep != nil && !keep(n) {
			continue
		}
		if ip := NodeAddress(n); ip != "" && !slices.Contains(ips, ip) {
			ips = append(ips, ip)
		}
	}
	slices.Sort(ips)
	return ips
}

// ServingChanged says whether a node's update changes ServingAddresses:
// nodes are updated at every status report, and only these changes
// matter to the load balancers.
func ServingChanged(old, cur *corev1.Node) bool {
	return NodeReady(old) != NodeReady(cur) || NodeAddress(old) != NodeAddress(cur) || old.Spec.Unschedulable != cur.Spec.Unschedulable
}

// EndpointAddress says whether an endpoint may have ip, as the API's
// EndpointSlice validation says: an address, and not an unspecified,
// loopback or link-local one (a pod of a node at 127.0.0.1 has none).
func EndpointAddress(ip string) bool {
	a, err := netip.ParseAddr(ip)
	return err == nil && !a.IsUnspecified() && !a.IsLoopback() && !a.IsLinkLocalUnicast() && !a.IsLinkLocalMulticast()
}

// LiveNamespace reports whether the namespace exists and is not being
// deleted: the loops that keep an object in every namespace (its default
// service account, kube-root-ca.crt) make none in one going away.
func LiveNamespace(namespaces corelisters.NamespaceLister, name string) (bool, error) {
	ns, err := namespaces.Get(name)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return ns.DeletionTimestamp == nil && ns.Status.Phase != corev1.NamespaceTerminating, nil
}
