package replicaset

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/loops/controller"
	"github.com/orch-dev/orch/internal/loops/controllertest"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
)

func replicaSet(replicas int32) *appsv1.ReplicaSet {
	labels := map[string]string{"app": "web"}
	return &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "rs-uid"},
		Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To(replicas), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}},
	}
}

func ownedPod(name string, rs *appsv1.ReplicaSet) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: rs.Spec.Template.Labels,
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(rs, appsv1.SchemeGroupVersion.WithKind("ReplicaSet"))}},
		Spec: rs.Spec.Template.Spec, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
}

func start(t *testing.T, objs ...runtime.Object) (*Controller, *controllertest.Fake) {
	t.Helper()
	f := controllertest.New(t, objs...)
	c, err := New(f.Client, f.Informers, f.Events, controller.Env{}.WithDefaults())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.queue.ShutDown) // the queue's delaying goroutine, which Run would end
	f.Start()
	return c, f
}

// TestSyncScalesUp: three wanted, one there: two pods made from the
// template, owned by the ReplicaSet; a second sync, once they are seen,
// makes no more.
func TestSyncScalesUp(t *testing.T) {
	rs := replicaSet(3)
	c, f := start(t, rs, ownedPod("web-a", rs))
	ctx := context.Background()
	if err := c.sync(ctx, "default/web"); err != nil {
		t.Fatal(err)
	}
	creates := controllertest.Only(f.Writes(), "create", "pods")
	if len(creates) != 2 {
		t.Fatalf("%d pods created, want 2: %v", len(creates), creates)
	}
	if got := f.Events.List(); !slices.Contains(got, "Normal SuccessfulCreate Created 2 pod(s)") {
		t.Errorf("events: %q", got)
	}
	for _, w := range creates {
		p := w.Object.(*corev1.Pod)
		if ref := metav1.GetControllerOf(p); ref == nil || ref.UID != rs.UID || p.Labels["app"] != "web" || p.Spec.Containers[0].Image != "busybox" {
			t.Errorf("pod made: owner %+v labels %v", ref, p.Labels)
		}
	}
	// The informers see the two creates and the status written; then
	// nothing more is needed. (Before the status is seen, a sync's status
	// write conflicts, as on the API server, and the loop retries it.)
	stored := f.Get(schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "replicasets"}, "default", "web").(*appsv1.ReplicaSet)
	deadline := time.Now().Add(5 * time.Second)
	for {
		pods, _ := c.pods.Pods("default").List(labels.Everything())
		seen, _ := c.kind.get("default", "web")
		if len(pods) == 3 && seen != nil && seen.ResourceVersion == stored.ResourceVersion || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := c.sync(ctx, "default/web"); err != nil {
		t.Fatal(err)
	}
	if creates := controllertest.Only(f.Writes(), "create", "pods"); len(creates) != 0 {
		t.Fatalf("a second sync created %d more pods", len(creates))
	}
}

// TestSyncScalesDown: one wanted, three there: two deleted.
func TestSyncScalesDown(t *testing.T) {
	rs := replicaSet(1)
	c, f := start(t, rs, ownedPod("web-a", rs), ownedPod("web-b", rs), ownedPod("web-c", rs))
	if err := c.sync(context.Background(), "default/web"); err != nil {
		t.Fatal(err)
	}
	if deletes := controllertest.Only(f.Writes(), "delete", "pods"); len(deletes) != 2 {
		t.Fatalf("%d pods deleted, want 2: %v", len(deletes), deletes)
	}
}
