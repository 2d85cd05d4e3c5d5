package openapi

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/orch-dev/orch/internal/api/resources/authorization"
	"github.com/orch-dev/orch/internal/api/resources/builtin"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/kube-openapi/pkg/spec3"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

func readDocument(t *testing.T, gv schema.GroupVersion) *spec3.OpenAPI {
	t.Helper()
	// Through JSON and back, as a client reads it.
	raw, err := json.Marshal(Document(gv, builtin.Resources()))
	if err != nil {
		t.Fatal(err)
	}
	var doc spec3.OpenAPI
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	return &doc
}

func TestSchemas(t *testing.T) {
	apps := readDocument(t, appsv1.SchemeGroupVersion)
	core := readDocument(t, corev1.SchemeGroupVersion)
	tests := []struct {
		name  string
		doc   *spec3.OpenAPI
		comp  string
		field string
		check func(t *testing.T, s spec.Schema)
	}{
		{"containers merge by name", core, "io.k8s.api.core.v1.PodSpec", "containers", func(t *testing.T, s spec.Schema) {
			if s.Extensions["x-kubernetes-patch-merge-key"] != "name" || s.Extensions["x-kubernetes-patch-strategy"] != "merge" || s.Type[0] != "array" {
				t.Errorf("%+v", s)
			}
		}},
		{"required container name", core, "io.k8s.api.core.v1.Container", "", func(t *testing.T, s spec.Schema) {
			if len(s.Required) != 1 || s.Required[0] != "name" {
				t.Errorf("required %v", s.Required)
			}
		}},
		{"int32 field", apps, "io.k8s.api.apps.v1.DeploymentSpec", "replicas", func(t *testing.T, s spec.Schema) {
			if s.Type[0] != "integer" || s.Format != "int32" {
				t.Errorf("%+v", s.SchemaProps)
			}
		}},
		{"int-or-string", apps, "io.k8s.apimachinery.pkg.util.intstr.IntOrString", "", func(t *testing.T, s spec.Schema) {
			if s.Format != "int-or-string" || len(s.OneOf) != 2 {
				t.Errorf("%+v", s.SchemaProps)
			}
		}},
		{"time", apps, "io.k8s.apimachinery.pkg.apis.meta.v1.Time", "", func(t *testing.T, s spec.Schema) {
			if s.Type[0] != "string" || s.Format != "date-time" {
				t.Errorf("%+v", s.SchemaProps)
			}
		}},
		{"typemeta inline", apps, "io.k8s.api.apps.v1.Deployment", "kind", func(t *testing.T, s spec.Schema) {
			if s.Type[0] != "string" {
				t.Errorf("%+v", s.SchemaProps)
			}
		}},
		{"kind tagged", apps, "io.k8s.api.apps.v1.Deployment", "", func(t *testing.T, s spec.Schema) {
			gvks, _ := s.Extensions["x-kubernetes-group-version-kind"].([]any)
			if len(gvks) != 1 || gvks[0].(map[string]any)["kind"] != "Deployment" {
				t.Errorf("%v", s.Extensions)
			}
		}},
		// Server-side apply's merge rules, as Kubernetes publishes them.
		{"containers are a list map by name", core, "io.k8s.api.core.v1.PodSpec", "containers", func(t *testing.T, s spec.Schema) {
			keys, _ := s.Extensions["x-kubernetes-list-map-keys"].([]any)
			if s.Extensions["x-kubernetes-list-type"] != "map" || len(keys) != 1 || keys[0] != "name" {
				t.Errorf("%v", s.Extensions)
			}
		}},
		{"ports are keyed by port and protocol", core, "io.k8s.api.core.v1.Container", "ports", func(t *testing.T, s spec.Schema) {
			keys, _ := s.Extensions["x-kubernetes-list-map-keys"].([]any)
			if s.Extensions["x-kubernetes-list-type"] != "map" || len(keys) != 2 || keys[0] != "containerPort" || keys[1] != "protocol" {
				t.Errorf("%v", s.Extensions)
			}
		}},
		{"finalizers are a set", core, "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", "finalizers", func(t *testing.T, s spec.Schema) {
			if s.Extensions["x-kubernetes-list-type"] != "set" {
				t.Errorf("%v", s.Extensions)
			}
		}},
		{"args are atomic", core, "io.k8s.api.core.v1.Container", "args", func(t *testing.T, s spec.Schema) {
			if s.Extensions["x-kubernetes-list-type"] != "atomic" {
				t.Errorf("%v", s.Extensions)
			}
		}},
		{"node selector is an atomic map", core, "io.k8s.api.core.v1.PodSpec", "nodeSelector", func(t *testing.T, s spec.Schema) {
			if s.Extensions["x-kubernetes-map-type"] != "atomic" {
				t.Errorf("%v", s.Extensions)
			}
		}},
		{"a label selector is replaced whole", apps, "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector", "", func(t *testing.T, s spec.Schema) {
			if s.Extensions["x-kubernetes-map-type"] != "atomic" {
				t.Errorf("%v", s.Extensions)
			}
		}},
		{"resource list is a map", core, "io.k8s.api.core.v1.ResourceRequirements", "limits", func(t *testing.T, s spec.Schema) {
			if s.Type[0] != "object" || s.AdditionalProperties == nil || s.AdditionalProperties.Schema == nil {
				t.Errorf("%+v", s.SchemaProps)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.doc.Components.Schemas[tt.comp]
			if c == nil {
				t.Fatalf("no component %s", tt.comp)
			}
			if tt.field == "" {
				tt.check(t, *c)
				return
			}
			f, ok := c.Properties[tt.field]
			if !ok {
				t.Fatalf("%s has no field %s", tt.comp, tt.field)
			}
			tt.check(t, f)
		})
	}
}

// TestPatchOperations: kubectl uses server-side field validation only when
// a kind's PATCH operation takes fieldValidation, and computes strategic
// merge patches only when it accepts them.
func TestPatchOperations(t *testing.T) {
	for _, r := range builtin.Resources() {
		doc := readDocument(t, r.GroupVersion())
		found := false
		for path, p := range doc.Paths.Paths {
			if p.Patch == nil || p.Patch.Extensions["x-kubernetes-group-version-kind"].(map[string]any)["kind"] != r.Kind {
				continue
			}
			found = true
			hasParam := false
			for _, param := range p.Patch.Parameters {
				hasParam = hasParam || (param.Name == "fieldValidation" && param.In == "query")
			}
			if !hasParam {
				t.Errorf("%s PATCH has no fieldValidation", path)
			}
			if p.Patch.RequestBody.Content["application/strategic-merge-patch+json"] == nil {
				t.Errorf("%s PATCH takes no strategic merge patch", path)
			}
		}
		if !found {
			t.Errorf("no PATCH operation for %s", r.GroupVersionKind)
		}
	}
}

// TestStrategicMergeFromSchema: a patch built from the published schema is
// the one built from the Go type, as kubectl apply needs.
func TestStrategicMergeFromSchema(t *testing.T) {
	doc := readDocument(t, appsv1.SchemeGroupVersion)
	original := []byte(`{"spec":{"template":{"spec":{"containers":[{"name":"a","image":"x:1"},{"name":"b","image":"y:1"}]}}}}`)
	modified := []byte(`{"spec":{"template":{"spec":{"containers":[{"name":"a","image":"x:2"}]}}}}`)
	current := []byte(`{"metadata":{"labels":{"k":"v"}},"spec":{"replicas":3,"template":{"spec":{"containers":[{"name":"a","image":"x:1","ports":[{"containerPort":80}]},{"name":"b","image":"y:1"}]}}}}`)
	meta := strategicpatch.PatchMetaFromOpenAPIV3{Schema: doc.Components.Schemas["io.k8s.api.apps.v1.Deployment"], SchemaList: doc.Components.Schemas}
	fromSchema, err := strategicpatch.CreateThreeWayMergePatch(original, modified, current, meta, false)
	if err != nil {
		t.Fatal(err)
	}
	structMeta, err := strategicpatch.NewPatchMetaFromStruct(&appsv1.Deployment{})
	if err != nil {
		t.Fatal(err)
	}
	fromStruct, err := strategicpatch.CreateThreeWayMergePatch(original, modified, current, structMeta, false)
	if err != nil {
		t.Fatal(err)
	}
	if string(fromSchema) != string(fromStruct) {
		t.Errorf("patch from schema %s, from the Go type %s", fromSchema, fromStruct)
	}
}

// TestReviewOperations: a review kind is a question answered, not stored:
// its document has POST to its collection and nothing else, as
// Kubernetes publishes SelfSubjectAccessReview and its kin.
func TestReviewOperations(t *testing.T) {
	noAnswer := func(context.Context, runtime.Object) (runtime.Object, error) { return nil, nil }
	reviews := authorization.Resources(noAnswer)
	gv := schema.GroupVersion{Group: "authorization.k8s.io", Version: "v1"}
	raw, err := json.Marshal(Document(gv, reviews))
	if err != nil {
		t.Fatal(err)
	}
	var doc spec3.OpenAPI
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", "/apis/authorization.k8s.io/v1/namespaces/{namespace}/localsubjectaccessreviews"} {
		p := doc.Paths.Paths[path]
		if p == nil || p.Post == nil {
			t.Fatalf("%s: no POST", path)
		}
		if p.Get != nil || p.Delete != nil || doc.Paths.Paths[path+"/{name}"] != nil {
			t.Errorf("%s: operations besides create", path)
		}
	}
}
