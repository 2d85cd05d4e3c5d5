// Package customresource serves the kinds CustomResourceDefinitions
// define: each served version of a definition becomes a resource
// description (resources.Resource) over unstructured objects, checked
// against the version's structural schema as Kubernetes checks custom
// resources: unknown fields pruned (and reported as fieldValidation asks),
// defaults applied, types, formats, enums, patterns, bounds and required
// fields validated, list types and embedded objects' metadata checked,
// with status and scale subresources and the definition's printer columns.
//
// The schema work is k8s.io/apiextensions-apiserver's: its structural
// schema, pruning, list-type and object-meta packages, and kube-openapi's
// validator over the schema they give. Its validation and defaulting
// packages are not linked: they carry CEL, which alone would put the
// binary 4.5 MB over its budget.
package customresource

import (
	"fmt"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Structural converts a version's schema to its structural form, or says
// why it is not structural, with field paths under path.
func Structural(schema *apiextensionsv1.JSONSchemaProps, path *field.Path) (*structuralschema.Structural, field.ErrorList) {
	var internal apiextensions.JSONSchemaProps
	if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(schema, &internal, nil); err != nil {
		return nil, field.ErrorList{field.Invalid(path, "", fmt.Sprintf("the schema does not convert: %v", err))}
	}
	s, err := structuralschema.NewStructural(&internal)
	if err != nil {
		return nil, field.ErrorList{field.Invalid(path, "", err.Error())}
	}
	if errs := structuralschema.ValidateStructural(path, s); len(errs) > 0 {
		return nil, errs
	}
	return s, nil
}

// HasRules reports whether a schema holds x-kubernetes-validations (CEL
// rules), which orch does not evaluate.
func HasRules(s *apiextensionsv1.JSONSchemaProps) bool {
	if s == nil {
		return false
	}
	if len(s.XValidations) > 0 {
		return true
	}
	for _, p := range s.Properties {
		if HasRules(&p) {
			return true
		}
	}
	if s.Items != nil && (HasRules(s.Items.Schema) || anyHasRules(s.Items.JSONSchemas)) {
		return true
	}
	if s.AdditionalProperties != nil && HasRules(s.AdditionalProperties.Schema) {
		return true
	}
	return anyHasRules(s.AllOf) || anyHasRules(s.AnyOf) || anyHasRules(s.OneOf) || HasRules(s.Not)
}

func anyHasRules(list []apiextensionsv1.JSONSchemaProps) bool {
	for i := range list {
		if HasRules(&list[i]) {
			return true
		}
	}
	return false
}

// ColumnTemplate makes a printer column's JSON path a jsonpath template.
func ColumnTemplate(path string) string { return "{" + path + "}" }
