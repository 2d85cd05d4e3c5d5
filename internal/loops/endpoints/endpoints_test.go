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
