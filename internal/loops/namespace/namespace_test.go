package namespace_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/loops/hollow"
	"github.com/orch-dev/orch/internal/loops/loopstest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func condition(ns *corev1.Namespace, t corev1.NamespaceConditionType) *corev1.NamespaceCondition {
	for i := range ns.Status.Conditions {
		if ns.Status.Conditions[i].Type == t {
			return &ns.Status.Conditions[i]
		}
	}
	return nil
}

// TestNamespaceDeletesPodsFirst: a namespace being deleted loses its pods
// first; while a pod is held (here by a finalizer) the rest stays, and the
// namespace's conditions say what remains and why, in Kubernetes' words;
// once the pod goes, so do the rest and the namespace.
func TestNamespaceDeletesPodsFirst(t *testing.T) {
	c := loopstest.Start(t, map[string]hollow.NodeOptions{"n1": {}}, hollow.Options{LeaseEvery: -1})
	core := c.Client.CoreV1()
	if _, err := core.Namespaces().Create(c.Ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "doomed"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "held", Finalizers: []string{"example.com/hold"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	if _, err := core.Pods("doomed").Create(c.Ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := core.ConfigMaps("doomed").Create(c.Ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "used"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := core.Namespaces().Delete(c.Ctx, "doomed", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("the namespace reports the held pod", 30*time.Second, func(ctx context.Context) (bool, error) {
		ns, err := core.Namespaces().Get(ctx, "doomed", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		failure, remaining, finalizers := condition(ns, corev1.NamespaceDeletionContentFailure), condition(ns, corev1.NamespaceContentRemaining),
			condition(ns, corev1.NamespaceFinalizersRemaining)
		return failure != nil && failure.Status == corev1.ConditionTrue && remaining != nil && remaining.Status == corev1.ConditionTrue &&
			strings.Contains(remaining.Message, "pods. has 1 resource instances") && finalizers != nil &&
			strings.Contains(finalizers.Message, "example.com/hold in 1 resource instances") &&
			condition(ns, corev1.NamespaceDeletionDiscoveryFailure).Status == corev1.ConditionFalse, nil
	})
	p, err := core.Pods("doomed").Get(c.Ctx, "held", metav1.GetOptions{})
	if err != nil || p.DeletionTimestamp == nil {
		t.Fatalf("the pod is not being deleted: %v", err)
	}
	if _, err := core.ConfigMaps("doomed").Get(c.Ctx, "used", metav1.GetOptions{}); err != nil {
		t.Fatalf("the configmap went before the pod: %v", err)
	}
	if _, err := core.Pods("doomed").Patch(c.Ctx, "held", types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("the namespace gone", 30*time.Second, func(ctx context.Context) (bool, error) {
		_, err := core.Namespaces().Get(ctx, "doomed", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}
