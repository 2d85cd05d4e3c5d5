package customresource

import (
	"context"
	"errors"
	"fmt"
	"github.com/orch-dev/orch/internal/api/admission/webhook"
	openapiv2 "k8s.io/apiextensions-apiserver/pkg/controller/openapi/v2"
	"strconv"
	"strings"
	"time"

	"github.com/orch-dev/orch/internal/api/resources"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/listtype"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/objectmeta"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/apimachinery/pkg/util/managedfields"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/util/jsonpath"
	openapierrors "k8s.io/kube-openapi/pkg/validation/errors"
	"k8s.io/kube-openapi/pkg/validation/spec"
	"k8s.io/kube-openapi/pkg/validation/strfmt"
	"k8s.io/kube-openapi/pkg/validation/validate"
)

// Names are the names a definition's kind is served under: its accepted
// names once accepted.
func Names(crd *apiextensionsv1.CustomResourceDefinition) apiextensionsv1.CustomResourceDefinitionNames {
	if crd.Status.AcceptedNames.Plural != "" {
		return crd.Status.AcceptedNames
	}
	return crd.Spec.Names
}

// Describe returns the resources a definition serves, one per served
// version; services resolves a conversion webhook's Service.
func Describe(crd *apiextensionsv1.CustomResourceDefinition, services webhook.ServiceResolver) ([]*resources.Resource, error) {
	var out []*resources.Resource
	conv := newConverter(crd, services)
	for i := range crd.Spec.Versions {
		v := &crd.Spec.Versions[i]
		if !v.Served {
			continue
		}
		r, err := describeVersion(crd, v)
		if err != nil {
			return nil, fmt.Errorf("%s version %s: %w", crd.Name, v.Name, err)
		}
		if storage := storageVersion(crd); len(crd.Spec.Versions) > 1 || conv.client != nil {
			// Stored in the storage version, read in the one asked for
			// (then defaulted by that version's schema).
			name, read := v.Name, r.FromStorage
			r.ToStorage = func(obj runtime.Object) (runtime.Object, error) { return conv.convert(obj, storage) }
			r.FromStorage = func(obj runtime.Object) (runtime.Object, error) {
				obj, err := conv.convert(obj, name)
				if err != nil {
					return nil, err
				}
				return read(obj)
			}
		}
		out = append(out, r)
	}
	// One converter knows every version: managedFields entries recorded
	// at another version than a write's are converted, not dropped.
	tc := typeConverter(out)
	for _, r := range out {
		r.TypeConverter = tc
		for _, other := range out {
			if other != r && other.FromStorage != nil {
				r.Equivalents = append(r.Equivalents, other)
			}
		}
	}
	return out, nil
}

// storageVersion is the version a definition's objects are stored in.
func storageVersion(crd *apiextensionsv1.CustomResourceDefinition) string {
	for _, v := range crd.Spec.Versions {
		if v.Storage {
			return v.Name
		}
	}
	return crd.Spec.Versions[0].Name
}

// version is one served version of a definition.
type version struct {
	structural *structuralschema.Structural
	validator  *validate.SchemaValidator
	hasStatus  bool
	rules      *rules
}

func describeVersion(crd *apiextensionsv1.CustomResourceDefinition, v *apiextensionsv1.CustomResourceDefinitionVersion) (*resources.Resource, error) {
	if v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
		return nil, fmt.Errorf("no schema")
	}
	s, errs := Structural(v.Schema.OpenAPIV3Schema, field.NewPath("schema", "openAPIV3Schema"))
	if len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	names := Names(crd)
	gvk := schema.GroupVersionKind{Group: crd.Spec.Group, Version: v.Name, Kind: names.Kind}
	openAPI := s.ToKubeOpenAPI()
	ver := &version{structural: s, validator: validate.NewSchemaValidator(openAPI, nil, "", strfmt.Default),
		hasStatus: v.Subresources != nil && v.Subresources.Status != nil, rules: newRules(s)}
	listGVK := gvk.GroupVersion().WithKind(names.ListKind)
	r := &resources.Resource{
		GroupVersionKind: gvk, Plural: names.Plural, Singular: names.Singular,
		Namespaced: crd.Spec.Scope == apiextensionsv1.NamespaceScoped,
		ShortNames: names.ShortNames, Categories: names.Categories,
		StorageKey: crd.Spec.Group + "/" + names.Plural,
		New: func() runtime.Object {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(gvk)
			return u
		},
		NewList: func() runtime.Object {
			l := &unstructured.UnstructuredList{}
			l.SetGroupVersionKind(listGVK)
			return l
		},
		Normalize:     ver.normalize,
		FromStorage:   ver.fromStorage,
		Validate:      ver.validate,
		Generational:  ver.generational,
		OpenAPISchema: withKind(openAPI, gvk),
		// Kubernetes publishes a schema that keeps unknown fields at its
		// root as a bare object in v2: kubectl would refuse what it does not
		// list.
		OpenAPISchemaV2: withKind(&spec.Schema{SchemaProps: spec.SchemaProps{Type: spec.StringOrArray{"object"}}}, gvk),
		Custom:          true,
		Fields:          selectableFields(v.SelectableFields),
	}
	if !s.XPreserveUnknownFields {
		r.OpenAPISchemaV2 = withKind(openapiv2.ToStructuralOpenAPIV2(s).ToKubeOpenAPI(), gvk)
	}
	if ver.rules != nil {
		r.Rules = func(obj, old runtime.Object) field.ErrorList {
			var oldObj map[string]any
			if old != nil {
				oldObj = old.(*unstructured.Unstructured).Object
			}
			return ver.rules.validate(obj.(*unstructured.Unstructured).Object, oldObj)
		}
	}
	if ver.hasStatus {
		r.Subresources = append(r.Subresources, resources.Status())
		r.PrepareForCreate = func(obj runtime.Object) {
			// Status is written through its subresource only.
			unstructured.RemoveNestedField(obj.(*unstructured.Unstructured).Object, "status")
		}
	}
	if v.Subresources != nil && v.Subresources.Scale != nil {
		r.Subresources = append(r.Subresources, resources.ScaleOf(scaleAccess(v.Subresources.Scale)))
	}
	r.Columns, r.Row = table(v.AdditionalPrinterColumns)
	return r, nil
}

// withKind is a version's schema marked as its kind's, as the OpenAPI
// documents and the field manager look kinds up.
func withKind(s *spec.Schema, gvk schema.GroupVersionKind) *spec.Schema {
	out := *s
	out.Extensions = spec.Extensions{}
	for k, v := range s.Extensions {
		out.Extensions[k] = v
	}
	out.AddExtension("x-kubernetes-group-version-kind", []any{map[string]any{"group": gvk.Group, "version": gvk.Version, "kind": gvk.Kind}})
	return &out
}

// typeConverter lets server-side apply merge the kind by its versions'
// schemas (their list types and map keys; each marked with its kind), or
// as deduced JSON should a schema not convert.
func typeConverter(versions []*resources.Resource) managedfields.TypeConverter {
	schemas := map[string]*spec.Schema{}
	for _, r := range versions {
		gvk := r.GroupVersionKind
		full := *r.OpenAPISchema
		// Every object also has apiVersion, kind and metadata, which a
		// definition's schema leaves out; metadata merges as JSON (labels
		// and annotations key by key).
		full.Properties = map[string]spec.Schema{}
		for k, v := range r.OpenAPISchema.Properties {
			full.Properties[k] = v
		}
		str := spec.Schema{SchemaProps: spec.SchemaProps{Type: spec.StringOrArray{"string"}}}
		metadata := spec.Schema{SchemaProps: spec.SchemaProps{Type: spec.StringOrArray{"object"}}}
		metadata.AddExtension("x-kubernetes-preserve-unknown-fields", true)
		full.Properties["apiVersion"], full.Properties["kind"], full.Properties["metadata"] = str, str, metadata
		schemas[strings.Join([]string{gvk.Group, gvk.Version, gvk.Kind}, ".")] = &full
	}
	tc, err := managedfields.NewTypeConverter(schemas, false)
	if err != nil {
		return managedfields.NewDeducedTypeConverter()
	}
	return tc
}

// fromStorage applies the schema's defaults to an object read from
// the store, as Kubernetes defaults custom resources on read: a default
// added to the schema shows on objects written before it.
func (v *version) fromStorage(obj runtime.Object) (runtime.Object, error) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		applyDefaults(u.Object, v.structural)
	}
	return obj, nil
}

// normalize prunes what the schema does not know, coerces metadata and
// applies the schema's defaults, as Kubernetes does when it decodes a
// custom resource. It returns the paths of the fields it dropped.
func (v *version) normalize(obj runtime.Object) []string {
	u := obj.(*unstructured.Unstructured)
	unknown := pruning.PruneWithOptions(u.Object, v.structural, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true})
	_, metaUnknown := objectmeta.CoerceWithOptions(nil, u.Object, v.structural, true, objectmeta.CoerceOptions{DropInvalidFields: true, ReturnUnknownFieldPaths: true})
	applyDefaults(u.Object, v.structural)
	return append(unknown, metaUnknown...)
}

// applyDefaults sets every default of s missing from x, deep in objects,
// arrays and maps: a field absent, or null where the schema does not allow
// null, takes a copy of its default; a null property the schema does not
// allow and gives no default is dropped.
func applyDefaults(x any, s *structuralschema.Structural) {
	if s == nil {
		return
	}
	nullNotAllowed := func(value any, s *structuralschema.Structural) bool {
		return value == nil && s != nil && !s.Nullable
	}
	switch x := x.(type) {
	case map[string]any:
		for name, prop := range s.Properties {
			if prop.Default.Object == nil {
				continue
			}
			if value, ok := x[name]; !ok || nullNotAllowed(value, &prop) {
				x[name] = runtime.DeepCopyJSONValue(prop.Default.Object)
			}
		}
		for name, value := range x {
			if prop, ok := s.Properties[name]; ok {
				// A null where the schema allows none, and that no
				// default replaced, is dropped, as Kubernetes prunes it.
				if nullNotAllowed(value, &prop) {
					delete(x, name)
					continue
				}
				applyDefaults(value, &prop)
				continue
			}
			if s.AdditionalProperties != nil && s.AdditionalProperties.Structural != nil {
				values := s.AdditionalProperties.Structural
				if nullNotAllowed(value, values) && values.Default.Object != nil {
					x[name] = runtime.DeepCopyJSONValue(values.Default.Object)
				}
				applyDefaults(x[name], values)
			}
		}
	case []any:
		for i := range x {
			if nullNotAllowed(x[i], s.Items) && s.Items.Default.Object != nil {
				x[i] = runtime.DeepCopyJSONValue(s.Items.Default.Object)
			}
			applyDefaults(x[i], s.Items)
		}
	}
}

// validate checks a custom resource against its schema, as Kubernetes
// does, with its field paths: values, list sets and maps, and the
// metadata of embedded objects.
func (v *version) validate(obj runtime.Object) field.ErrorList {
	u := obj.(*unstructured.Unstructured)
	var errs field.ErrorList
	result := v.validator.Validate(u.Object)
	for _, err := range result.Errors {
		errs = append(errs, openAPIError(err))
	}
	errs = append(errs, listtype.ValidateListSetsAndMaps(nil, v.structural, u.Object)...)
	// The root's metadata is checked as every object's is (resources.ValidateMeta).
	errs = append(errs, objectmeta.Validate(context.Background(), nil, u.Object, v.structural, false)...)
	return errs
}

// generational: metadata.generation counts changes of anything but
// metadata, and but status when status is a subresource, as in Kubernetes.
func (v *version) generational(obj, old runtime.Object) bool {
	a, b := obj.(*unstructured.Unstructured).Object, old.(*unstructured.Unstructured).Object
	counted := func(field string) bool { return field != "metadata" && (field != "status" || !v.hasStatus) }
	for field, value := range a {
		if other, ok := b[field]; counted(field) && (!ok || !equality.Semantic.DeepEqual(value, other)) {
			return true
		}
	}
	for field := range b {
		if _, ok := a[field]; counted(field) && !ok {
			return true
		}
	}
	return false
}

// scaleAccess reads and writes replicas at the definition's paths.
func scaleAccess(sc *apiextensionsv1.CustomResourceSubresourceScale) resources.ScaleAccess {
	path := func(p string) []string { return strings.Split(strings.TrimPrefix(p, "."), ".") }
	return resources.ScaleAccess{
		Get: func(obj runtime.Object) (*int32, int32, *metav1.LabelSelector) {
			content := obj.(*unstructured.Unstructured).Object
			var desired *int32
			if n, ok, _ := unstructured.NestedInt64(content, path(sc.SpecReplicasPath)...); ok {
				d := int32(n)
				desired = &d
			}
			current, _, _ := unstructured.NestedInt64(content, path(sc.StatusReplicasPath)...)
			var sel *metav1.LabelSelector
			if sc.LabelSelectorPath != nil {
				if s, ok, _ := unstructured.NestedString(content, path(*sc.LabelSelectorPath)...); ok {
					if parsed, err := metav1.ParseToLabelSelector(s); err == nil {
						sel = parsed
					}
				}
			}
			return desired, int32(current), sel
		},
		Set: func(obj runtime.Object, replicas int32) {
			_ = unstructured.SetNestedField(obj.(*unstructured.Unstructured).Object, int64(replicas), path(sc.SpecReplicasPath)...)
		},
	}
}

// table is the definition's printer columns after the name; without any,
// an Age column, as Kubernetes prints custom resources.
func table(cols []apiextensionsv1.CustomResourceColumnDefinition) ([]metav1.TableColumnDefinition, func(runtime.Object) []any) {
	if len(cols) == 0 {
		cols = []apiextensionsv1.CustomResourceColumnDefinition{{Name: "Age", Type: "date", JSONPath: ".metadata.creationTimestamp"}}
	}
	defs := []metav1.TableColumnDefinition{resources.NameCol}
	paths := make([]*jsonpath.JSONPath, len(cols))
	for i, c := range cols {
		defs = append(defs, metav1.TableColumnDefinition{Name: c.Name, Type: c.Type, Format: c.Format, Description: c.Description, Priority: c.Priority})
		p := jsonpath.New(c.Name).AllowMissingKeys(true)
		if err := p.Parse(ColumnTemplate(c.JSONPath)); err == nil {
			paths[i] = p
		}
	}
	row := func(obj runtime.Object) []any {
		u, _ := obj.(*unstructured.Unstructured)
		cells := []any{""}
		if u != nil {
			cells[0] = u.GetName()
		}
		for i, c := range cols {
			cells = append(cells, cell(u, paths[i], c.Type))
		}
		return cells
	}
	return defs, row
}

// cell is one printer column's value: nil when missing, a date as the
// time since it, a string as it is, anything else as JSON gives it.
func cell(u *unstructured.Unstructured, p *jsonpath.JSONPath, typ string) any {
	if u == nil || p == nil {
		return nil
	}
	results, err := p.FindResults(u.Object)
	if err != nil || len(results) == 0 || len(results[0]) == 0 {
		return nil
	}
	value := results[0][0].Interface()
	if typ == "date" {
		if s, ok := value.(string); ok {
			if t, err := time.Parse(time.RFC3339, s); err == nil {
				return duration.HumanDuration(time.Since(t))
			}
		}
	}
	return value
}

// openAPIError is a schema validator's error as a field error, with the
// path and kind of error Kubernetes gives for it.
func openAPIError(err error) *field.Error {
	var verr *openapierrors.Validation
	if !errors.As(err, &verr) {
		return field.Invalid(nil, "", err.Error())
	}
	var path *field.Path
	if name := strings.TrimPrefix(verr.Name, "."); name != "" {
		path = field.NewPath(name)
	}
	value := verr.Value
	if value == nil {
		value = ""
	}
	switch verr.Code() {
	case openapierrors.RequiredFailCode:
		return field.Required(path, "")
	case openapierrors.EnumFailCode:
		var allowed []string
		for _, v := range verr.Values {
			allowed = append(allowed, fmt.Sprint(v))
		}
		return field.NotSupported(path, value, allowed)
	case openapierrors.InvalidTypeCode:
		return field.TypeInvalid(path, value, verr.Error())
	}
	return field.Invalid(path, value, verr.Error())
}

// selectableFields are the fields a version's objects may be selected by
// in field selectors (spec.versions[].selectableFields), named by their
// JSONPath without its leading dot, their values as field selectors
// compare them: a string, a boolean or an integer as written; absent,
// empty.
func selectableFields(list []apiextensionsv1.SelectableField) func(runtime.Object) fields.Set {
	if len(list) == 0 {
		return nil
	}
	paths := map[string][]string{}
	for _, f := range list {
		name := strings.TrimPrefix(f.JSONPath, ".")
		paths[name] = strings.Split(name, ".")
	}
	return func(obj runtime.Object) fields.Set {
		set := fields.Set{}
		u, _ := obj.(*unstructured.Unstructured)
		for name, path := range paths {
			set[name] = ""
			if u == nil {
				continue
			}
			switch v, _, _ := unstructured.NestedFieldNoCopy(u.Object, path...); v := v.(type) {
			case string:
				set[name] = v
			case bool:
				set[name] = strconv.FormatBool(v)
			case int64:
				set[name] = strconv.FormatInt(v, 10)
			case float64:
				set[name] = strconv.FormatFloat(v, 'f', -1, 64)
			}
		}
		return set
	}
}
