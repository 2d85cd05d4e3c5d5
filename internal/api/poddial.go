package api

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// podDialer is how the server connects to pods: its admission and
// conversion webhooks, pods/proxy and services/proxy. A server that runs
// an agent is on the pod network and dials pods' addresses directly; one
// that does not (--disable-agent) has no route to them, so an address of
// the cluster CIDR is reached through the kubelet API of the pod's node,
// as k3s's egress selector sends such connections through its agents.
// Other addresses (a webhook's URL, a host-network pod) are dialled as
// they are.
type podDialer struct {
	s *Server
	// throughNodes is set when the server is not on the pod network.
	throughNodes bool
	clusterCIDR  netip.Prefix
	direct       net.Dialer
}

func newPodDialer(s *Server) *podDialer {
	d := &podDialer{s: s, throughNodes: s.cfg.PodsBehindNodes, direct: net.Dialer{Timeout: 10 * time.Second}}
	cidr := s.cfg.ClusterCIDR
	if cidr == "" {
		cidr = defaultClusterCIDR
	}
	if p, err := netip.ParsePrefix(cidr); err == nil {
		d.clusterCIDR = p.Masked()
	}
	return d
}

// defaultClusterCIDR is the pod network's when --cluster-cidr is not
// given (k3s's).
const defaultClusterCIDR = "10.42.0.0/16"

// DialContext connects to addr, a pod's through its node when the server
// is not on the pod network.
func (d *podDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	if !d.throughNodes {
		return d.direct.DialContext(ctx, network, addr)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || !d.clusterCIDR.Contains(ip.Unmap()) {
		return d.direct.DialContext(ctx, network, addr)
	}
	pod, node, err := d.podAt(ctx, ip)
	if err != nil {
		return nil, err
	}
	return d.s.kubelets.DialPod(ctx, node, pod.Namespace, pod.Name, port)
}

// podAt finds the running pod that has ip, and its node.
func (d *podDialer) podAt(ctx context.Context, ip netip.Addr) (*corev1.Pod, *corev1.Node, error) {
	list, err := d.s.storage("", "pods").List(ctx, "", &metav1.ListOptions{FieldSelector: "status.podIP=" + ip.String()})
	if err != nil {
		return nil, nil, fmt.Errorf("finding the pod at %s: %w", ip, err)
	}
	for i := range list.(*corev1.PodList).Items {
		pod := &list.(*corev1.PodList).Items[i]
		if pod.Spec.NodeName == "" || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		obj, err := d.s.storage("", "nodes").Get(ctx, "", pod.Spec.NodeName)
		if err != nil {
			return nil, nil, fmt.Errorf("the node of pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		return pod, obj.(*corev1.Node), nil
	}
	return nil, nil, apierrors.NewServiceUnavailable(fmt.Sprintf("no running pod has the address %s", ip))
}
