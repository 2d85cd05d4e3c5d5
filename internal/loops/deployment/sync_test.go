package deployment

import (
	"context"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/loops/controller"
	"github.com/orch-dev/orch/internal/loops/controllertest"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// TestSyncMakesTheReplicaSet: a new Deployment gets one ReplicaSet of its
// template, named and labelled with the template's hash as Kubernetes
// does, owned by it, with all the replicas (nothing old to surge over).
func TestSyncMakesTheReplicaSet(t *testing.T) {
	labels := map[string]string{"app": "web"}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "d-uid", Generation: 1},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](3), Selector: &metav1.LabelSelector{MatchLabels: labels},
			RevisionHistoryLimit: ptr.To[int32](10), ProgressDeadlineSeconds: ptr.To[int32](600),
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{
				MaxSurge: ptr.To(intstr.FromString("25%")), MaxUnavailable: ptr.To(intstr.FromString("25%"))}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox:1"}}}}},
	}
	f := controllertest.New(t, d)
	c, err := New(f.Client, f.Informers, f.Events, controller.Env{}.WithDefaults())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.queue.ShutDown) // the queue's delaying goroutine, which Run would end
	f.Start()
	if err := c.sync(context.Background(), "default/web"); err != nil {
		t.Fatal(err)
	}
	writes := f.Writes()
	creates := controllertest.Only(writes, "create", "replicasets.apps")
	if len(creates) != 1 {
		t.Fatalf("%d ReplicaSets created, want 1: %v", len(creates), writes)
	}
	rs := creates[0].Object.(*appsv1.ReplicaSet)
	hash := rs.Labels[appsv1.DefaultDeploymentUniqueLabelKey]
	if hash == "" || rs.Name != "web-"+hash || rs.Spec.Template.Labels[appsv1.DefaultDeploymentUniqueLabelKey] != hash ||
		rs.Spec.Selector.MatchLabels[appsv1.DefaultDeploymentUniqueLabelKey] != hash {
		t.Errorf("the ReplicaSet's name and pod-template-hash: %s %v", rs.Name, rs.Labels)
	}
	if ref := metav1.GetControllerOf(rs); ref == nil || ref.UID != d.UID || ptr.Deref(rs.Spec.Replicas, 0) != 3 {
		t.Errorf("owner %+v, replicas %v", ref, rs.Spec.Replicas)
	}
	if rs.Annotations["deployment.kubernetes.io/revision"] != "1" {
		t.Errorf("revision annotation: %v", rs.Annotations)
	}
}

// TestSyncScalesProportionally: a Deployment scaled mid-rollout scales
// its ReplicaSets in proportion, as Kubernetes' conformance spec
// "deployment should support proportional scaling" checks: 10 replicas,
// maxSurge 3, maxUnavailable 2, the old ReplicaSet at 8 and the stuck new
// one at 5; scaled to 30, the old goes to 20 and the new to 13.
func TestSyncScalesProportionally(t *testing.T) {
	labels := map[string]string{"app": "web"}
	template := func(image string) corev1.PodTemplateSpec {
		return corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: image}}}}
	}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "d-uid", Generation: 3},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](30), Selector: &metav1.LabelSelector{MatchLabels: labels},
			RevisionHistoryLimit: ptr.To[int32](10), ProgressDeadlineSeconds: ptr.To[int32](600),
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{
				MaxSurge: ptr.To(intstr.FromInt32(3)), MaxUnavailable: ptr.To(intstr.FromInt32(2))}},
			Template: template("webserver:404")},
		Status: appsv1.DeploymentStatus{Replicas: 13},
	}
	set := func(name, revision, image string, replicas, available int32, age int) *appsv1.ReplicaSet {
		return &appsv1.ReplicaSet{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name), Labels: labels,
				CreationTimestamp: metav1.NewTime(time.Unix(1_000_000+int64(age), 0)),
				OwnerReferences:   []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: "web", UID: "d-uid", Controller: ptr.To(true)}},
				Annotations: map[string]string{"deployment.kubernetes.io/revision": revision,
					"deployment.kubernetes.io/desired-replicas": "10", "deployment.kubernetes.io/max-replicas": "13"}},
			Spec:   appsv1.ReplicaSetSpec{Replicas: ptr.To(replicas), Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: template(image)},
			Status: appsv1.ReplicaSetStatus{Replicas: replicas, AvailableReplicas: available},
		}
	}
	f := controllertest.New(t, d, set("web-old", "1", "agnhost:1", 8, 8, 0), set("web-new", "2", "webserver:404", 5, 0, 60))
	c, err := New(f.Client, f.Informers, f.Events, controller.Env{}.WithDefaults())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.queue.ShutDown)
	f.Start()
	if err := c.sync(context.Background(), "default/web"); err != nil {
		t.Fatal(err)
	}
	got := map[string]int32{}
	for _, w := range controllertest.Only(f.Writes(), "update", "replicasets.apps") {
		rs := w.Object.(*appsv1.ReplicaSet)
		got[rs.Name] = ptr.Deref(rs.Spec.Replicas, 0)
		if rs.Annotations["deployment.kubernetes.io/desired-replicas"] != "30" || rs.Annotations["deployment.kubernetes.io/max-replicas"] != "33" {
			t.Errorf("%s annotations %v", rs.Name, rs.Annotations)
		}
	}
	if got["web-old"] != 20 || got["web-new"] != 13 {
		t.Errorf("scaled to %v, want web-old 20 and web-new 13", got)
	}
}
