package controller

import (
	"context"
	"testing"

	"github.com/orch-dev/orch/internal/api/apitest"
	"github.com/orch-dev/orch/internal/kube"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
)

// startAPI is an API server and the loops' client of it, with no loops.
func startAPI(t *testing.T) (*apitest.Server, *kube.Client) {
	t.Helper()
	srv := apitest.Start(t)
	client, err := kube.NewForConfig(srv.Admin)
	if err != nil {
		t.Fatal(err)
	}
	return srv, client
}

// podTemplate is a minimal template labelled app=name.
func podTemplate(name string) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
}

// TestClaimPodsRechecksTheOwner: an owner the caller's informer still has
// as live, but whose deletion the API has begun (orphaning its pods),
// adopts no orphan, as Kubernetes' RecheckDeletionTimestamp keeps it
// from: the adopted pod would be deleted with it. Neither does an owner
// replaced under the same name. A live owner adopts.
func TestClaimPodsRechecksTheOwner(t *testing.T) {
	srv, client := startAPI(t)
	ctx := context.Background()
	gvk := appsv1.SchemeGroupVersion.WithKind("ReplicaSet")
	set := func(name string) *appsv1.ReplicaSet {
		rs, err := srv.Client.AppsV1().ReplicaSets("default").Create(ctx, &appsv1.ReplicaSet{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To[int32](0), Selector: &metav1.LabelSelector{MatchLabels: podTemplate(name).Labels},
				Template: podTemplate(name)},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}
	orphan := func(name, app string) *corev1.Pod {
		p, err := srv.Client.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": app}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	claim := func(owner *appsv1.ReplicaSet, p *corev1.Pod) (owned int, controller *metav1.OwnerReference) {
		t.Helper()
		got, _, err := ClaimPods(ctx, client, owner, gvk, labels.SelectorFromSet(owner.Spec.Selector.MatchLabels), []*corev1.Pod{p})
		if err != nil {
			t.Fatal(err)
		}
		now, err := srv.Client.CoreV1().Pods("default").Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return len(got), metav1.GetControllerOf(now)
	}

	// Deleted with its pods orphaned: with no collector here its orphan
	// finalizer keeps it, being deleted, as the collector's work begins.
	going := set("going")
	if err := srv.Client.AppsV1().ReplicaSets("default").Delete(ctx, "going", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationOrphan)}); err != nil {
		t.Fatal(err)
	}
	if n, ref := claim(going, orphan("p-going", "going")); n != 0 || ref != nil {
		t.Errorf("a set being deleted, as its informer had it before: adopted %d, the pod's controller %v", n, ref)
	}

	replaced := set("replaced")
	if err := srv.Client.AppsV1().ReplicaSets("default").Delete(ctx, "replaced", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	set("replaced")
	if n, ref := claim(replaced, orphan("p-replaced", "replaced")); n != 0 || ref != nil {
		t.Errorf("a set replaced under its name: adopted %d, the pod's controller %v", n, ref)
	}

	live := set("live")
	if n, ref := claim(live, orphan("p-live", "live")); n != 1 || ref == nil || ref.UID != live.UID {
		t.Errorf("a live set: adopted %d, the pod's controller %v", n, ref)
	}
}

// TestMayAdoptDeployments: the Deployment controller's adoption of
// ReplicaSets asks the same question of a Deployment.
func TestMayAdoptDeployments(t *testing.T) {
	srv, client := startAPI(t)
	ctx := context.Background()
	gvk := appsv1.SchemeGroupVersion.WithKind("Deployment")
	deployment := func(name string) *appsv1.Deployment {
		d, err := srv.Client.AppsV1().Deployments("default").Create(ctx, &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: podTemplate(name).Labels},
				Template: podTemplate(name)},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	live, going := deployment("live"), deployment("going")
	if err := srv.Client.AppsV1().Deployments("default").Delete(ctx, "going", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationOrphan)}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		d    *appsv1.Deployment
		want bool
	}{{live, true}, {going, false}} {
		if ok, err := MayAdopt(ctx, client, c.d, gvk)(); ok != c.want || err != nil {
			t.Errorf("%s may adopt: %t, %v; want %t", c.d.Name, ok, err, c.want)
		}
	}
}
