package openapi

import (
	"encoding/json"
	"reflect"
	"strings"

	"github.com/orch-dev/orch/internal/api/apply"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

// schemaTyper is what apimachinery's special types (Time, Quantity,
// IntOrString, Duration) implement to say how they look on the wire.
type schemaTyper interface {
	OpenAPISchemaType() []string
	OpenAPISchemaFormat() string
}

// oneOfTyper lists the alternatives of a type that is more than one JSON
// type (an IntOrString is an integer or a string).
type oneOfTyper interface {
	OpenAPIV3OneOfTypes() []string
}

var (
	schemaTyperType = reflect.TypeFor[schemaTyper]()
	marshalerType   = reflect.TypeFor[json.Marshaler]()
)

// schemas collects the component schemas of one document, named as
// Kubernetes names them ("io.k8s.api.apps.v1.Deployment").
type schemas map[string]*spec.Schema

// ref returns the schema of a value of type t as a property or item: a
// reference to a component for named structs and apimachinery's special
// types, an inline schema for everything else.
func (s schemas) ref(t reflect.Type) spec.Schema {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if name := componentName(t); name != "" && (t.Kind() == reflect.Struct || implements(t, schemaTyperType)) {
		if _, done := s[name]; !done {
			s[name] = &spec.Schema{} // placeholder first: types may refer to themselves
			built := s.component(t)
			s[name] = &built
		}
		return spec.Schema{SchemaProps: spec.SchemaProps{AllOf: []spec.Schema{*spec.RefSchema("#/components/schemas/" + name)}}}
	}
	return s.inline(t)
}

// component is the full schema of a named type.
func (s schemas) component(t reflect.Type) spec.Schema {
	if implements(t, schemaTyperType) {
		v := reflect.New(t).Interface().(schemaTyper)
		out := spec.Schema{SchemaProps: spec.SchemaProps{Format: v.OpenAPISchemaFormat()}}
		if o, ok := v.(oneOfTyper); ok && len(o.OpenAPIV3OneOfTypes()) > 0 {
			for _, typ := range o.OpenAPIV3OneOfTypes() {
				out.OneOf = append(out.OneOf, spec.Schema{SchemaProps: spec.SchemaProps{Type: spec.StringOrArray{typ}}})
			}
			return out
		}
		out.Type = v.OpenAPISchemaType()
		return out
	}
	if implements(t, marshalerType) {
		// RawExtension, FieldsV1: free-form JSON the type encodes itself.
		out := spec.Schema{SchemaProps: spec.SchemaProps{Type: spec.StringOrArray{"object"}}}
		out.AddExtension("x-kubernetes-preserve-unknown-fields", true)
		return out
	}
	out := spec.Schema{SchemaProps: spec.SchemaProps{Type: spec.StringOrArray{"object"}}}
	s.addFields(&out, t)
	if docs := swaggerDoc(t); docs != nil {
		out.Description = docs[""]
	}
	for k, v := range apply.TypeExtensions(componentName(t)) {
		out.AddExtension(k, v)
	}
	return out
}

// swaggerDocumented is what every k8s.io/api and apimachinery type has: its
// description and its fields', generated from the source comments that
// `kubectl explain` prints.
type swaggerDocumented interface {
	SwaggerDoc() map[string]string
}

var swaggerDocumentedType = reflect.TypeFor[swaggerDocumented]()

// swaggerDoc is t's descriptions by JSON field name ("" for t itself).
func swaggerDoc(t reflect.Type) map[string]string {
	if !implements(t, swaggerDocumentedType) {
		return nil
	}
	return reflect.New(t).Interface().(swaggerDocumented).SwaggerDoc()
}

// addFields adds t's JSON fields as properties of out, flattening inline
// embedded structs (TypeMeta) as encoding/json does.
func (s schemas) addFields(out *spec.Schema, t reflect.Type) {
	docs := swaggerDoc(t)
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if f.Anonymous && name == "" {
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				s.addFields(out, ft)
				continue
			}
		}
		if name == "" {
			name = f.Name
		}
		prop := s.ref(f.Type)
		prop.Description = docs[name]
		if strategy := f.Tag.Get("patchStrategy"); strategy != "" {
			prop.AddExtension("x-kubernetes-patch-strategy", strategy)
		}
		if key := f.Tag.Get("patchMergeKey"); key != "" {
			prop.AddExtension("x-kubernetes-patch-merge-key", key)
		}
		for k, v := range apply.FieldExtensions(componentName(t), name) {
			prop.AddExtension(k, v)
		}
		if out.Properties == nil {
			out.Properties = map[string]spec.Schema{}
		}
		out.Properties[name] = prop
		// A field that is always encoded is one Kubernetes requires.
		if !strings.Contains(opts, "omitempty") && !strings.Contains(opts, "omitzero") && f.Type.Kind() != reflect.Pointer && f.Type.Kind() != reflect.Bool {
			out.Required = append(out.Required, name)
		}
	}
}

// inline is the schema of an unnamed or primitive type.
func (s schemas) inline(t reflect.Type) spec.Schema {
	typed := func(typ, format string) spec.Schema {
		return spec.Schema{SchemaProps: spec.SchemaProps{Type: spec.StringOrArray{typ}, Format: format}}
	}
	switch t.Kind() {
	case reflect.String:
		return typed("string", "")
	case reflect.Bool:
		return typed("boolean", "")
	case reflect.Int32, reflect.Uint32, reflect.Int16, reflect.Uint16, reflect.Int8, reflect.Uint8:
		return typed("integer", "int32")
	case reflect.Int, reflect.Int64, reflect.Uint, reflect.Uint64:
		return typed("integer", "int64")
	case reflect.Float32, reflect.Float64:
		return typed("number", "double")
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return typed("string", "byte")
		}
		items := s.ref(t.Elem())
		out := typed("array", "")
		out.Items = &spec.SchemaOrArray{Schema: &items}
		return out
	case reflect.Map:
		values := s.ref(t.Elem())
		out := typed("object", "")
		out.AdditionalProperties = &spec.SchemaOrBool{Allows: true, Schema: &values}
		return out
	case reflect.Struct:
		out := typed("object", "")
		s.addFields(&out, t)
		return out
	default: // interfaces
		out := typed("object", "")
		out.AddExtension("x-kubernetes-preserve-unknown-fields", true)
		return out
	}
}

// tagKind marks a component as the schema of a served kind, which is how
// kubectl finds the schema of the object it patches or explains.
func (s schemas) tagKind(t reflect.Type, gvk schema.GroupVersionKind) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	s.ref(t)
	c := s[componentName(t)]
	var list []any
	if existing, ok := c.Extensions["x-kubernetes-group-version-kind"].([]any); ok {
		list = existing
	}
	c.AddExtension("x-kubernetes-group-version-kind", append(list, map[string]any{"group": gvk.Group, "version": gvk.Version, "kind": gvk.Kind}))
}

// componentName names a type as Kubernetes' OpenAPI does: the Go package
// path with its domain reversed, then the type ("k8s.io/api/apps/v1" and
// Deployment give "io.k8s.api.apps.v1.Deployment").
func componentName(t reflect.Type) string {
	if t.Name() == "" || t.PkgPath() == "" {
		return ""
	}
	domain, rest, _ := strings.Cut(t.PkgPath(), "/")
	labels := strings.Split(domain, ".")
	for i, j := 0, len(labels)-1; i < j; i, j = i+1, j-1 {
		labels[i], labels[j] = labels[j], labels[i]
	}
	name := strings.Join(labels, ".")
	if rest != "" {
		name += "." + strings.ReplaceAll(rest, "/", ".")
	}
	return name + "." + t.Name()
}

func implements(t, iface reflect.Type) bool {
	return t.Implements(iface) || reflect.PointerTo(t).Implements(iface)
}
