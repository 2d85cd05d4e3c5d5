package api_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api/apitest"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// TestCustomResourceSelectableFields: a version's selectableFields are
// field selectors of lists and watches, as Kubernetes serves them; a
// field not listed is refused.
func TestCustomResourceSelectableFields(t *testing.T) {
	srv := apitest.Start(t)
	ctx := context.Background()
	crd := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: "crayons.example.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{Group: "example.com", Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "crayons", Singular: "crayon", Kind: "Crayon"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
				SelectableFields: []apiextensionsv1.SelectableField{{JSONPath: ".spec.color"}, {JSONPath: ".spec.size"}},
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
					"spec": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{"color": {Type: "string"}, "size": {Type: "integer"}}}}}}}}}}
	if err := createCRD(ctx, srv.Admin, crd); err != nil {
		t.Fatal(err)
	}
	waitCRDCondition(t, srv.Admin, crd.Name, apiextensionsv1.Established)
	crayons := dynamic.NewForConfigOrDie(srv.Admin).Resource(schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "crayons"}).Namespace("default")
	var err error
	for i, c := range []struct {
		color string
		size  int64
	}{{"blue", 1}, {"red", 2}, {"blue", 3}} {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "example.com/v1", "kind": "Crayon",
			"metadata": map[string]any{"name": fmt.Sprintf("c%d", i)}, "spec": map[string]any{"color": c.color, "size": c.size}}}
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if _, err = crayons.Create(ctx, u, metav1.CreateOptions{}); err == nil {
				break
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	for selector, want := range map[string]int{"spec.color=blue": 2, "spec.color!=blue": 1, "spec.size=3": 1, "spec.color=blue,spec.size=1": 1} {
		list, err := crayons.List(ctx, metav1.ListOptions{FieldSelector: selector})
		if err != nil || len(list.Items) != want {
			t.Errorf("list with %s: %v, %d items, want %d", selector, err, len(list.Items), want)
		}
	}
	w, err := crayons.Watch(ctx, metav1.ListOptions{FieldSelector: "spec.color=red"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	select {
	case ev := <-w.ResultChan():
		if u, ok := ev.Object.(*unstructured.Unstructured); !ok || u.GetName() != "c1" {
			t.Errorf("the watch's first event: %v %v", ev.Type, ev.Object)
		}
	case <-time.After(10 * time.Second):
		t.Error("no event from the watch")
	}
	if _, err := crayons.List(ctx, metav1.ListOptions{FieldSelector: "spec.shape=round"}); !apierrors.IsBadRequest(err) || !strings.Contains(err.Error(), "field label not supported: spec.shape") {
		t.Errorf("a field not selectable: %v", err)
	}
}
