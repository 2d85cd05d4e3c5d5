package gc_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/loops/hollow"
	"github.com/orch-dev/orch/internal/loops/loopstest"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

func deployment(name string) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](3), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}},
		},
	}
}

// counts returns how many ReplicaSets and pods carry app=name.
func counts(ctx context.Context, c *loopstest.Cluster, name string) (sets, pods int, err error) {
	rs, err := c.Client.AppsV1().ReplicaSets("default").List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
	if err != nil {
		return 0, 0, err
	}
	ps, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
	if err != nil {
		return 0, 0, err
	}
	return len(rs.Items), len(ps.Items), nil
}

func running(t *testing.T, c *loopstest.Cluster, name string) {
	t.Helper()
	if _, err := c.Client.AppsV1().Deployments("default").Create(c.Ctx, deployment(name), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually(name+" running", 30*time.Second, func(ctx context.Context) (bool, error) {
		sets, pods, err := counts(ctx, c, name)
		return sets == 1 && pods == 3, err
	})
}

func TestPropagation(t *testing.T) {
	c := loopstest.Start(t, map[string]hollow.NodeOptions{"n1": {}}, hollow.Options{LeaseEvery: -1})
	deps := c.Client.AppsV1().Deployments("default")

	// Background, what kubectl delete does: everything goes.
	running(t, c, "bg")
	if err := deps.Delete(c.Ctx, "bg", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("background deletion took the ReplicaSet and pods", 30*time.Second, func(ctx context.Context) (bool, error) {
		sets, pods, err := counts(ctx, c, "bg")
		return sets == 0 && pods == 0, err
	})

	// Foreground: the deployment stays until its dependents are gone.
	running(t, c, "fg")
	if err := deps.Delete(c.Ctx, "fg", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("foreground deletion finished", 30*time.Second, func(ctx context.Context) (bool, error) {
		sets, pods, err := counts(ctx, c, "fg")
		if err != nil {
			return false, err
		}
		_, err = deps.Get(ctx, "fg", metav1.GetOptions{})
		if err == nil && sets == 0 && pods == 0 {
			return false, nil // the owner must not outlive the wait by much, but may for a moment
		}
		if apierrors.IsNotFound(err) && (sets != 0 || pods != 0) {
			t.Fatalf("the owner went before its dependents: %d sets, %d pods left", sets, pods)
		}
		return apierrors.IsNotFound(err), nil
	})

	// Orphan: the deployment goes, the ReplicaSet stays, unowned.
	running(t, c, "orphan")
	sets, pods := c.RecordReplicaSets("default", "app=orphan"), c.RecordPods("default", "app=orphan")
	if err := deps.Delete(c.Ctx, "orphan", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationOrphan)}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("orphaned ReplicaSet unowned", 30*time.Second, func(ctx context.Context) (bool, error) {
		if _, err := deps.Get(ctx, "orphan", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return false, nil
		}
		rs, err := c.Client.AppsV1().ReplicaSets("default").List(ctx, metav1.ListOptions{LabelSelector: "app=orphan"})
		return err == nil && len(rs.Items) == 1 && len(rs.Items[0].OwnerReferences) == 0, err
	})
	// The collector is done with the deployment (it is gone): had it
	// deleted a dependent on the way, a record shows it.
	for _, state := range sets.Stop(t) {
		for _, rs := range state {
			if rs.DeletionTimestamp != nil {
				t.Fatalf("orphaned ReplicaSet %s was deleted", rs.Name)
			}
		}
	}
	podStates := pods.Stop(t)
	for _, state := range podStates {
		if len(state) != 3 {
			t.Fatalf("the orphaned pods went from 3 to %d", len(state))
		}
		for _, p := range state {
			if p.DeletionTimestamp != nil {
				t.Fatalf("orphaned pod %s was deleted", p.Name)
			}
		}
	}
}

func TestDanglingOwner(t *testing.T) {
	c := loopstest.Start(t, nil, hollow.Options{LeaseEvery: -1})
	cms := c.Client.CoreV1().ConfigMaps("default")
	keep, err := cms.Create(c.Ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "owner"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ref := func(name string, uid types.UID) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: name, UID: uid}
	}
	for _, cm := range []*corev1.ConfigMap{
		{ObjectMeta: metav1.ObjectMeta{Name: "orphaned", OwnerReferences: []metav1.OwnerReference{ref("gone", "0000-gone")}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "half", OwnerReferences: []metav1.OwnerReference{ref("gone", "0000-gone"), ref("owner", keep.UID)}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "owned", OwnerReferences: []metav1.OwnerReference{ref("owner", keep.UID)}}},
	} {
		if _, err := cms.Create(c.Ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	c.Eventually("dangling references resolved", 30*time.Second, func(ctx context.Context) (bool, error) {
		if _, err := cms.Get(ctx, "orphaned", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return false, nil
		}
		half, err := cms.Get(ctx, "half", metav1.GetOptions{})
		return err == nil && len(half.OwnerReferences) == 1 && half.OwnerReferences[0].UID == keep.UID, err
	})
	if _, err := cms.Get(c.Ctx, "owned", metav1.GetOptions{}); err != nil {
		t.Fatalf("an object with a live owner was collected: %v", err)
	}
	if err := cms.Delete(c.Ctx, "owner", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("dependents of a deleted owner collected", 30*time.Second, func(ctx context.Context) (bool, error) {
		_, err1 := cms.Get(ctx, "owned", metav1.GetOptions{})
		_, err2 := cms.Get(ctx, "half", metav1.GetOptions{})
		return apierrors.IsNotFound(err1) && apierrors.IsNotFound(err2), nil
	})
}

// TestForegroundKeepsDependentsWithAnotherOwner: deleting an owner in
// the foreground deletes the dependents it alone owns, and only unhooks
// those that another owner keeps, as Kubernetes' collector does (its
// conformance suite checks it with two ReplicationControllers sharing
// half the pods); the owner goes once none blocks it.
func TestForegroundKeepsDependentsWithAnotherOwner(t *testing.T) {
	c := loopstest.Start(t, nil, hollow.Options{LeaseEvery: -1})
	cms := c.Client.CoreV1().ConfigMaps("default")
	var owners []*corev1.ConfigMap
	for _, name := range []string{"leaving", "staying"} {
		o, err := cms.Create(c.Ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		owners = append(owners, o)
	}
	ref := func(o *corev1.ConfigMap, block bool) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: o.Name, UID: o.UID, BlockOwnerDeletion: ptr.To(block)}
	}
	for i := range 50 {
		refs := []metav1.OwnerReference{ref(owners[0], true)}
		if i%2 == 0 {
			refs = append(refs, ref(owners[1], false))
		}
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("dep-%d", i), Labels: map[string]string{"dep": "yes"}, OwnerReferences: refs}}
		if _, err := cms.Create(c.Ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := cms.Delete(c.Ctx, "leaving", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("the owner gone", 30*time.Second, func(ctx context.Context) (bool, error) {
		_, err := cms.Get(ctx, "leaving", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	left, err := cms.List(c.Ctx, metav1.ListOptions{LabelSelector: "dep=yes"})
	if err != nil {
		t.Fatal(err)
	}
	if len(left.Items) != 25 {
		t.Fatalf("%d dependents left, want the 25 the other owner keeps", len(left.Items))
	}
	for _, d := range left.Items {
		if d.DeletionTimestamp != nil || len(d.OwnerReferences) != 1 || d.OwnerReferences[0].UID != owners[1].UID {
			t.Errorf("dependent %s: deleting %v, owners %+v", d.Name, d.DeletionTimestamp, d.OwnerReferences)
		}
	}
}
