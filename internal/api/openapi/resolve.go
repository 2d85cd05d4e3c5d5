package openapi

import (
	"fmt"
	"strings"

	"github.com/orch-dev/orch/internal/api/resources"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

// KindSchema is the schema of a served kind with every reference to
// another component replaced by that component (a type that refers to
// itself becomes a bare object where it recurs): what CEL's type checking
// reads a kind's fields from.
func KindSchema(gvk schema.GroupVersionKind, served []*resources.Resource) (*spec.Schema, error) {
	doc := Document(gvk.GroupVersion(), served)
	if doc.Components == nil {
		return nil, fmt.Errorf("no schemas for %s", gvk.GroupVersion())
	}
	components := doc.Components.Schemas
	for name, s := range components {
		kinds, _ := s.Extensions["x-kubernetes-group-version-kind"].([]any)
		for _, k := range kinds {
			if m, ok := k.(map[string]any); ok && m["group"] == gvk.Group && m["version"] == gvk.Version && m["kind"] == gvk.Kind {
				return inline(components, s, map[string]bool{name: true}), nil
			}
		}
	}
	return nil, fmt.Errorf("no schema for %s", gvk)
}

const componentsPrefix = "#/components/schemas/"

// inline returns s with its references replaced, following none already
// on the path from the root.
func inline(components map[string]*spec.Schema, s *spec.Schema, onPath map[string]bool) *spec.Schema {
	out := *s
	if name, ok := refName(s); ok {
		if onPath[name] || components[name] == nil {
			return &spec.Schema{SchemaProps: spec.SchemaProps{Type: spec.StringOrArray{"object"}}}
		}
		onPath[name] = true
		defer delete(onPath, name)
		out = *components[name]
	}
	if len(out.Properties) > 0 {
		props := make(map[string]spec.Schema, len(out.Properties))
		for k, p := range out.Properties {
			props[k] = *inline(components, &p, onPath)
		}
		out.Properties = props
	}
	if ap := out.AdditionalProperties; ap != nil && ap.Schema != nil {
		out.AdditionalProperties = &spec.SchemaOrBool{Allows: ap.Allows, Schema: inline(components, ap.Schema, onPath)}
	}
	if it := out.Items; it != nil && it.Schema != nil {
		out.Items = &spec.SchemaOrArray{Schema: inline(components, it.Schema, onPath)}
	}
	return &out
}

// refName is the component a schema refers to, directly or wrapped in
// allOf as the documents wrap references that carry a description.
func refName(s *spec.Schema) (string, bool) {
	if u := s.Ref.GetURL(); u != nil {
		return strings.TrimPrefix(s.Ref.String(), componentsPrefix), true
	}
	for i := range s.AllOf {
		if name, ok := refName(&s.AllOf[i]); ok {
			return name, true
		}
	}
	return "", false
}
