package gateway

import (
	"k8s.io/utils/ptr"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// TestService: a Gateway's Service has one port per listener port, the
// usable addresses the Gateway names as external IPs (Local policy), the
// Gateway API's labels and the Gateway's infrastructure labels and
// annotations, and the Gateway as its owner.
func TestService(t *testing.T) {
	ipType := gatewayv1.IPAddressType
	gw := &gatewayv1.Gateway{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "apps", UID: "u1"},
		Spec: gatewayv1.GatewaySpec{GatewayClassName: "orch",
			Listeners: []gatewayv1.Listener{{Name: "a", Port: 80, Protocol: gatewayv1.HTTPProtocolType}, {Name: "b", Port: 80, Protocol: gatewayv1.HTTPProtocolType,
				Hostname: ptr.To(gatewayv1.Hostname("b.example"))}, {Name: "tls", Port: 443, Protocol: gatewayv1.HTTPSProtocolType}},
			Addresses: []gatewayv1.GatewaySpecAddress{{Type: &ipType, Value: "192.0.2.20"}, {Value: "127.0.0.2"}},
			Infrastructure: &gatewayv1.GatewayInfrastructure{Labels: map[gatewayv1.LabelKey]gatewayv1.LabelValue{"team": "web", gatewayv1.GatewayNameLabelKey: "spoof"},
				Annotations: map[gatewayv1.AnnotationKey]gatewayv1.AnnotationValue{"note": "hi"}}}}
	svc := (&Controller{}).service(gw)
	if svc.Name != "web-orch-gateway" || len(svc.Spec.Ports) != 2 || svc.Spec.Ports[0].Port != 80 || svc.Spec.Ports[1].Port != 443 {
		t.Errorf("name and ports: %s %+v", svc.Name, svc.Spec.Ports)
	}
	if len(svc.Spec.ExternalIPs) != 1 || svc.Spec.ExternalIPs[0] != "192.0.2.20" || svc.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal ||
		*svc.Spec.InternalTrafficPolicy != corev1.ServiceInternalTrafficPolicyLocal {
		t.Errorf("addresses and policies: %+v", svc.Spec)
	}
	if svc.Labels["team"] != "web" || svc.Labels[gatewayv1.GatewayNameLabelKey] != "web" || svc.Annotations["note"] != "hi" {
		t.Errorf("labels %v, annotations %v", svc.Labels, svc.Annotations)
	}
	if len(svc.OwnerReferences) != 1 || svc.OwnerReferences[0].UID != "u1" || !*svc.OwnerReferences[0].Controller {
		t.Errorf("owner %+v", svc.OwnerReferences)
	}
	long := ServiceName(strings.Repeat("g", 60))
	if len(long) > 63 || !strings.HasSuffix(long, "-orch-gateway") || long == ServiceName(strings.Repeat("g", 61)) {
		t.Errorf("a long Gateway's Service name %q", long)
	}
}
