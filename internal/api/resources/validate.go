package resources

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// The descriptions' checks follow Kubernetes' pkg/apis/*/validation for
// what users hit: names, required fields, enums, selectors that must match
// their template, and immutable fields, with the same field paths and
// messages.

var (
	metaPath = field.NewPath("metadata")
	// SpecPath is the path of .spec, where most checks point.
	SpecPath = field.NewPath("spec")
)

// ValidateMeta checks an object's metadata under the resource's name rule.
func ValidateMeta(r *Resource, obj runtime.Object) field.ErrorList {
	m, err := meta.Accessor(obj)
	if err != nil {
		return field.ErrorList{field.InternalError(metaPath, err)}
	}
	nameFn := r.NameRule
	if nameFn == nil {
		nameFn = apivalidation.NameIsDNSSubdomain
	}
	errs := apivalidation.ValidateObjectMetaAccessor(m, r.Namespaced, nameFn, metaPath)
	errs = append(errs, metav1validation.ValidateLabels(m.GetLabels(), metaPath.Child("labels"))...)
	return errs
}

// PathSegmentName is Kubernetes' rule for names that only need to fit in a
// URL path segment (events, and nodes which often carry FQDNs).
func PathSegmentName(name string, prefix bool) []string {
	for _, bad := range []string{".", ".."} {
		if name == bad {
			return []string{fmt.Sprintf("may not be '%s'", bad)}
		}
	}
	for _, bad := range []string{"/", "%"} {
		if strings.Contains(name, bad) {
			return []string{fmt.Sprintf("may not contain '%s'", bad)}
		}
	}
	return nil
}

// Immutable reports a change to a field Kubernetes forbids changing.
func Immutable(newVal, oldVal any, path *field.Path) field.ErrorList {
	return apivalidation.ValidateImmutableField(newVal, oldVal, path)
}

// ValidateReplicas checks a count that may not be negative.
func ValidateReplicas(n *int32, path *field.Path) field.ErrorList {
	if n != nil && *n < 0 {
		return field.ErrorList{field.Invalid(path, *n, "must be greater than or equal to 0")}
	}
	return nil
}
