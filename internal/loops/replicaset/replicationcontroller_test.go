package replicaset_test

import (
	"context"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/loops/hollow"
	"github.com/orch-dev/orch/internal/loops/loopstest"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestReplicationController: a ReplicationController is kept as a
// ReplicaSet is (its selector and labels defaulted from its template, as
// Kubernetes defaults them): its pods run, its status counts them, the
// scale subresource resizes it, an orphan it selects is adopted, and
// deleting it deletes its pods.
func TestReplicationController(t *testing.T) {
	c := loopstest.Start(t, map[string]hollow.NodeOptions{"n1": {}}, hollow.Options{LeaseEvery: -1})
	rcs := c.Client.CoreV1().ReplicationControllers("default")
	rc := &corev1.ReplicationController{ObjectMeta: metav1.ObjectMeta{Name: "old"}, Spec: corev1.ReplicationControllerSpec{
		Replicas: ptr.To[int32](3),
		Template: &corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "old"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}},
	}}
	created, err := rcs.Create(c.Ctx, rc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if created.Spec.Selector["app"] != "old" || created.Labels["app"] != "old" {
		t.Fatalf("defaults: selector %v labels %v", created.Spec.Selector, created.Labels)
	}
	wait := func(want int32) {
		t.Helper()
		c.Eventually("the controller at its replicas", 30*time.Second, func(ctx context.Context) (bool, error) {
			owned, ready, err := pods(ctx, c, "old")
			if err != nil {
				return false, err
			}
			got, err := rcs.Get(ctx, "old", metav1.GetOptions{})
			return err == nil && len(owned) == int(want) && ready == int(want) && got.Status.Replicas == want && got.Status.ReadyReplicas == want &&
				got.Status.ObservedGeneration == got.Generation, err
		})
	}
	wait(3)
	owned, _, _ := pods(c.Ctx, c, "old")
	if ref := metav1.GetControllerOf(&owned[0]); ref.Kind != "ReplicationController" || ref.APIVersion != "v1" || ref.UID != created.UID {
		t.Fatalf("pod owner %+v", ref)
	}
	scale, err := rcs.GetScale(c.Ctx, "old", metav1.GetOptions{})
	if err != nil || scale.Spec.Replicas != 3 || scale.Status.Selector != "app=old" {
		t.Fatalf("scale: %+v %v", scale, err)
	}
	if _, err := rcs.UpdateScale(c.Ctx, "old", &autoscalingv1.Scale{ObjectMeta: metav1.ObjectMeta{Name: "old", ResourceVersion: scale.ResourceVersion},
		Spec: autoscalingv1.ScaleSpec{Replicas: 1}}, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait(1)
	orphan := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "orphan", Labels: map[string]string{"app": "old"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	if _, err := c.Client.CoreV1().Pods("default").Create(c.Ctx, orphan, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("the orphan adopted, one pod deleted for it", 30*time.Second, func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods("default").Get(ctx, "orphan", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil // adopted, then chosen as the surplus pod
		}
		owned, _, _ := pods(ctx, c, "old")
		return err == nil && metav1.GetControllerOf(p) != nil && len(owned) == 1, err
	})
	background := metav1.DeletePropagationBackground
	if err := rcs.Delete(c.Ctx, "old", metav1.DeleteOptions{PropagationPolicy: &background}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("its pods deleted with it", 30*time.Second, func(ctx context.Context) (bool, error) {
		list, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=old"})
		return err == nil && len(list.Items) == 0, err
	})
}
