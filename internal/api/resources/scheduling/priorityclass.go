// Package scheduling describes the kinds of the scheduling.k8s.io API
// group: the PriorityClasses that rank pods for the scheduler's
// preemption and the node's eviction.
package scheduling

import (
	"fmt"

	"github.com/orch-dev/orch/internal/api/resources"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

// Priorities as Kubernetes fixes them.
const (
	// HighestUserDefinablePriority is the highest value a class not the
	// system's may have.
	HighestUserDefinablePriority = int32(1000000000)
	// SystemCriticalPriority is system-cluster-critical's value;
	// system-node-critical's is a thousand above.
	SystemCriticalPriority = 2 * HighestUserDefinablePriority
	// SystemPrefix starts the names reserved for the system's classes.
	SystemPrefix = "system-"
)

// SystemPriorityClasses are the classes every cluster has, as Kubernetes
// makes them at start.
func SystemPriorityClasses() []*schedulingv1.PriorityClass {
	return []*schedulingv1.PriorityClass{
		{ObjectMeta: metav1.ObjectMeta{Name: "system-node-critical"}, Value: SystemCriticalPriority + 1000,
			Description: "Used for system critical pods that must not be moved from their current node.", PreemptionPolicy: ptr.To(corev1.PreemptLowerPriority)},
		{ObjectMeta: metav1.ObjectMeta{Name: "system-cluster-critical"}, Value: SystemCriticalPriority,
			Description: "Used for system critical pods that must run in the cluster, but can be moved to another node if necessary.", PreemptionPolicy: ptr.To(corev1.PreemptLowerPriority)},
	}
}

// Resources describes the scheduling.k8s.io group's kinds.
func Resources() []*resources.Resource { return []*resources.Resource{priorityClasses()} }

func priorityClasses() *resources.Resource {
	return resources.Described[schedulingv1.PriorityClass, schedulingv1.PriorityClassList](&resources.Resource{
		GroupVersionKind: resources.GVK("scheduling.k8s.io", "PriorityClass"), Plural: "priorityclasses", Singular: "priorityclass",
		ShortNames: []string{"pc"}, StorageKey: "priorityclasses",
		Default: resources.Typed(func(pc *schedulingv1.PriorityClass) {
			if pc.PreemptionPolicy == nil {
				pc.PreemptionPolicy = ptr.To(corev1.PreemptLowerPriority)
			}
		}),
		Validate: resources.TypedValidate(validatePriorityClass),
		ValidateUpdate: resources.TypedValidateUpdate(func(pc, old *schedulingv1.PriorityClass) field.ErrorList {
			var errs field.ErrorList
			if pc.Value != old.Value {
				errs = append(errs, field.Forbidden(field.NewPath("value"), "may not be changed in an update."))
			}
			return append(errs, resources.Immutable(pc.PreemptionPolicy, old.PreemptionPolicy, field.NewPath("preemptionPolicy"))...)
		}),
		Columns: columns, Row: resources.TypedRow(func(pc *schedulingv1.PriorityClass) []any {
			return []any{pc.Name, int64(pc.Value), pc.GlobalDefault, resources.Age(pc.CreationTimestamp), string(ptr.Deref(pc.PreemptionPolicy, ""))}
		}),
	})
}

// validatePriorityClass: names starting with "system-" are the system's
// own classes only, with their values; other classes stay at or below
// HighestUserDefinablePriority.
func validatePriorityClass(pc *schedulingv1.PriorityClass) field.ErrorList {
	var errs field.ErrorList
	if len(pc.Name) >= len(SystemPrefix) && pc.Name[:len(SystemPrefix)] == SystemPrefix {
		if err := knownSystemClass(pc); err != nil {
			errs = append(errs, field.Forbidden(field.NewPath("metadata", "name"),
				"priority class names with '"+SystemPrefix+"' prefix are reserved for system use only. error: "+err.Error()))
		}
	} else if pc.Value > HighestUserDefinablePriority {
		errs = append(errs, field.Forbidden(field.NewPath("value"), fmt.Sprintf("maximum allowed value of a user defined priority is %v", HighestUserDefinablePriority)))
	}
	if p := pc.PreemptionPolicy; p != nil && *p != corev1.PreemptLowerPriority && *p != corev1.PreemptNever {
		errs = append(errs, field.NotSupported(field.NewPath("preemptionPolicy"), *p, []string{string(corev1.PreemptLowerPriority), string(corev1.PreemptNever)}))
	}
	return errs
}

// knownSystemClass reports why pc is not one of the system's classes as
// Kubernetes makes them.
func knownSystemClass(pc *schedulingv1.PriorityClass) error {
	for _, sys := range SystemPriorityClasses() {
		if sys.Name != pc.Name {
			continue
		}
		if sys.Value != pc.Value {
			return fmt.Errorf("value of %v PriorityClass must be %v", sys.Name, sys.Value)
		}
		if pc.GlobalDefault {
			return fmt.Errorf("globalDefault of %v PriorityClass must be %v", sys.Name, false)
		}
		return nil
	}
	return fmt.Errorf("%v is not a known system priority class", pc.Name)
}

var columns = []metav1.TableColumnDefinition{
	resources.NameCol,
	resources.Col("Value", "integer", 0, schedulingv1.PriorityClass{}.SwaggerDoc()["value"]),
	resources.Col("Global-Default", "boolean", 0, schedulingv1.PriorityClass{}.SwaggerDoc()["globalDefault"]),
	resources.AgeCol,
	resources.Col("PreemptionPolicy", "string", 0, schedulingv1.PriorityClass{}.SwaggerDoc()["preemptionPolicy"]),
}
