package openapi

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	openapiv2 "github.com/google/gnostic-models/openapiv2"
	"github.com/orch-dev/orch/internal/api/resources/builtin"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/runtime/schema"
	openapiproto "k8s.io/kube-openapi/pkg/util/proto"
)

// TestSwaggerV2 reads /openapi/v2 as client-go's discovery does (protobuf)
// and finds the served kinds in it as kubectl's and Helm 3's validation
// do: by group/version/kind, with Kubernetes' descriptions.
func TestSwaggerV2(t *testing.T) {
	h := NewV2Handler(Static(builtin.Resources()))
	req := httptest.NewRequest(http.MethodGet, "/openapi/v2", nil)
	req.Header.Set("Accept", "application/com.github.proto-openapi.spec.v2@v1.0+protobuf") // client-go's
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != 200 || rec.Header().Get("Content-Type") != protobufV2 {
		t.Fatalf("%d %s", rec.Code, rec.Header().Get("Content-Type"))
	}
	var doc openapiv2.Document
	if err := proto.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	models, err := openapiproto.NewOpenAPIData(&doc)
	if err != nil {
		t.Fatal(err)
	}
	for _, gvk := range []schema.GroupVersionKind{{Version: "v1", Kind: "Pod"}, {Group: "apps", Version: "v1", Kind: "Deployment"}, {Group: "batch", Version: "v1", Kind: "Job"}} {
		name := ""
		for _, m := range models.ListModels() {
			if gvks, ok := models.LookupModel(m).GetExtensions()["x-kubernetes-group-version-kind"].([]any); ok {
				for _, g := range gvks {
					if g, ok := g.(map[any]any); ok && g["group"] == gvk.Group && g["version"] == gvk.Version && g["kind"] == gvk.Kind {
						name = m
					}
				}
			}
		}
		if name == "" {
			t.Errorf("no definition for %v", gvk)
			continue
		}
		kind, ok := models.LookupModel(name).(*openapiproto.Kind)
		if !ok || kind.Fields["spec"] == nil {
			t.Errorf("%v: %T without spec", gvk, models.LookupModel(name))
		}
	}
	pod := models.LookupModel("io.k8s.api.core.v1.PodSpec").(*openapiproto.Kind)
	if d := pod.Fields["containers"].GetDescription(); !strings.Contains(d, "List of containers belonging to the pod") {
		t.Errorf("PodSpec.containers description %q", d)
	}
	// JSON to clients that do not ask for protobuf.
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/openapi/v2", nil))
	if !strings.HasPrefix(rec.Body.String(), `{`) || !strings.Contains(rec.Body.String(), `"swagger":"2.0"`) {
		t.Errorf("JSON document starts %.80q", rec.Body.String())
	}
}
