package endpoints_test

import (
	"context"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/loops/hollow"
	"github.com/orch-dev/orch/internal/loops/loopstest"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

func TestServiceEndpointsFollowReadyPods(t *testing.T) {
	c := loopstest.Start(t, map[string]hollow.NodeOptions{"n1": {}, "n2": {}}, hollow.Options{LeaseEvery: -1})
	labels := map[string]string{"app": "web"}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](3), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name: "c", Image: "busybox", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}}}},
	}
	if _, err := c.Client.AppsV1().Deployments("default").Create(c.Ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: corev1.ServiceSpec{Selector: labels,
		Ports: []corev1.ServicePort{{Name: "web", Port: 80, TargetPort: intstr.FromString("http")}}}}
	if _, err := c.Client.CoreV1().Services("default").Create(c.Ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	state := func(ctx context.Context) (ready int, port int32, sliceReady int, err error) {
		ep, err := c.Client.CoreV1().Endpoints("default").Get(ctx, "web", metav1.GetOptions{}) //nolint:staticcheck // what older tools read
		if err != nil {
			return 0, 0, 0, err
		}
		for _, s := range ep.Subsets {
			ready += len(s.Addresses)
			port = s.Ports[0].Port
		}
		slices, err := c.Client.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=web"})
		if err != nil {
			return 0, 0, 0, err
		}
		if len(slices.Items) != 1 {
			return ready, port, -1, nil
		}
		for _, e := range slices.Items[0].Endpoints {
			if ptr.Deref(e.Conditions.Ready, false) {
				sliceReady++
			}
		}
		return ready, port, sliceReady, nil
	}
	c.Eventually("3 ready endpoints on the named port", 30*time.Second, func(ctx context.Context) (bool, error) {
		ready, port, sliceReady, err := state(ctx)
		return err == nil && ready == 3 && port == 8080 && sliceReady == 3, nil
	})
	scale, _ := c.Client.AppsV1().Deployments("default").GetScale(c.Ctx, "web", metav1.GetOptions{})
	scale.Spec.Replicas = 1
	scale.ResourceVersion = "" // unconditional, as kubectl scale: the controller writes the deployment too
	if _, err := c.Client.AppsV1().Deployments("default").UpdateScale(c.Ctx, "web", scale, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("1 endpoint after scaling down", 30*time.Second, func(ctx context.Context) (bool, error) {
		ready, _, sliceReady, err := state(ctx)
		return err == nil && ready == 1 && sliceReady == 1, nil
	})
	// The kubernetes service has no selector: its endpoints are the server's.
	if ep, err := c.Client.CoreV1().Endpoints("default").Get(c.Ctx, "kubernetes", metav1.GetOptions{}); err != nil || len(ep.Subsets) != 1 { //nolint:staticcheck // as above
		t.Errorf("kubernetes endpoints: %+v %v", ep, err)
	}
	if err := c.Client.CoreV1().Services("default").Delete(c.Ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("endpoints and slices gone with the service", 30*time.Second, func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().Endpoints("default").Get(ctx, "web", metav1.GetOptions{}) //nolint:staticcheck // as above
		slices, lerr := c.Client.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=web"})
		return apierrors.IsNotFound(err) && lerr == nil && len(slices.Items) == 0, nil
	})
}

// TestLoopbackPodsLeftOut: a pod at an address no endpoint may have (a
// hostNetwork pod on a node at 127.0.0.1) is left out of the slice, which
// the API would otherwise refuse whole, the other pods' endpoints with it.
func TestLoopbackPodsLeftOut(t *testing.T) {
	c := loopstest.Start(t, map[string]hollow.NodeOptions{}, hollow.Options{LeaseEvery: -1})
	labels := map[string]string{"app": "mixed"}
	for name, ip := range map[string]string{"on-loopback": "127.0.0.1", "in-pod-network": "10.42.0.9"} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: corev1.PodSpec{NodeName: "n1",
			Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
		created, err := c.Client.CoreV1().Pods("default").Create(c.Ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		created.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
		if _, err := c.Client.CoreV1().Pods("default").UpdateStatus(c.Ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "mixed"}, Spec: corev1.ServiceSpec{Selector: labels,
		Ports: []corev1.ServicePort{{Port: 80}}}}
	if _, err := c.Client.CoreV1().Services("default").Create(c.Ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("a slice with the pod-network pod alone", 30*time.Second, func(ctx context.Context) (bool, error) {
		slices, err := c.Client.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=mixed"})
		if err != nil || len(slices.Items) != 1 {
			return false, err
		}
		eps := slices.Items[0].Endpoints
		return len(eps) == 1 && eps[0].Addresses[0] == "10.42.0.9", nil
	})
}

// TestHostnames: a pod whose spec.subdomain is the Service's name has its
// spec.hostname on its endpoint, which the cluster DNS answers as
// <hostname>.<service>.<namespace>.svc, as Kubernetes does; other pods'
// endpoints have none.
func TestHostnames(t *testing.T) {
	c := loopstest.Start(t, map[string]hollow.NodeOptions{}, hollow.Options{LeaseEvery: -1})
	labels := map[string]string{"app": "db"}
	for name, spec := range map[string][2]string{"db-a": {"db-0", "db"}, "db-b": {"db-1", "elsewhere"}} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: corev1.PodSpec{NodeName: "n1", Hostname: spec[0], Subdomain: spec[1],
			Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
		created, err := c.Client.CoreV1().Pods("default").Create(c.Ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ip := map[string]string{"db-a": "10.42.0.21", "db-b": "10.42.0.22"}[name]
		created.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
		if _, err := c.Client.CoreV1().Pods("default").UpdateStatus(c.Ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "db"}, Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Selector: labels,
		Ports: []corev1.ServicePort{{Port: 5432}}}}
	if _, err := c.Client.CoreV1().Services("default").Create(c.Ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("db-0's hostname on its endpoint, none on the other", 30*time.Second, func(ctx context.Context) (bool, error) {
		slices, err := c.Client.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=db"})
		if err != nil || len(slices.Items) != 1 || len(slices.Items[0].Endpoints) != 2 {
			return false, err
		}
		got := map[string]string{}
		for _, e := range slices.Items[0].Endpoints {
			got[e.Addresses[0]] = ptr.Deref(e.Hostname, "")
		}
		return got["10.42.0.21"] == "db-0" && got["10.42.0.22"] == "", nil
	})
}

// TestEndpointsMirrored: the Endpoints a user keeps for a Service without a
// selector are mirrored into EndpointSlices (the proxies read slices), as
// Kubernetes' EndpointSliceMirroring controller does: ready and not-ready
// addresses, ports, labels, the Endpoints as owner; changes follow; the
// slices go when the Service gains a selector.
func TestEndpointsMirrored(t *testing.T) {
	c := loopstest.Start(t, map[string]hollow.NodeOptions{"n1": {}}, hollow.Options{LeaseEvery: -1})
	core := c.Client.CoreV1()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "db"}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 5432}}}}
	if _, err := core.Services("default").Create(c.Ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eps := &corev1.Endpoints{ObjectMeta: metav1.ObjectMeta{Name: "db", Labels: map[string]string{"team": "data"}},
		Subsets: []corev1.EndpointSubset{{Addresses: []corev1.EndpointAddress{{IP: "192.0.2.10"}}, NotReadyAddresses: []corev1.EndpointAddress{{IP: "192.0.2.11"}},
			Ports: []corev1.EndpointPort{{Name: "pg", Port: 5432, Protocol: corev1.ProtocolTCP}}}}}
	created, err := core.Endpoints("default").Create(c.Ctx, eps, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	slicesOf := func(ctx context.Context) []discoveryv1.EndpointSlice {
		list, err := c.Client.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{
			LabelSelector: "kubernetes.io/service-name=db,endpointslice.kubernetes.io/managed-by=endpointslicemirroring-controller.k8s.io"})
		if err != nil {
			return nil
		}
		return list.Items
	}
	c.Eventually("the Endpoints mirrored", 30*time.Second, func(ctx context.Context) (bool, error) {
		s := slicesOf(ctx)
		if len(s) != 1 || len(s[0].Endpoints) != 2 || len(s[0].Ports) != 1 || *s[0].Ports[0].Port != 5432 || s[0].Labels["team"] != "data" {
			return false, nil
		}
		owner := metav1.GetControllerOf(&s[0])
		return owner != nil && owner.UID == created.UID && s[0].Endpoints[0].Addresses[0] == "192.0.2.10" && *s[0].Endpoints[0].Conditions.Ready &&
			!*s[0].Endpoints[1].Conditions.Ready, nil
	})
	name := slicesOf(c.Ctx)[0].Name
	created.Subsets[0].Addresses = []corev1.EndpointAddress{{IP: "192.0.2.20"}}
	if _, err := core.Endpoints("default").Update(c.Ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("the change mirrored into the same slice", 30*time.Second, func(ctx context.Context) (bool, error) {
		s := slicesOf(ctx)
		return len(s) == 1 && s[0].Name == name && s[0].Endpoints[0].Addresses[0] == "192.0.2.20", nil
	})
	got, err := core.Services("default").Get(c.Ctx, "db", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got.Spec.Selector = map[string]string{"app": "db"}
	if _, err := core.Services("default").Update(c.Ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("no mirror once the Service selects its pods", 30*time.Second, func(ctx context.Context) (bool, error) {
		return len(slicesOf(ctx)) == 0, nil
	})
}

// TestDeletedSlicesMadeAgain: a Service's EndpointSlices or Endpoints
// deleted by someone else are made again, as Kubernetes' controllers do
// (conformance: "should create Endpoints and EndpointSlices for Pods
// matching a Service" deletes them and waits).
func TestDeletedSlicesMadeAgain(t *testing.T) {
	c := loopstest.Start(t, map[string]hollow.NodeOptions{"n1": {}}, hollow.Options{LeaseEvery: -1})
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "none"}, Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "none"},
		Ports: []corev1.ServicePort{{Port: 80}}}}
	if _, err := c.Client.CoreV1().Services("default").Create(c.Ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	slice := func(ctx context.Context) (string, error) {
		list, err := c.Client.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=none"})
		if err != nil || len(list.Items) != 1 {
			return "", err
		}
		return list.Items[0].Name, nil
	}
	var first string
	c.Eventually("the Service's slice", 30*time.Second, func(ctx context.Context) (bool, error) {
		name, err := slice(ctx)
		first = name
		return name != "", err
	})
	if err := c.Client.DiscoveryV1().EndpointSlices("default").Delete(c.Ctx, first, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("a slice made again", 30*time.Second, func(ctx context.Context) (bool, error) {
		name, err := slice(ctx)
		return name != "" && name != first, err
	})
	c.Eventually("the Endpoints", 30*time.Second, func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().Endpoints("default").Get(ctx, "none", metav1.GetOptions{}) //nolint:staticcheck // what older tools read
		return err == nil, nil
	})
	if err := c.Client.CoreV1().Endpoints("default").Delete(c.Ctx, "none", metav1.DeleteOptions{}); err != nil { //nolint:staticcheck // as above
		t.Fatal(err)
	}
	c.Eventually("the Endpoints made again", 30*time.Second, func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().Endpoints("default").Get(ctx, "none", metav1.GetOptions{}) //nolint:staticcheck // as above
		return err == nil, nil
	})
}
