package openapi

import (
	"testing"

	"github.com/orch-dev/orch/internal/api/resources/builtin"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestKindSchema: a kind's schema with its references inlined, as CEL's
// type checking reads it: Deployment's spec.replicas is an integer, its
// pod template's containers a list of objects with a name.
func TestKindSchema(t *testing.T) {
	s, err := KindSchema(schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}, builtin.Resources())
	if err != nil {
		t.Fatal(err)
	}
	spec := s.Properties["spec"]
	if got := spec.Properties["replicas"].Type; len(got) != 1 || got[0] != "integer" {
		t.Fatalf("spec.replicas: %v", got)
	}
	containers := spec.Properties["template"].Properties["spec"].Properties["containers"]
	if containers.Items == nil || containers.Items.Schema == nil || containers.Items.Schema.Properties["name"].Type[0] != "string" {
		t.Fatalf("containers: %+v", containers)
	}
	if _, err := KindSchema(schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Nothing"}, builtin.Resources()); err == nil {
		t.Fatal("a kind not served has a schema")
	}
}
