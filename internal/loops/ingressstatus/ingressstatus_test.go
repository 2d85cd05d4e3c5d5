package ingressstatus

import (
	"context"
	"slices"
	"testing"

	"github.com/orch-dev/orch/internal/loops/controller"
	"github.com/orch-dev/orch/internal/loops/controllertest"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
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

func ingress(name string, class *string, annotations map[string]string) *networkingv1.Ingress {
	return &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Annotations: annotations},
		Spec: networkingv1.IngressSpec{IngressClassName: class, DefaultBackend: &networkingv1.IngressBackend{
			Service: &networkingv1.IngressServiceBackend{Name: "web", Port: networkingv1.ServiceBackendPort{Number: 80}}}}}
}

// TestStatus: an Ingress of a class whose controller is orch's (by
// spec.ingressClassName or the older annotation) gets the addresses of
// the Ready, schedulable nodes, ExternalIP before InternalIP, sorted, as
// a LoadBalancer Service does from ServiceLB; an Ingress of another
// class, or of none, is left to its controller; nothing changed, nothing
// is written.
func TestStatus(t *testing.T) {
	cordoned := node("n4", true, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "192.0.2.14"})
	cordoned.Spec.Unschedulable = true
	objs := []runtime.Object{
		&networkingv1.IngressClass{ObjectMeta: metav1.ObjectMeta{Name: "orch"}, Spec: networkingv1.IngressClassSpec{Controller: "orch.io/ingress"}},
		&networkingv1.IngressClass{ObjectMeta: metav1.ObjectMeta{Name: "nginx"}, Spec: networkingv1.IngressClassSpec{Controller: "k8s.io/ingress-nginx"}},
		node("n1", true, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "192.0.2.11"}),
		node("n2", true, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "192.0.2.12"}, corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "203.0.113.12"}),
		node("n3", false, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "192.0.2.13"}), cordoned,
		ingress("web", ptr.To("orch"), nil),
		ingress("annotated", nil, map[string]string{"kubernetes.io/ingress.class": "orch"}),
		ingress("nginx", ptr.To("nginx"), nil),
		ingress("none", nil, nil),
	}
	f := controllertest.New(t, objs...)
	c, err := New(f.Client, f.Informers, controller.Env{}.WithDefaults())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.queue.ShutDown)
	f.Start()
	names := []string{"web", "annotated", "nginx", "none"}
	for _, name := range names {
		if err := c.sync(context.Background(), "default/"+name); err != nil {
			t.Fatal(err)
		}
	}
	gvr := networkingv1.SchemeGroupVersion.WithResource("ingresses")
	for name, want := range map[string][]string{
		"web":       {"192.0.2.11", "203.0.113.12"},
		"annotated": {"192.0.2.11", "203.0.113.12"},
		"nginx":     nil,
		"none":      nil,
	} {
		var got []string
		for _, lb := range f.Get(gvr, "default", name).(*networkingv1.Ingress).Status.LoadBalancer.Ingress {
			got = append(got, lb.IP)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: addresses %v, want %v", name, got, want)
		}
	}
	if writes := controllertest.Only(f.Writes(), "update", "ingresses.networking.k8s.io"); len(writes) != 2 {
		t.Errorf("%d status writes, want 2: %v", len(writes), writes)
	}
	for _, name := range names {
		if err := c.sync(context.Background(), "default/"+name); err != nil {
			t.Fatal(err)
		}
	}
	if again := controllertest.Only(f.Writes(), "update", "ingresses.networking.k8s.io"); len(again) != 0 {
		t.Errorf("unchanged Ingresses written again: %v", again)
	}
}
