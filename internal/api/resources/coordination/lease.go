// Package coordination describes the kinds of the coordination.k8s.io API
// group: the Leases that node heartbeats and leader election use.
package coordination

import (
	"github.com/orch-dev/orch/internal/api/resources"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Resources describes the coordination.k8s.io group's kinds.
func Resources() []*resources.Resource { return []*resources.Resource{leases()} }

func leases() *resources.Resource {
	return resources.Described[coordinationv1.Lease, coordinationv1.LeaseList](&resources.Resource{
		GroupVersionKind: resources.GVK("coordination.k8s.io", "Lease"), Plural: "leases", Singular: "lease", Namespaced: true,
		StorageKey: "leases", Volatile: []string{corev1.NamespaceNodeLease}, AllowCreateOnUpdate: true,
		Validate: resources.TypedValidate(validateLease), Columns: leaseColumns, Row: resources.TypedRow(leaseRow),
	})
}

func validateLease(l *coordinationv1.Lease) field.ErrorList {
	var errs field.ErrorList
	if d := l.Spec.LeaseDurationSeconds; d != nil && *d <= 0 {
		errs = append(errs, field.Invalid(resources.SpecPath.Child("leaseDurationSeconds"), *d, "must be greater than 0"))
	}
	if t := l.Spec.LeaseTransitions; t != nil && *t < 0 {
		errs = append(errs, field.Invalid(resources.SpecPath.Child("leaseTransitions"), *t, "must be greater than or equal to 0"))
	}
	return errs
}

var leaseColumns = []metav1.TableColumnDefinition{resources.NameCol, resources.Col("Holder", "string", 0, coordinationv1.LeaseSpec{}.SwaggerDoc()["holderIdentity"]), resources.AgeCol}

func leaseRow(l *coordinationv1.Lease) []any {
	return []any{l.Name, resources.PtrOr(l.Spec.HolderIdentity, ""), resources.Age(l.CreationTimestamp)}
}
