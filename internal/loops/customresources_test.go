package loops_test

import (
	"context"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/loops/hollow"
	"github.com/orch-dev/orch/internal/loops/loopstest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"
)

var gizmos = schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "gizmos"}

// defineGizmos defines a namespaced kind with a free-form spec and waits
// until it is served.
func defineGizmos(t *testing.T, c *loopstest.Cluster, dyn dynamic.Interface) {
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": "gizmos.example.com"},
		"spec": map[string]any{"group": "example.com", "scope": "Namespaced",
			"names": map[string]any{"plural": "gizmos", "singular": "gizmo", "kind": "Gizmo"},
			"versions": []any{map[string]any{"name": "v1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object",
					"properties": map[string]any{"spec": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}}},
	}}
	crds := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	if _, err := dyn.Resource(crds).Create(c.Ctx, crd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("gizmos served", 10*time.Second, func(ctx context.Context) (bool, error) {
		_, err := dyn.Resource(gizmos).Namespace("default").List(ctx, metav1.ListOptions{})
		return err == nil, nil
	})
}

func gizmo(name string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "example.com/v1", "kind": "Gizmo",
		"metadata": map[string]any{"name": name}, "spec": map[string]any{"any": "thing"}}}
}

// TestCustomResourcesInTheLoops: kinds defined after the loops started
// take part as built-in ones do. A custom resource owns what names it as
// owner (kept while it lives, collected once it is gone: the operator
// pattern), and deleting a namespace deletes the custom resources in it.
func TestCustomResourcesInTheLoops(t *testing.T) {
	c := loopstest.Start(t, nil, hollow.Options{LeaseEvery: -1})
	dyn := dynamic.NewForConfigOrDie(c.Server.Admin)
	defineGizmos(t, c, dyn)

	owner, err := dyn.Resource(gizmos).Namespace("default").Create(c.Ctx, gizmo("owner"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "owned", OwnerReferences: []metav1.OwnerReference{{
		APIVersion: "example.com/v1", Kind: "Gizmo", Name: owner.GetName(), UID: owner.GetUID()}}}}
	if _, err := c.Client.CoreV1().ConfigMaps("default").Create(c.Ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The collector sees the owner's kind (defined after it started) and
	// leaves the dependent of a living owner alone.
	time.Sleep(2 * time.Second)
	if _, err := c.Client.CoreV1().ConfigMaps("default").Get(c.Ctx, "owned", metav1.GetOptions{}); err != nil {
		t.Fatalf("the dependent of a living custom resource was deleted: %v", err)
	}
	if err := dyn.Resource(gizmos).Namespace("default").Delete(c.Ctx, "owner", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("the dependent collected", 40*time.Second, func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().ConfigMaps("default").Get(ctx, "owned", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})

	// A custom resource deleted with its dependents orphaned lets a
	// custom dependent go free: its reference is taken off with a JSON
	// patch (custom resources take no strategic merge patch; the suite's
	// "should support orphan deletion of custom resources").
	parent, err := dyn.Resource(gizmos).Namespace("default").Create(c.Ctx, gizmo("parent"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	child := gizmo("child")
	child.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "example.com/v1", Kind: "Gizmo", Name: "parent", UID: parent.GetUID()}})
	if _, err := dyn.Resource(gizmos).Namespace("default").Create(c.Ctx, child, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := dyn.Resource(gizmos).Namespace("default").Delete(c.Ctx, "parent", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationOrphan)}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("the orphaning parent gone", 40*time.Second, func(ctx context.Context) (bool, error) {
		_, err := dyn.Resource(gizmos).Namespace("default").Get(ctx, "parent", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if got, err := dyn.Resource(gizmos).Namespace("default").Get(c.Ctx, "child", metav1.GetOptions{}); err != nil || len(got.GetOwnerReferences()) != 0 {
		t.Errorf("the orphaned child: %v, owners %v", err, got.GetOwnerReferences())
	}

	// A namespace goes with its custom resources.
	if _, err := c.Client.CoreV1().Namespaces().Create(c.Ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(gizmos).Namespace("team").Create(c.Ctx, gizmo("left"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Client.CoreV1().Namespaces().Delete(c.Ctx, "team", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("the namespace gone with its gizmo", 30*time.Second, func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().Namespaces().Get(ctx, "team", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if _, err := dyn.Resource(gizmos).Namespace("team").Get(c.Ctx, "left", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a gizmo outlived its namespace: %v", err)
	}
}
