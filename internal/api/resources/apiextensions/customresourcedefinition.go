// Package apiextensions describes the kind of the apiextensions.k8s.io
// API group: the CustomResourceDefinitions that add kinds to the API.
package apiextensions

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/orch-dev/orch/internal/api/customresource"
	"github.com/orch-dev/orch/internal/api/resources"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/util/jsonpath"
)

// Resources describes the apiextensions.k8s.io group's kinds.
func Resources() []*resources.Resource {
	return []*resources.Resource{customResourceDefinitions()}
}

// CleanupFinalizer holds a definition being deleted until its custom
// resources are gone, as in Kubernetes.
const CleanupFinalizer = "customresourcecleanup.apiextensions.k8s.io"

// builtinGroups are served by orch itself: a definition may not add kinds
// to them (Kubernetes protects its groups the same way).
var builtinGroups = sets.New("", "apps", "batch", "coordination.k8s.io", "discovery.k8s.io", "events.k8s.io",
	"rbac.authorization.k8s.io", "storage.k8s.io", "apiextensions.k8s.io", "authentication.k8s.io",
	"authorization.k8s.io", "autoscaling", "admissionregistration.k8s.io", "metrics.k8s.io")

func customResourceDefinitions() *resources.Resource {
	return resources.Described[apiextensionsv1.CustomResourceDefinition, apiextensionsv1.CustomResourceDefinitionList](&resources.Resource{
		GroupVersionKind: resources.GVK(apiextensionsv1.GroupName, "CustomResourceDefinition"), Plural: "customresourcedefinitions", Singular: "customresourcedefinition",
		ShortNames: []string{"crd", "crds"}, Categories: []string{"api-extensions"},
		StorageKey: "apiextensions.k8s.io/customresourcedefinitions", HasSpec: true,
		Subresources: []resources.Subresource{resources.Status()},
		PrepareForCreate: resources.Typed(func(crd *apiextensionsv1.CustomResourceDefinition) {
			crd.Status = apiextensionsv1.CustomResourceDefinitionStatus{}
			if !sets.New(crd.Finalizers...).Has(CleanupFinalizer) {
				crd.Finalizers = append(crd.Finalizers, CleanupFinalizer)
			}
		}),
		Default:  resources.Typed(defaultCRD),
		Validate: resources.TypedValidate(validateCRD),
		ValidateUpdate: resources.TypedValidateUpdate(func(crd, old *apiextensionsv1.CustomResourceDefinition) field.ErrorList {
			spec := field.NewPath("spec")
			errs := resources.Immutable(crd.Spec.Group, old.Spec.Group, spec.Child("group"))
			errs = append(errs, resources.Immutable(crd.Spec.Scope, old.Spec.Scope, spec.Child("scope"))...)
			return append(errs, resources.Immutable(crd.Spec.Names.Plural, old.Spec.Names.Plural, spec.Child("names", "plural"))...)
		}),
	})
}

func defaultCRD(crd *apiextensionsv1.CustomResourceDefinition) {
	if crd.Spec.Names.ListKind == "" && crd.Spec.Names.Kind != "" {
		crd.Spec.Names.ListKind = crd.Spec.Names.Kind + "List"
	}
	if crd.Spec.Names.Singular == "" {
		crd.Spec.Names.Singular = strings.ToLower(crd.Spec.Names.Kind)
	}
	if crd.Spec.Conversion == nil {
		crd.Spec.Conversion = &apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.NoneConverter}
	}
}

// printerColumnTypes are the types a printer column may have.
var printerColumnTypes = sets.New("integer", "number", "string", "boolean", "date")

// validateCRD is Kubernetes' validation of a definition, in its words,
// less what needs CEL: schemas must be structural, the names well formed,
// one version stored.
func validateCRD(crd *apiextensionsv1.CustomResourceDefinition) field.ErrorList {
	var errs field.ErrorList
	spec := field.NewPath("spec")
	names := spec.Child("names")
	if want := crd.Spec.Names.Plural + "." + crd.Spec.Group; crd.Name != want {
		errs = append(errs, field.Invalid(field.NewPath("metadata", "name"), crd.Name, `must be spec.names.plural+"."+spec.group`))
	}
	switch group := crd.Spec.Group; {
	case group == "":
		errs = append(errs, field.Required(spec.Child("group"), ""))
	case len(validation.IsDNS1123Subdomain(group)) > 0:
		for _, msg := range validation.IsDNS1123Subdomain(group) {
			errs = append(errs, field.Invalid(spec.Child("group"), group, msg))
		}
	case len(strings.Split(group, ".")) < 2:
		errs = append(errs, field.Invalid(spec.Child("group"), group, "should be a domain with at least one dot"))
	case builtinGroups.Has(group) || strings.HasSuffix(group, ".k8s.io") && !strings.HasSuffix(group, ".x-k8s.io") && crd.Annotations["api-approved.kubernetes.io"] == "":
		errs = append(errs, field.Invalid(spec.Child("group"), group, "is one of Kubernetes' own groups, which a CustomResourceDefinition may not extend here"))
	}
	label := func(path *field.Path, value string) {
		if value == "" {
			errs = append(errs, field.Required(path, ""))
			return
		}
		for _, msg := range validation.IsDNS1035Label(value) {
			errs = append(errs, field.Invalid(path, value, msg))
		}
	}
	label(names.Child("plural"), crd.Spec.Names.Plural)
	label(names.Child("singular"), crd.Spec.Names.Singular)
	label(names.Child("kind"), strings.ToLower(crd.Spec.Names.Kind))
	label(names.Child("listKind"), strings.ToLower(crd.Spec.Names.ListKind))
	if crd.Spec.Names.Kind != "" && crd.Spec.Names.Kind == crd.Spec.Names.ListKind {
		errs = append(errs, field.Invalid(names.Child("listKind"), crd.Spec.Names.ListKind, "kind and listKind may not be the same"))
	}
	for i, s := range crd.Spec.Names.ShortNames {
		label(names.Child("shortNames").Index(i), s)
	}
	for i, c := range crd.Spec.Names.Categories {
		label(names.Child("categories").Index(i), c)
	}
	switch crd.Spec.Scope {
	case apiextensionsv1.NamespaceScoped, apiextensionsv1.ClusterScoped:
	case "":
		errs = append(errs, field.Required(spec.Child("scope"), ""))
	default:
		errs = append(errs, field.NotSupported(spec.Child("scope"), crd.Spec.Scope, []string{string(apiextensionsv1.ClusterScoped), string(apiextensionsv1.NamespaceScoped)}))
	}
	if crd.Spec.PreserveUnknownFields {
		errs = append(errs, field.Invalid(spec.Child("preserveUnknownFields"), true, "must be false in order to use defaults in the schema"))
	}
	errs = append(errs, validateConversion(crd.Spec.Conversion, spec.Child("conversion"))...)
	errs = append(errs, validateVersions(crd.Spec.Versions, spec.Child("versions"))...)
	return errs
}

func validateVersions(versions []apiextensionsv1.CustomResourceDefinitionVersion, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if len(versions) == 0 {
		return field.ErrorList{field.Invalid(path, versions, "must have exactly one version marked as storage version")}
	}
	seen := sets.New[string]()
	storage := 0
	for i, v := range versions {
		vp := path.Index(i)
		for _, msg := range validation.IsDNS1035Label(v.Name) {
			errs = append(errs, field.Invalid(vp.Child("name"), v.Name, msg))
		}
		if seen.Has(v.Name) {
			errs = append(errs, field.Duplicate(vp.Child("name"), v.Name))
		}
		seen.Insert(v.Name)
		if v.Storage {
			storage++
		}
		schemaPath := vp.Child("schema", "openAPIV3Schema")
		if v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
			errs = append(errs, field.Required(schemaPath, "schemas are required"))
		} else {
			if t := v.Schema.OpenAPIV3Schema.Type; t != "object" {
				errs = append(errs, field.Invalid(schemaPath.Child("type"), t, "must be object at the root"))
			}
			structural, serrs := customresource.Structural(v.Schema.OpenAPIV3Schema, schemaPath)
			if len(serrs) == 0 {
				serrs = validateRulesOnce(v.Schema.OpenAPIV3Schema, structural, schemaPath)
			}
			errs = append(errs, serrs...)
		}
		if sub := v.Subresources; sub != nil && sub.Scale != nil {
			sp := vp.Child("subresources", "scale")
			if !strings.HasPrefix(sub.Scale.SpecReplicasPath, ".spec.") {
				errs = append(errs, field.Invalid(sp.Child("specReplicasPath"), sub.Scale.SpecReplicasPath, "should be a json path under .spec"))
			}
			if !strings.HasPrefix(sub.Scale.StatusReplicasPath, ".status.") {
				errs = append(errs, field.Invalid(sp.Child("statusReplicasPath"), sub.Scale.StatusReplicasPath, "should be a json path under .status"))
			}
			if p := sub.Scale.LabelSelectorPath; p != nil && !strings.HasPrefix(*p, ".spec.") && !strings.HasPrefix(*p, ".status.") {
				errs = append(errs, field.Invalid(sp.Child("labelSelectorPath"), *p, "should be a json path under either .spec or .status"))
			}
		}
		for j, col := range v.AdditionalPrinterColumns {
			cp := vp.Child("additionalPrinterColumns").Index(j)
			if col.Name == "" {
				errs = append(errs, field.Required(cp.Child("name"), ""))
			}
			if !printerColumnTypes.Has(col.Type) {
				errs = append(errs, field.NotSupported(cp.Child("type"), col.Type, sets.List(printerColumnTypes)))
			}
			if col.JSONPath == "" {
				errs = append(errs, field.Required(cp.Child("jsonPath"), ""))
			} else if err := jsonpath.New(col.Name).Parse(customresource.ColumnTemplate(col.JSONPath)); err != nil {
				errs = append(errs, field.Invalid(cp.Child("jsonPath"), col.JSONPath, fmt.Sprintf("must be a simple json path: %v", err)))
			}
		}
	}
	if storage != 1 {
		errs = append(errs, field.Invalid(path, versions, "must have exactly one version marked as storage version"))
	}
	return errs
}

// validateConversion is Kubernetes' check of a definition's conversion: None,
// or Webhook with a webhook to call (a URL or a Service) that speaks a
// ConversionReview version the server does.
func validateConversion(c *apiextensionsv1.CustomResourceConversion, p *field.Path) field.ErrorList {
	if c == nil {
		return nil
	}
	var errs field.ErrorList
	switch c.Strategy {
	case apiextensionsv1.NoneConverter:
		if c.Webhook != nil {
			errs = append(errs, field.Forbidden(p.Child("webhook"), "should not be set when strategy is not set to Webhook"))
		}
	case apiextensionsv1.WebhookConverter:
		wp := p.Child("webhook")
		if c.Webhook == nil {
			return append(errs, field.Required(wp, "required when strategy is set to Webhook"))
		}
		if c.Webhook.ClientConfig == nil {
			errs = append(errs, field.Required(wp.Child("clientConfig"), "required when strategy is set to Webhook"))
		} else {
			cc := c.Webhook.ClientConfig
			switch {
			case cc.URL == nil && cc.Service == nil, cc.URL != nil && cc.Service != nil:
				errs = append(errs, field.Required(wp.Child("clientConfig"), "exactly one of url or service is required"))
			case cc.URL != nil:
				if u, err := url.Parse(*cc.URL); err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
					errs = append(errs, field.Invalid(wp.Child("clientConfig", "url"), *cc.URL, "must be an https URL with a host and no user, query or fragment"))
				}
			default:
				if cc.Service.Name == "" {
					errs = append(errs, field.Required(wp.Child("clientConfig", "service", "name"), "service name is required"))
				}
				if cc.Service.Namespace == "" {
					errs = append(errs, field.Required(wp.Child("clientConfig", "service", "namespace"), "service namespace is required"))
				}
				if path := cc.Service.Path; path != nil && *path != "" && !strings.HasPrefix(*path, "/") {
					errs = append(errs, field.Invalid(wp.Child("clientConfig", "service", "path"), *path, "must start with a '/'"))
				}
			}
		}
		known := false
		for _, v := range c.Webhook.ConversionReviewVersions {
			known = known || v == "v1" || v == "v1beta1"
		}
		if !known {
			errs = append(errs, field.Invalid(wp.Child("conversionReviewVersions"), c.Webhook.ConversionReviewVersions, "must include at least one of v1, v1beta1"))
		}
	default:
		errs = append(errs, field.NotSupported(p.Child("strategy"), c.Strategy, []string{string(apiextensionsv1.NoneConverter), string(apiextensionsv1.WebhookConverter)}))
	}
	return errs
}
