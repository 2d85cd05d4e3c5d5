// Package apply holds what server-side apply needs: the field managers that
// keep every object's metadata.managedFields and merge apply
// configurations (apimachinery's managedfields), the type schema they merge
// with (client-go's, which carries Kubernetes' list types and map keys),
// and the names managers go by.
package apply

import (
	_ "embed"
	"fmt"
	"github.com/orch-dev/orch/internal/api/resources/autoscaling"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	"k8s.io/apimachinery/pkg/conversion"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/orch-dev/orch/internal/apis"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/managedfields"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
	smdschema "sigs.k8s.io/structured-merge-diff/v6/schema"
	"sigs.k8s.io/structured-merge-diff/v6/typed"
)

//go:generate go run ./gen

// schemaYAML is client-go's apply schema of the kinds orch serves (see
// ./gen).
//
//go:embed schema.yaml
var schemaYAML string

// builtin is the scheme of the served kinds and the type converter built on
// it, made on first use.
var builtin = sync.OnceValues(func() (*runtime.Scheme, managedfields.TypeConverter) {
	s := apis.NewScheme()
	// A kind served at two versions converts between them, so that the
	// managedFields written through one are kept through the other.
	utilruntime.Must(s.AddConversionFunc((*autoscalingv1.HorizontalPodAutoscaler)(nil), (*autoscalingv2.HorizontalPodAutoscaler)(nil), func(a, b any, _ conversion.Scope) error {
		out, err := autoscaling.ToV2(a.(*autoscalingv1.HorizontalPodAutoscaler))
		if err == nil {
			*b.(*autoscalingv2.HorizontalPodAutoscaler) = *out
		}
		return err
	}))
	utilruntime.Must(s.AddConversionFunc((*autoscalingv2.HorizontalPodAutoscaler)(nil), (*autoscalingv1.HorizontalPodAutoscaler)(nil), func(a, b any, _ conversion.Scope) error {
		out, err := autoscaling.ToV1(a.(*autoscalingv2.HorizontalPodAutoscaler))
		if err == nil {
			*b.(*autoscalingv1.HorizontalPodAutoscaler) = *out
		}
		return err
	}))
	return s, managedfields.NewSchemeTypeConverter(s, parser())
})

// Builtin returns the scheme of the served built-in kinds and the type
// converter server-side apply merges them with (what mutating admission
// policies' apply configurations merge with too).
func Builtin() (*runtime.Scheme, managedfields.TypeConverter) { return builtin() }

var parser = sync.OnceValue(func() *typed.Parser {
	p, err := typed.NewParser(typed.YAMLObject(schemaYAML))
	if err != nil {
		panic(fmt.Sprintf("the embedded apply schema does not parse: %v", err)) // caught by every test of the package
	}
	return p
})

// FieldExtensions are the OpenAPI extensions that tell clients how server-
// side apply merges field of the named type ("io.k8s.api.core.v1.PodSpec"):
// x-kubernetes-list-type (atomic, set or map) and
// x-kubernetes-list-map-keys for lists, x-kubernetes-map-type atomic for
// maps and structs replaced whole, as Kubernetes publishes them.
func FieldExtensions(typeName, field string) map[string]any {
	s := &parser().Schema
	def, ok := s.FindNamedType(typeName)
	if !ok || def.Map == nil {
		return nil
	}
	f, ok := def.FindField(field)
	if !ok {
		return nil
	}
	atom, ok := s.Resolve(f.Type)
	if !ok {
		return nil
	}
	switch {
	case atom.List != nil:
		switch {
		case atom.List.ElementRelationship == smdschema.Associative && len(atom.Keys) > 0:
			keys := make([]any, len(atom.Keys))
			for i, k := range atom.Keys {
				keys[i] = k
			}
			return map[string]any{"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": keys}
		case atom.List.ElementRelationship == smdschema.Associative:
			return map[string]any{"x-kubernetes-list-type": "set"}
		default:
			return map[string]any{"x-kubernetes-list-type": "atomic"}
		}
	case atom.Map != nil && atom.Map.ElementRelationship == smdschema.Atomic && f.Type.NamedType == nil:
		// An atomic named struct says so on its own schema (TypeExtensions).
		return map[string]any{"x-kubernetes-map-type": "atomic"}
	}
	return nil
}

// TypeExtensions are the OpenAPI extensions of the named type itself:
// x-kubernetes-map-type atomic for a struct that server-side apply
// replaces whole (a LabelSelector, an ObjectReference).
func TypeExtensions(typeName string) map[string]any {
	def, ok := parser().Schema.FindNamedType(typeName)
	if !ok || def.Map == nil || def.Map.ElementRelationship != smdschema.Atomic {
		return nil
	}
	return map[string]any{"x-kubernetes-map-type": "atomic"}
}

// Managers are one kind's field managers, one for the main resource and
// one per subresource written through (status, scale), as Kubernetes keeps
// them per request scope.
type Managers struct {
	kind schema.GroupVersionKind
	// hasStatus: writes to the main resource do not change status, and
	// writes to status change nothing else, so neither owns the other's
	// fields.
	hasStatus bool
	// custom is a custom resource's type converter (nil for built-ins).
	custom managedfields.TypeConverter

	mu            sync.Mutex
	bySubresource map[string]*managedfields.FieldManager
}

// NewManagers returns the field managers of a built-in kind.
func NewManagers(kind schema.GroupVersionKind, hasStatus bool) *Managers {
	return &Managers{kind: kind, hasStatus: hasStatus, bySubresource: map[string]*managedfields.FieldManager{}}
}

// NewCustomManagers returns the field managers of a custom resource's
// kind, merged by its own schema's type converter.
func NewCustomManagers(kind schema.GroupVersionKind, hasStatus bool, tc managedfields.TypeConverter) *Managers {
	return &Managers{kind: kind, hasStatus: hasStatus, custom: tc, bySubresource: map[string]*managedfields.FieldManager{}}
}

// For returns the field manager of writes to subresource ("" for the
// main resource).
func (m *Managers) For(subresource string) (*managedfields.FieldManager, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if fm, ok := m.bySubresource[subresource]; ok {
		return fm, nil
	}
	var fm *managedfields.FieldManager
	var err error
	if m.custom != nil {
		fm, err = managedfields.NewDefaultCRDFieldManager(m.custom, unstructuredVersion{}, unstructuredVersion{}, unstructuredVersion{}, m.kind, m.kind.GroupVersion(), subresource, m.resetFields(subresource))
	} else {
		s, tc := builtin()
		fm, err = managedfields.NewDefaultFieldManager(tc, sameVersion{s}, s, s, m.kind, m.kind.GroupVersion(), subresource, m.resetFields(subresource))
	}
	if err != nil {
		return nil, fmt.Errorf("field manager of %s: %w", m.kind, err)
	}
	m.bySubresource[subresource] = fm
	return fm, nil
}

// resetFields are the fields a write through subresource leaves as they
// were, which it must therefore not own: Kubernetes' strategies' reset
// fields, in orch's one rule for every kind with a status subresource.
func (m *Managers) resetFields(subresource string) map[fieldpath.APIVersion]fieldpath.Filter {
	if !m.hasStatus {
		return nil
	}
	var reset *fieldpath.Set
	switch subresource {
	case "":
		reset = fieldpath.NewSet(fieldpath.MakePathOrDie("status"))
	case "status":
		reset = fieldpath.NewSet(fieldpath.MakePathOrDie("spec"), fieldpath.MakePathOrDie("metadata"))
	default:
		return nil
	}
	return map[fieldpath.APIVersion]fieldpath.Filter{
		fieldpath.APIVersion(m.kind.GroupVersion().String()): fieldpath.NewExcludeSetFilter(reset),
	}
}

// sameVersion converts between the one version orch serves of each kind
// and itself: an apply configuration (unstructured) becomes the typed
// object, a typed object stays as it is, uncopied.
type sameVersion struct{ *runtime.Scheme }

func (c sameVersion) ConvertToVersion(in runtime.Object, gv runtime.GroupVersioner) (runtime.Object, error) {
	return c.UnsafeConvertToVersion(in, gv)
}

// unstructuredVersion converts, creates and defaults custom resources for
// the field manager: every version of a kind holds the same fields
// (conversion None), so a conversion only names the version.
type unstructuredVersion struct{}

func (unstructuredVersion) ConvertToVersion(in runtime.Object, gv runtime.GroupVersioner) (runtime.Object, error) {
	u, ok := in.(*unstructured.Unstructured)
	if !ok {
		return nil, fmt.Errorf("a custom resource must be unstructured, not %T", in)
	}
	target, ok := gv.KindForGroupVersionKinds([]schema.GroupVersionKind{u.GroupVersionKind()})
	if !ok {
		return nil, fmt.Errorf("%s is not in %v", u.GroupVersionKind(), gv)
	}
	out := u.DeepCopy()
	out.SetGroupVersionKind(target)
	return out, nil
}

func (unstructuredVersion) Convert(in, out, context any) error {
	return fmt.Errorf("custom resources convert by version only")
}

func (unstructuredVersion) ConvertFieldLabel(gvk schema.GroupVersionKind, label, value string) (string, string, error) {
	return label, value, nil
}

func (unstructuredVersion) New(kind schema.GroupVersionKind) (runtime.Object, error) {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(kind)
	return u, nil
}

func (unstructuredVersion) Default(runtime.Object) {}

// DefaultManager names the writes the server makes itself (its bootstrap
// objects, quota status), as kube-apiserver's own writes are named.
const DefaultManager = "orch"

// ManagerName is the name a write is recorded under: the request's
// fieldManager, or else its User-Agent up to the first "/" (printable
// characters only, at most 128 bytes), as Kubernetes does.
func ManagerName(fieldManager, userAgent string) string {
	if fieldManager != "" {
		return fieldManager
	}
	product, _, _ := strings.Cut(userAgent, "/")
	var b strings.Builder
	for _, r := range product {
		if !unicode.IsPrint(r) {
			continue
		}
		if b.Len()+utf8.RuneLen(r) > metav1validation.FieldManagerMaxLength {
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}
