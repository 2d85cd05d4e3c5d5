package replicaset_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/loops/hollow"
	"github.com/orch-dev/orch/internal/loops/loopstest"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
)

func replicaSet(name string, replicas int32) *appsv1.ReplicaSet {
	labels := map[string]string{"app": name}
	return &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.ReplicaSetSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
			},
		},
	}
}

// pods returns the pods the set controls, and how many of them are ready.
func pods(ctx context.Context, c *loopstest.Cluster, set string) (owned []corev1.Pod, ready int, err error) {
	list, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=" + set})
	if err != nil {
		return nil, 0, err
	}
	for _, p := range list.Items {
		if ref := metav1.GetControllerOf(&p); ref == nil || ref.Name != set || p.DeletionTimestamp != nil {
			continue
		}
		owned = append(owned, p)
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				ready++
			}
		}
	}
	return owned, ready, nil
}

func waitFor(t *testing.T, c *loopstest.Cluster, set string, want int32) {
	t.Helper()
	c.Eventually(fmt.Sprintf("%s at %d ready replicas", set, want), 30*time.Second, func(ctx context.Context) (bool, error) {
		owned, ready, err := pods(ctx, c, set)
		if err != nil {
			return false, err
		}
		rs, err := c.Client.AppsV1().ReplicaSets("default").Get(ctx, set, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return len(owned) == int(want) && ready == int(want) && rs.Status.Replicas == want && rs.Status.ReadyReplicas == want &&
			rs.Status.AvailableReplicas == want && rs.Status.ObservedGeneration == rs.Generation, nil
	})
}

func TestReplicaSetKeepsReplicas(t *testing.T) {
	c := loopstest.Start(t, map[string]hollow.NodeOptions{"n1": {}, "n2": {}, "n3": {}}, hollow.Options{LeaseEvery: -1})
	sets := c.Client.AppsV1().ReplicaSets("default")
	if _, err := sets.Create(c.Ctx, replicaSet("web", 3), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, c, "web", 3)

	scale := func(n int32) {
		t.Helper()
		s, err := sets.GetScale(c.Ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.Spec.Replicas = n
		s.ResourceVersion = "" // unconditional, as kubectl scale: the controller writes status meanwhile
		if _, err := sets.UpdateScale(c.Ctx, "web", s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	scale(7)
	waitFor(t, c, "web", 7)
	scale(2)
	waitFor(t, c, "web", 2)

	// A deleted pod is replaced.
	owned, _, _ := pods(c.Ctx, c, "web")
	if err := c.Client.CoreV1().Pods("default").Delete(c.Ctx, owned[0].Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("the deleted pod replaced", 30*time.Second, func(ctx context.Context) (bool, error) {
		now, ready, err := pods(ctx, c, "web")
		return err == nil && len(now) == 2 && ready == 2 && now[0].Name != owned[0].Name && now[1].Name != owned[0].Name, err
	})
}

func TestReplicaSetAdoptsAndReleases(t *testing.T) {
	c := loopstest.Start(t, map[string]hollow.NodeOptions{"n1": {}}, hollow.Options{LeaseEvery: -1})
	orphan := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "orphan", Labels: map[string]string{"app": "db"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}
	if _, err := c.Client.CoreV1().Pods("default").Create(c.Ctx, orphan, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.AppsV1().ReplicaSets("default").Create(c.Ctx, replicaSet("db", 2), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, c, "db", 2)
	p, err := c.Client.CoreV1().Pods("default").Get(c.Ctx, "orphan", metav1.GetOptions{})
	if err != nil || metav1.GetControllerOf(p) == nil || metav1.GetControllerOf(p).Name != "db" {
		t.Fatalf("the matching orphan was not adopted: %+v %v", p.OwnerReferences, err)
	}
	// Relabelled out of the selector: released, and replaced.
	// The kubelet and the controller write the pod too: retry on conflict.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := c.Client.CoreV1().Pods("default").Get(c.Ctx, "orphan", metav1.GetOptions{})
		if err != nil {
			return err
		}
		p.Labels = map[string]string{"app": "debug"}
		_, err = c.Client.CoreV1().Pods("default").Update(c.Ctx, p, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("the relabelled pod released", 30*time.Second, func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods("default").Get(ctx, "orphan", metav1.GetOptions{})
		return err == nil && metav1.GetControllerOf(p) == nil, err
	})
	waitFor(t, c, "db", 2)
}
