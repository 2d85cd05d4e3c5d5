package apiextensions

import (
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

func widgetCRD(rule string) *apiextensionsv1.CustomResourceDefinition {
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "widgets.example.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "example.com", Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "widgets", Singular: "widget", Kind: "Widget", ListKind: "WidgetList"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{"spec": {
						Type:         "object",
						Properties:   map[string]apiextensionsv1.JSONSchemaProps{"size": {Type: "integer"}},
						XValidations: apiextensionsv1.ValidationRules{{Rule: rule}},
					}},
				}}}},
		},
	}
}

// A definition's rules are compiled when its schema is new; a write that
// leaves the schema as it was (its status, a finalizer, the server
// writing its own definitions again at start) does not compile them
// again, and a schema with a bad rule is refused every time.
func TestRulesCompiledOncePerSchema(t *testing.T) {
	compiles := 0
	validateRules = func(s *structuralschema.Structural, p *field.Path) field.ErrorList {
		compiles++
		return defaultValidateRules(s, p)
	}
	t.Cleanup(func() { validateRules = defaultValidateRules })
	for i, tc := range []struct {
		rule         string
		wantCompiles int
		wantErrors   bool
	}{
		{"self.size >= 0", 1, false},
		{"self.size >= 0", 1, false}, // the same schema again
		{"self.size < 100", 2, false},
		{"self.size >= 0", 2, false},
		{"self.nosuchfield > 1", 3, true},
		{"self.nosuchfield > 1", 4, true}, // refused again, compiled again
	} {
		errs := validateCRD(widgetCRD(tc.rule))
		if (len(errs) > 0) != tc.wantErrors {
			t.Errorf("write %d (%q): errors %v, want errors %v", i, tc.rule, errs, tc.wantErrors)
		}
		if compiles != tc.wantCompiles {
			t.Errorf("write %d (%q): %d compilations so far, want %d", i, tc.rule, compiles, tc.wantCompiles)
		}
	}
}
