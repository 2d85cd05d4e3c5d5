package api_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/orch-dev/orch/internal/api"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func service(name string, typ corev1.ServiceType, clusterIP string, nodePort int32) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{Type: typ, ClusterIP: clusterIP, Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{Port: 80, NodePort: nodePort}}},
	}
}

func TestServiceIPsAndNodePorts(t *testing.T) {
	dir := t.TempDir()
	ts := startServer(t, dir)
	ctx := context.Background()
	svcs := ts.client.CoreV1().Services("default")
	a, err := svcs.Create(ctx, service("a", "", "", 0), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Kubernetes' defaults: ClusterIP type, TCP, targetPort = port.
	if a.Spec.Type != corev1.ServiceTypeClusterIP || a.Spec.Ports[0].Protocol != corev1.ProtocolTCP || a.Spec.Ports[0].TargetPort.IntValue() != 80 {
		t.Errorf("defaults: %+v", a.Spec)
	}
	np, err := svcs.Create(ctx, service("np", corev1.ServiceTypeNodePort, "", 0), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	port := np.Spec.Ports[0].NodePort
	if port < 30000 || port > 32767 || np.Spec.ClusterIP == a.Spec.ClusterIP || np.Spec.ClusterIP == "10.43.0.1" {
		t.Fatalf("allocation: a %s, np %s port %d", a.Spec.ClusterIP, np.Spec.ClusterIP, port)
	}
	for name, svc := range map[string]*corev1.Service{
		"taken cluster IP":  service("dupip", "", a.Spec.ClusterIP, 0),
		"outside the CIDR":  service("outside", "", "10.99.0.1", 0),
		"taken node port":   service("dupport", corev1.ServiceTypeNodePort, "", port),
		"node port too low": service("low", corev1.ServiceTypeNodePort, "", 80),
	} {
		if _, err := svcs.Create(ctx, svc, metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
			t.Errorf("%s: want 422, got %v", name, err)
		}
	}
	// Nothing is handed out twice after a restart.
	addr := ts.srv.Addr().String()
	ts.stop()
	ts = restartOn(t, dir, addr)
	svcs = ts.client.CoreV1().Services("default")
	if _, err := svcs.Create(ctx, service("again", corev1.ServiceTypeNodePort, a.Spec.ClusterIP, port), metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
		t.Fatalf("reuse after restart: want 422, got %v", err)
	}
	fresh, err := svcs.Create(ctx, service("fresh", corev1.ServiceTypeNodePort, "", 0), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if fresh.Spec.ClusterIP == a.Spec.ClusterIP || fresh.Spec.ClusterIP == np.Spec.ClusterIP || fresh.Spec.Ports[0].NodePort == port {
		t.Fatalf("restart handed out a used value: %s %d", fresh.Spec.ClusterIP, fresh.Spec.Ports[0].NodePort)
	}
	// Deleting releases: the exact IP and port can be asked for again.
	if err := svcs.Delete(ctx, "np", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := svcs.Create(ctx, service("reuse", corev1.ServiceTypeNodePort, np.Spec.ClusterIP, port), metav1.CreateOptions{}); err != nil {
		t.Fatalf("reuse after delete: %v", err)
	}
}

// TestServiceUpdatesThatFailGiveBackTheirPorts: node ports taken for an
// update that never reaches the store (dry run, invalid) are free again.
func TestServiceUpdatesThatFailGiveBackTheirPorts(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	svcs := ts.client.CoreV1().Services("default")
	svc, err := svcs.Create(ctx, service("web", corev1.ServiceTypeNodePort, "", 0), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: "extra", Port: 81, NodePort: 30100})
	svc.Spec.Ports[0].Name = "http"
	if _, err := svcs.Update(ctx, svc, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Fatal(err)
	}
	// Kubernetes validates target port names as IANA service names.
	bad := svc.DeepCopy()
	bad.Spec.Ports[1].TargetPort = intstr.FromString("Not_A_Port_Name")
	if _, err := svcs.Update(ctx, bad, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) {
		t.Fatalf("invalid target port: %v", err)
	}
	for _, port := range []int32{30100} {
		if _, err := svcs.Create(ctx, service(fmt.Sprintf("p%d", port), corev1.ServiceTypeNodePort, "", port), metav1.CreateOptions{}); err != nil {
			t.Errorf("node port %d still held after a failed update: %v", port, err)
		}
	}
}

// TestStoredServiceOutsideTheRange: a server restarted with another
// service CIDR keeps serving its stored Services, and says which of their
// addresses it could not reserve (before, that was silently dropped).
func TestStoredServiceOutsideTheRange(t *testing.T) {
	ts := startServer(t, "")
	if _, err := ts.client.CoreV1().Services("default").Create(context.Background(), service("web", corev1.ServiceTypeClusterIP, "", 0), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ts.stop()
	var logs syncLog
	ts = startServerWith(t, ts.dir, 0, func(c *api.Config) {
		c.ServiceCIDR = "10.44.0.0/16"
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	if _, err := ts.client.CoreV1().Services("default").Get(context.Background(), "web", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), `msg="a stored Service's cluster IP cannot be reserved" service=default/web`) {
		t.Errorf("no warning about default/web's address:\n%s", logs.String())
	}
}

// syncLog is a log sink safe for the server's goroutines and the test.
type syncLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestServiceTypeChanges: changing only a Service's type drops what the old
// type needed and the new one does not, as Kubernetes does: its cluster IP
// on becoming an ExternalName (and the address is free again), its node
// ports on leaving NodePort; and an ExternalName made a ClusterIP gets an
// address.
func TestServiceTypeChanges(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	svcs := ts.client.CoreV1().Services("default")
	svc, err := svcs.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s"}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort,
		Ports: []corev1.ServicePort{{Port: 80, NodePort: 30080}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ip := svc.Spec.ClusterIP
	svc.Spec.Type, svc.Spec.ExternalName = corev1.ServiceTypeExternalName, "example.com"
	ext, err := svcs.Update(ctx, svc, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("NodePort to ExternalName: %v", err)
	}
	if ext.Spec.ClusterIP != "" || len(ext.Spec.ClusterIPs) != 0 || ext.Spec.Ports[0].NodePort != 0 {
		t.Fatalf("an ExternalName keeps clusterIP %q, node port %d", ext.Spec.ClusterIP, ext.Spec.Ports[0].NodePort)
	}
	// What it let go can be taken again.
	if _, err := svcs.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "t"}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort,
		ClusterIP: ip, Ports: []corev1.ServicePort{{Port: 80, NodePort: 30080}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the freed address and port: %v", err)
	}
	ext.Spec.Type, ext.Spec.ExternalName = corev1.ServiceTypeClusterIP, ""
	back, err := svcs.Update(ctx, ext, metav1.UpdateOptions{})
	if err != nil || back.Spec.ClusterIP == "" || back.Spec.ClusterIP == ip {
		t.Fatalf("ExternalName to ClusterIP: %q %v", back.Spec.ClusterIP, err)
	}
}
