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
// schema, pruning, list-type, object-meta and CEL packages (the schema's
// x-kubernetes-validations rules, with k8s.io/apiserver's CEL libraries),
// and kube-openapi's validator over the schema they give.
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

// ColumnTemplate makes a printer column's JSON path a jsonpath template.
func ColumnTemplate(path string) string { return "{" + path + "}" }
