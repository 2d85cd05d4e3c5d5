package loops_test

import (
	"context"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/loops"
	"github.com/orch-dev/orch/internal/loops/hollow"
	"github.com/orch-dev/orch/internal/loops/loopstest"
	svmv1 "k8s.io/api/storagemigration/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestStorageVersionMigration: a custom resource whose storage version
// moved from v1 to v2 is migrated as Kubernetes' migrator does it: the
// objects stored at v1 are written again (a new resourceVersion), the
// ones already at v2 are left as they are, and the migration ends
// Succeeded with the resourceVersion it started at; a migration of a
// resource nobody serves fails once its minute of grace is over.
func TestStorageVersionMigration(t *testing.T) {
	fake := clocktesting.NewFakeClock(time.Now())
	c := loopstest.StartWith(t, nil, hollow.Options{LeaseEvery: -1, Clock: fake}, loops.Options{Clock: fake})
	dyn := dynamic.NewForConfigOrDie(c.Server.Admin)
	crds := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	version := func(name string, storage bool) map[string]any {
		return map[string]any{"name": name, "served": true, "storage": storage, "schema": map[string]any{"openAPIV3Schema": map[string]any{
			"type": "object", "properties": map[string]any{"spec": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}
	}
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": map[string]any{"name": "widgets.example.com"},
		"spec": map[string]any{"group": "example.com", "scope": "Namespaced", "names": map[string]any{"plural": "widgets", "singular": "widget", "kind": "Widget"},
			"versions": []any{version("v1", true), version("v2", false)}},
	}}
	if _, err := dyn.Resource(crds).Create(c.Ctx, crd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	widgets := schema.GroupVersionResource{Group: "example.com", Version: "v2", Resource: "widgets"}
	c.Eventually("widgets served", 10*time.Second, func(ctx context.Context) (bool, error) {
		_, err := dyn.Resource(widgets).Namespace("default").List(ctx, metav1.ListOptions{})
		return err == nil, nil
	})
	create := func(name string) string { // the new object's resourceVersion
		w := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "example.com/v2", "kind": "Widget",
			"metadata": map[string]any{"name": name}, "spec": map[string]any{"size": 1}}}
		made, err := dyn.Resource(widgets).Namespace("default").Create(c.Ctx, w, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return made.GetResourceVersion()
	}
	oldRV := create("stored-at-v1")
	storageV2 := `{"spec":{"versions":[` + `{"name":"v1","served":true,"storage":false,"schema":{"openAPIV3Schema":{"type":"object","properties":{"spec":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}}}},` +
		`{"name":"v2","served":true,"storage":true,"schema":{"openAPIV3Schema":{"type":"object","properties":{"spec":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}}}}]}}`
	if _, err := dyn.Resource(crds).Patch(c.Ctx, "widgets.example.com", types.MergePatchType, []byte(storageV2), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// A write once the server stores v2 (its watch cache has the new
	// definition when a create made through it answers at v2 storage).
	time.Sleep(time.Second)
	create("stored-at-v2")
	// A write through v1 keeps what was recorded at v2 in managedFields
	// (one type converter knows both versions: once, the entry was lost,
	// and the object stored differently on each write).
	v1 := schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}
	labeled, err := dyn.Resource(v1).Namespace("default").Patch(c.Ctx, "stored-at-v2", types.MergePatchType, []byte(`{"metadata":{"labels":{"a":"b"}}}`), metav1.PatchOptions{FieldManager: "labeler"})
	if err != nil {
		t.Fatal(err)
	}
	managers := map[string]string{}
	for _, e := range labeled.GetManagedFields() {
		managers[e.Manager] = e.APIVersion
	}
	if len(managers) != 2 || managers["labeler"] != "example.com/v1" || managers["loops.test"] != "example.com/v2" {
		t.Errorf("managedFields after a write through another version: %+v", labeled.GetManagedFields())
	}
	newRV := labeled.GetResourceVersion()

	migrations := c.Client.StoragemigrationV1().StorageVersionMigrations()
	for _, m := range []*svmv1.StorageVersionMigration{
		{ObjectMeta: metav1.ObjectMeta{Name: "widgets"}, Spec: svmv1.StorageVersionMigrationSpec{Resource: metav1.GroupResource{Group: "example.com", Resource: "widgets"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "nothing"}, Spec: svmv1.StorageVersionMigrationSpec{Resource: metav1.GroupResource{Resource: "foo"}}},
	} {
		if _, err := migrations.Create(c.Ctx, m, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var done *svmv1.StorageVersionMigration
	c.Eventually("the widgets' migration succeeded", 30*time.Second, func(ctx context.Context) (bool, error) {
		m, err := migrations.Get(ctx, "widgets", metav1.GetOptions{})
		done = m
		return err == nil && apimeta.IsStatusConditionTrue(m.Status.Conditions, string(svmv1.MigrationSucceeded)), nil
	})
	if done.Status.ResourceVersion == "" || !apimeta.IsStatusConditionFalse(done.Status.Conditions, string(svmv1.MigrationRunning)) {
		t.Errorf("the migration's status: %+v", done.Status)
	}
	rv := func(name string) string {
		w, err := dyn.Resource(widgets).Namespace("default").Get(c.Ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return w.GetResourceVersion()
	}
	if got := rv("stored-at-v1"); got == oldRV {
		t.Errorf("the widget stored at v1 was not written again (resourceVersion %s)", got)
	}
	if got := rv("stored-at-v2"); got != newRV {
		t.Errorf("the widget already at v2 was written again (resourceVersion %s, was %s)", got, newRV)
	}

	// Not served: pending through its minute of grace, then Failed.
	if m, err := migrations.Get(c.Ctx, "nothing", metav1.GetOptions{}); err != nil || len(m.Status.Conditions) != 0 {
		t.Fatalf("a migration of a resource not served, within its grace: %v %+v", err, m)
	}
	fake.Step(2 * time.Minute)
	c.Eventually("the migration of a resource not served failed", 30*time.Second, func(ctx context.Context) (bool, error) {
		m, err := migrations.Get(ctx, "nothing", metav1.GetOptions{})
		return err == nil && apimeta.IsStatusConditionTrue(m.Status.Conditions, string(svmv1.MigrationFailed)), nil
	})
}
