package core

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestEndpointsDefaults: a port without a protocol is TCP, as Kubernetes
// defaults it (a custom Endpoints' mirrored EndpointSlice needs one: the
// conformance spec mirroring custom Endpoints creates them so).
func TestEndpointsDefaults(t *testing.T) {
	ep := &corev1.Endpoints{Subsets: []corev1.EndpointSubset{{Ports: []corev1.EndpointPort{{Port: 80}, {Port: 53, Protocol: corev1.ProtocolUDP}}}}}
	endpoints().Default(ep)
	if got := ep.Subsets[0].Ports; got[0].Protocol != corev1.ProtocolTCP || got[1].Protocol != corev1.ProtocolUDP {
		t.Errorf("protocols %q, %q", got[0].Protocol, got[1].Protocol)
	}
}
