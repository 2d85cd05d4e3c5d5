// Package node describes the kinds of the node.k8s.io API group: the
// RuntimeClasses a pod picks its container runtime handler with.
package node

import (
	"github.com/orch-dev/orch/internal/api/resources"
	"github.com/orch-dev/orch/internal/api/resources/core"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Resources describes the node.k8s.io group's kinds.
func Resources() []*resources.Resource { return []*resources.Resource{runtimeClasses()} }

func runtimeClasses() *resources.Resource {
	return resources.Described[nodev1.RuntimeClass, nodev1.RuntimeClassList](&resources.Resource{
		GroupVersionKind: resources.GVK("node.k8s.io", "RuntimeClass"), Plural: "runtimeclasses", Singular: "runtimeclass",
		StorageKey: "runtimeclasses", Validate: resources.TypedValidate(validateRuntimeClass),
		ValidateUpdate: resources.TypedValidateUpdate(func(rc, old *nodev1.RuntimeClass) field.ErrorList {
			return resources.Immutable(rc.Handler, old.Handler, field.NewPath("handler"))
		}),
		Columns: runtimeClassColumns, Row: resources.TypedRow(func(rc *nodev1.RuntimeClass) []any {
			return []any{rc.Name, rc.Handler, resources.Age(rc.CreationTimestamp)}
		}),
	})
}

// validateRuntimeClass: a handler that is a DNS label, overhead that is not
// negative, a valid node selector and tolerations.
func validateRuntimeClass(rc *nodev1.RuntimeClass) field.ErrorList {
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Label(rc.Handler) {
		errs = append(errs, field.Invalid(field.NewPath("handler"), rc.Handler, msg))
	}
	if rc.Overhead != nil {
		for name, q := range rc.Overhead.PodFixed {
			if q.Sign() < 0 {
				errs = append(errs, field.Invalid(field.NewPath("overhead", "podFixed").Key(string(name)), q.String(), "must be greater than or equal to 0"))
			}
		}
	}
	if s := rc.Scheduling; s != nil {
		errs = append(errs, metav1validation.ValidateLabels(s.NodeSelector, field.NewPath("scheduling", "nodeSelector"))...)
		errs = append(errs, core.ValidateTolerations(s.Tolerations, field.NewPath("scheduling", "tolerations"))...)
	}
	return errs
}

var runtimeClassColumns = []metav1.TableColumnDefinition{
	resources.NameCol,
	resources.Col("Handler", "string", 0, nodev1.RuntimeClass{}.SwaggerDoc()["handler"]),
	resources.AgeCol,
}
