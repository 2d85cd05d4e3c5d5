package deployment

import (
	"context"
	"testing"

	"github.com/orch-dev/orch/internal/loops/controller"
	"github.com/orch-dev/orch/internal/loops/controllertest"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
