package servicelb

import (
	"context"
	"slices"
	"testing"

	"github.com/orch-dev/orch/internal/loops/controller"
	"github.com/orch-dev/orch/internal/loops/controllertest"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
)

func node(name string, ready bool, addrs ...corev1.NodeAddress) *corev1.Node {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{Addresses: addrs, Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status}}}}
}

func internal(ip string) corev1.NodeAddress {
	return corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip}
}
func external(ip string) corev1.NodeAddress {
	return corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: ip}
}

func lbService(name string, mutate ...func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "10.43.0.20", Ports: []corev1.ServicePort{{Port: 80, NodePort: 30080}}}}
	for _, m := range mutate {
		m(s)
	}
	return s
}

var servicesGVR = schema.GroupVersionResource{Version: "v1", Resource: "services"}

// TestIngress: as k3s's ServiceLB, a LoadBalancer Service gets the
// addresses of the Ready, schedulable nodes (ExternalIP before
// InternalIP), sorted; with externalTrafficPolicy Local only those with
// one of its ready endpoints; one with a loadBalancerClass, or not of
// type LoadBalancer, is left alone.
func TestIngress(t *testing.T) {
	cordoned := node("n4", true, internal("192.0.2.14"))
	cordoned.Spec.Unschedulable = true
	local := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "local-1", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: "local"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.42.1.5"}, NodeName: ptr.To("n2"), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
			{Addresses: []string{"10.42.0.5"}, NodeName: ptr.To("n1"), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}}}}
	objs := []runtime.Object{
		node("n1", true, internal("192.0.2.11")), node("n2", true, internal("192.0.2.12"), external("203.0.113.12")),
		node("n3", false, internal("192.0.2.13")), cordoned,
		lbService("web"),
		lbService("local", func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal }), local,
		lbService("metallb", func(s *corev1.Service) { s.Spec.LoadBalancerClass = ptr.To("metallb.io/metallb") }),
		lbService("plain", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeClusterIP }),
	}
	f := controllertest.New(t, objs...)
	c, err := New(f.Client, f.Informers, controller.Env{}.WithDefaults())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.queue.ShutDown)
	f.Start()
	for _, name := range []string{"web", "local", "metallb", "plain"} {
		if err := c.sync(context.Background(), "default/"+name); err != nil {
			t.Fatal(err)
		}
	}
	ingress := func(name string) []string {
		var ips []string
		for _, in := range f.Get(servicesGVR, "default", name).(*corev1.Service).Status.LoadBalancer.Ingress {
			ips = append(ips, in.IP)
		}
		return ips
	}
	for name, want := range map[string][]string{
		"web":     {"192.0.2.11", "203.0.113.12"},
		"local":   {"203.0.113.12"},
		"metallb": nil,
		"plain":   nil,
	} {
		if got := ingress(name); !slices.Equal(got, want) {
			t.Errorf("%s: ingress %v, want %v", name, ingress(name), want)
		}
	}
	writes := controllertest.Only(f.Writes(), "update", "services")
	if len(writes) != 2 {
		t.Errorf("%d status writes, want 2 (web and local): %v", len(writes), writes)
	}
	// Nothing changed: a second sync writes nothing.
	if err := c.sync(context.Background(), "default/web"); err != nil {
		t.Fatal(err)
	}
	if again := controllertest.Only(f.Writes(), "update", "services"); len(again) != 0 {
		t.Errorf("an unchanged Service written again: %v", again)
	}
}
