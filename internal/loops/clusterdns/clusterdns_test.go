package clusterdns

import (
	"context"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/loops/controller"
	"github.com/orch-dev/orch/internal/loops/controllertest"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

func node(name, ip string, ready bool) *corev1.Node {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{
		Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}},
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status}}}}
}

func kubeDNS() *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Namespace: "kube-system"}, Spec: corev1.ServiceSpec{ClusterIP: "10.43.0.10",
		Ports: []corev1.ServicePort{{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(10053)},
			{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(10053)}}}}
}

var slicesGVR = schema.GroupVersionResource{Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices"}

func start(t *testing.T, objs ...runtime.Object) (*controllertest.Fake, *Controller) {
	f := controllertest.New(t, objs...)
	c, err := New(f.Client, f.Informers, controller.Env{}.WithDefaults())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.queue.ShutDown)
	f.Start()
	if err := c.sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	return f, c
}

// TestNodesAreTheEndpoints: kube-dns's endpoints are the nodes'
// InternalIPs on its target ports, ready as the nodes are; a node at a
// loopback address has none; a second sync writes nothing.
func TestNodesAreTheEndpoints(t *testing.T) {
	f, c := start(t, kubeDNS(), node("b", "192.0.2.12", false), node("a", "192.0.2.11", true), node("solo", "127.0.0.1", true))
	s, ok := f.Get(slicesGVR, "kube-system", "kube-dns-nodes").(*discoveryv1.EndpointSlice)
	if !ok {
		t.Fatal("no kube-dns slice")
	}
	if len(s.Endpoints) != 2 || s.Endpoints[0].Addresses[0] != "192.0.2.11" || *s.Endpoints[0].NodeName != "a" || !*s.Endpoints[0].Conditions.Ready ||
		*s.Endpoints[1].Conditions.Ready || s.Labels[discoveryv1.LabelServiceName] != "kube-dns" {
		t.Errorf("kube-dns's slice: %+v", s)
	}
	if len(s.Ports) != 2 || *s.Ports[0].Port != 10053 || *s.Ports[0].Protocol != corev1.ProtocolUDP || *s.Ports[1].Name != "dns-tcp" {
		t.Errorf("kube-dns's slice's ports: %+v", s.Ports)
	}
	_ = f.Writes() // those so far
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := c.slices.EndpointSlices("kube-system").Get("kube-dns-nodes"); err == nil {
			break // the informer has it: the next sync compares with it
		} else if time.Now().After(deadline) {
			t.Fatal("the informer never saw the slice")
		}
	}
	if err := c.sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if again := f.Writes(); len(again) != 0 {
		t.Errorf("an unchanged slice was written again: %v", again)
	}
}

// TestUsersKubeDNS: a kube-dns with a selector (CoreDNS the user runs)
// gets no node endpoints from orch, and orch's slice goes.
func TestUsersKubeDNS(t *testing.T) {
	svc := kubeDNS()
	svc.Spec.Selector = map[string]string{"k8s-app": "kube-dns"}
	old := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "kube-dns-nodes", Namespace: "kube-system",
		Labels: map[string]string{discoveryv1.LabelServiceName: "kube-dns", discoveryv1.LabelManagedBy: managedBy}}, AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"192.0.2.11"}, NodeName: ptr.To("a")}}}
	f, _ := start(t, svc, old, node("a", "192.0.2.11", true))
	if s := f.Get(slicesGVR, "kube-system", "kube-dns-nodes"); s != nil {
		t.Errorf("orch's slice for the user's kube-dns is still there: %v", s)
	}
}
