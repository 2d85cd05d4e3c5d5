// Package storagemigration describes the kinds of the
// storagemigration.k8s.io API group: the StorageVersionMigrations that
// ask for every object of a resource to be written again in the form
// the server stores now (a custom resource's new storage version, a new
// encryption key), which orch's storage-migration loop carries out.
package storagemigration

import (
	"strconv"
	"strings"

	"github.com/orch-dev/orch/internal/api/resources"
	svmv1 "k8s.io/api/storagemigration/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Resources describes the storagemigration.k8s.io group's kinds.
func Resources() []*resources.Resource { return []*resources.Resource{migrations()} }

func migrations() *resources.Resource {
	return resources.Described[svmv1.StorageVersionMigration, svmv1.StorageVersionMigrationList](&resources.Resource{
		GroupVersionKind: resources.GVK(svmv1.GroupName, "StorageVersionMigration"), Plural: "storageversionmigrations", Singular: "storageversionmigration",
		StorageKey: "storageversionmigrations", HasSpec: true, Subresources: []resources.Subresource{resources.Status()},
		PrepareForCreate: resources.Typed(func(m *svmv1.StorageVersionMigration) { m.Status = svmv1.StorageVersionMigrationStatus{} }),
		Validate:         resources.TypedValidate(validateMigration),
		ValidateUpdate: resources.TypedValidateUpdate(func(m, old *svmv1.StorageVersionMigration) field.ErrorList {
			errs := resources.Immutable(m.Spec, old.Spec, resources.SpecPath)
			return append(errs, validateStatus(m, old)...)
		}),
		Columns: []metav1.TableColumnDefinition{resources.NameCol,
			resources.Col("Resource", "string", 0, svmv1.StorageVersionMigrationSpec{}.SwaggerDoc()["resource"]),
			resources.Col("State", "string", 0, "Running, Succeeded or Failed."), resources.AgeCol},
		Row: resources.TypedRow(func(m *svmv1.StorageVersionMigration) []any {
			state := ""
			for _, t := range []svmv1.MigrationConditionType{svmv1.MigrationSucceeded, svmv1.MigrationFailed, svmv1.MigrationRunning} {
				if state == "" && apimeta.IsStatusConditionTrue(m.Status.Conditions, string(t)) {
					state = string(t)
				}
			}
			gr := m.Spec.Resource.Resource
			if m.Spec.Resource.Group != "" {
				gr += "." + m.Spec.Resource.Group
			}
			return []any{m.Name, gr, resources.OrNone(state), resources.Age(m.CreationTimestamp)}
		}),
	})
}

// validateMigration: a resource named as a DNS-1035 label in a group
// named as a DNS subdomain, as Kubernetes (and an APIService) has them.
func validateMigration(m *svmv1.StorageVersionMigration) field.ErrorList {
	var errs field.ErrorList
	p := resources.SpecPath.Child("resource")
	if m.Spec.Resource.Resource == "" {
		errs = append(errs, field.Required(p.Child("resource"), "resource is required to be set"))
	} else if msgs := validation.IsDNS1035Label(m.Spec.Resource.Resource); len(msgs) > 0 {
		errs = append(errs, field.Invalid(p.Child("resource"), m.Spec.Resource.Resource, strings.Join(msgs, ",")))
	}
	if g := m.Spec.Resource.Group; g != "" {
		if msgs := validation.IsDNS1123Subdomain(g); len(msgs) > 0 {
			errs = append(errs, field.Invalid(p.Child("group"), g, strings.Join(msgs, ",")))
		}
	}
	return errs
}

// validateStatus: a resourceVersion that is a number and, once set, is
// kept; well-formed conditions; never both succeeded and failed, and
// neither taken back.
func validateStatus(m, old *svmv1.StorageVersionMigration) field.ErrorList {
	p := field.NewPath("status")
	errs := metav1validation.ValidateConditions(m.Status.Conditions, p.Child("conditions"))
	if rv := m.Status.ResourceVersion; rv != "" {
		if n, err := strconv.ParseUint(rv, 10, 64); err != nil || n == 0 {
			errs = append(errs, field.Invalid(p.Child("resourceVersion"), rv, "must be a resource version of this server"))
		}
	}
	if old.Status.ResourceVersion != "" && old.Status.ResourceVersion != m.Status.ResourceVersion {
		errs = append(errs, field.Invalid(p.Child("resourceVersion"), m.Status.ResourceVersion, "field is immutable"))
	}
	done := func(s *svmv1.StorageVersionMigration, t svmv1.MigrationConditionType) bool {
		return apimeta.IsStatusConditionTrue(s.Status.Conditions, string(t))
	}
	if done(m, svmv1.MigrationSucceeded) && done(m, svmv1.MigrationFailed) {
		errs = append(errs, field.Invalid(p.Child("conditions"), m.Status.Conditions, "Both success and failed conditions cannot be true at the same time"))
	}
	if done(old, svmv1.MigrationSucceeded) && !done(m, svmv1.MigrationSucceeded) {
		errs = append(errs, field.Invalid(p.Child("conditions"), m.Status.Conditions, "Success condition cannot be set to false once it is true"))
	}
	if done(old, svmv1.MigrationFailed) && !done(m, svmv1.MigrationFailed) {
		errs = append(errs, field.Invalid(p.Child("conditions"), m.Status.Conditions, "Failed condition cannot be set to false once it is true"))
	}
	return errs
}
