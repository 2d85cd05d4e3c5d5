// Package rbac describes the kinds of the rbac.authorization.k8s.io API
// group: Roles and ClusterRoles (what may be done) and their bindings
// (who may do it), with Kubernetes' validation. Deciding requests by them
// is internal/api/auth/rbac's work.
package rbac

import (
	"fmt"
	"slices"
	"strings"

	"github.com/orch-dev/orch/internal/api/resources"
	rbacv1 "k8s.io/api/rbac/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Group is the API group's name.
const Group = rbacv1.GroupName

// Resources describes the rbac.authorization.k8s.io group's kinds.
func Resources() []*resources.Resource {
	return []*resources.Resource{roles(), roleBindings(), clusterRoles(), clusterRoleBindings()}
}

// Kubernetes names RBAC objects by the looser path segment rule, so that
// "system:node" and friends are valid names.
func roles() *resources.Resource {
	return resources.Described[rbacv1.Role, rbacv1.RoleList](&resources.Resource{
		GroupVersionKind: resources.GVK(Group, "Role"), Plural: "roles", Singular: "role", Namespaced: true,
		StorageKey: "roles", NameRule: resources.PathSegmentName,
		Validate: resources.TypedValidate(func(r *rbacv1.Role) field.ErrorList { return validateRules(r.Rules, true) }),
	})
}

func clusterRoles() *resources.Resource {
	return resources.Described[rbacv1.ClusterRole, rbacv1.ClusterRoleList](&resources.Resource{
		GroupVersionKind: resources.GVK(Group, "ClusterRole"), Plural: "clusterroles", Singular: "clusterrole",
		StorageKey: "clusterroles", NameRule: resources.PathSegmentName,
		Validate: resources.TypedValidate(validateClusterRole),
	})
}

func roleBindings() *resources.Resource {
	return resources.Described[rbacv1.RoleBinding, rbacv1.RoleBindingList](&resources.Resource{
		GroupVersionKind: resources.GVK(Group, "RoleBinding"), Plural: "rolebindings", Singular: "rolebinding", Namespaced: true,
		StorageKey: "rolebindings", NameRule: resources.PathSegmentName,
		Default: resources.Typed(func(b *rbacv1.RoleBinding) { defaultRoleRef(&b.RoleRef); defaultSubjects(b.Subjects) }),
		Validate: resources.TypedValidate(func(b *rbacv1.RoleBinding) field.ErrorList {
			return validateBinding(b.RoleRef, b.Subjects, true)
		}),
		ValidateUpdate: resources.TypedValidateUpdate(func(b, old *rbacv1.RoleBinding) field.ErrorList {
			return immutableRoleRef(b.RoleRef, old.RoleRef)
		}),
		Columns: bindingColumns, Row: resources.TypedRow(func(b *rbacv1.RoleBinding) []any {
			return bindingRow(b.ObjectMeta, b.RoleRef, b.Subjects)
		}),
	})
}

func clusterRoleBindings() *resources.Resource {
	return resources.Described[rbacv1.ClusterRoleBinding, rbacv1.ClusterRoleBindingList](&resources.Resource{
		GroupVersionKind: resources.GVK(Group, "ClusterRoleBinding"), Plural: "clusterrolebindings", Singular: "clusterrolebinding",
		StorageKey: "clusterrolebindings", NameRule: resources.PathSegmentName,
		Default: resources.Typed(func(b *rbacv1.ClusterRoleBinding) { defaultRoleRef(&b.RoleRef); defaultSubjects(b.Subjects) }),
		Validate: resources.TypedValidate(func(b *rbacv1.ClusterRoleBinding) field.ErrorList {
			return validateBinding(b.RoleRef, b.Subjects, false)
		}),
		ValidateUpdate: resources.TypedValidateUpdate(func(b, old *rbacv1.ClusterRoleBinding) field.ErrorList {
			return immutableRoleRef(b.RoleRef, old.RoleRef)
		}),
		Columns: bindingColumns, Row: resources.TypedRow(func(b *rbacv1.ClusterRoleBinding) []any {
			return bindingRow(b.ObjectMeta, b.RoleRef, b.Subjects)
		}),
	})
}

var rulesPath = field.NewPath("rules")

// validateRules is Kubernetes' check of PolicyRules: verbs always; either
// resources (with their API groups) or, outside namespaces, non-resource
// URLs. Unknown verbs are fine, as in Kubernetes: "*" and custom verbs
// (escalate, bind, impersonate, use) are all strings to it.
func validateRules(rules []rbacv1.PolicyRule, namespaced bool) field.ErrorList {
	var errs field.ErrorList
	for i, r := range rules {
		p := rulesPath.Index(i)
		if len(r.Verbs) == 0 {
			errs = append(errs, field.Required(p.Child("verbs"), "verbs must contain at least one value"))
		}
		if len(r.NonResourceURLs) > 0 {
			if namespaced {
				errs = append(errs, field.Invalid(p.Child("nonResourceURLs"), r.NonResourceURLs, "namespaced rules cannot apply to non-resource URLs"))
			}
			if len(r.APIGroups) > 0 || len(r.Resources) > 0 || len(r.ResourceNames) > 0 {
				errs = append(errs, field.Invalid(p.Child("nonResourceURLs"), r.NonResourceURLs, "rules cannot apply to both regular resources and non-resource URLs"))
			}
			continue
		}
		if len(r.APIGroups) == 0 {
			errs = append(errs, field.Required(p.Child("apiGroups"), "resource rules must supply at least one api group"))
		}
		if len(r.Resources) == 0 {
			errs = append(errs, field.Required(p.Child("resources"), "resource rules must supply at least one resource"))
		}
	}
	return errs
}

func validateClusterRole(r *rbacv1.ClusterRole) field.ErrorList {
	errs := validateRules(r.Rules, false)
	if a := r.AggregationRule; a != nil {
		p := field.NewPath("aggregationRule", "clusterRoleSelectors")
		if len(a.ClusterRoleSelectors) == 0 {
			errs = append(errs, field.Required(p, "at least one clusterRoleSelector required if aggregationRule is non-nil"))
		}
		for i := range a.ClusterRoleSelectors {
			errs = append(errs, metav1validation.ValidateLabelSelector(&a.ClusterRoleSelectors[i],
				metav1validation.LabelSelectorValidationOptions{}, p.Index(i))...)
		}
	}
	return errs
}

// defaultSubjects gives subjects Kubernetes' default API group: RBAC's for
// users and groups, the core group for service accounts.
// defaultRoleRef: a roleRef naming no API group names RBAC's, as
// Kubernetes defaults it (clients and charts leave it out).
func defaultRoleRef(ref *rbacv1.RoleRef) {
	if ref.APIGroup == "" {
		ref.APIGroup = rbacv1.GroupName
	}
}

func defaultSubjects(subjects []rbacv1.Subject) {
	for i := range subjects {
		s := &subjects[i]
		if s.APIGroup == "" && (s.Kind == rbacv1.UserKind || s.Kind == rbacv1.GroupKind) {
			s.APIGroup = Group
		}
	}
}

func validateBinding(ref rbacv1.RoleRef, subjects []rbacv1.Subject, namespaced bool) field.ErrorList {
	var errs field.ErrorList
	p := field.NewPath("roleRef")
	if ref.APIGroup != Group {
		errs = append(errs, field.NotSupported(p.Child("apiGroup"), ref.APIGroup, []string{Group}))
	}
	kinds := []string{"ClusterRole"}
	if namespaced {
		kinds = []string{"Role", "ClusterRole"}
	}
	if !slices.Contains(kinds, ref.Kind) {
		errs = append(errs, field.NotSupported(p.Child("kind"), ref.Kind, kinds))
	}
	if ref.Name == "" {
		errs = append(errs, field.Required(p.Child("name"), ""))
	} else {
		for _, msg := range resources.PathSegmentName(ref.Name, false) {
			errs = append(errs, field.Invalid(p.Child("name"), ref.Name, msg))
		}
	}
	for i, s := range subjects {
		errs = append(errs, validateSubject(s, namespaced, field.NewPath("subjects").Index(i))...)
	}
	return errs
}

func validateSubject(s rbacv1.Subject, namespaced bool, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if s.Name == "" {
		errs = append(errs, field.Required(p.Child("name"), ""))
	}
	switch s.Kind {
	case rbacv1.ServiceAccountKind:
		if s.Name != "" {
			for _, msg := range apivalidation.ValidateServiceAccountName(s.Name, false) {
				errs = append(errs, field.Invalid(p.Child("name"), s.Name, msg))
			}
		}
		if s.APIGroup != "" {
			errs = append(errs, field.NotSupported(p.Child("apiGroup"), s.APIGroup, []string{""}))
		}
		if !namespaced && s.Namespace == "" {
			errs = append(errs, field.Required(p.Child("namespace"), ""))
		}
	case rbacv1.UserKind, rbacv1.GroupKind:
		if s.APIGroup != Group {
			errs = append(errs, field.NotSupported(p.Child("apiGroup"), s.APIGroup, []string{Group}))
		}
	default:
		errs = append(errs, field.NotSupported(p.Child("kind"), s.Kind, []string{rbacv1.ServiceAccountKind, rbacv1.UserKind, rbacv1.GroupKind}))
	}
	return errs
}

func immutableRoleRef(ref, old rbacv1.RoleRef) field.ErrorList {
	if ref != old {
		return field.ErrorList{field.Invalid(field.NewPath("roleRef"), ref, "cannot change roleRef")}
	}
	return nil
}

var bindingColumns = []metav1.TableColumnDefinition{
	resources.NameCol,
	resources.Col("Role", "string", 0, rbacv1.RoleBinding{}.SwaggerDoc()["roleRef"]),
	resources.AgeCol,
	resources.Col("Users", "string", 1, "Users in the binding"),
	resources.Col("Groups", "string", 1, "Groups in the binding"),
	resources.Col("ServiceAccounts", "string", 1, "ServiceAccounts in the binding"),
}

// bindingRow is kubectl's: the role as Kind/name, and -o wide's subjects
// by kind (service accounts as namespace/name).
func bindingRow(m metav1.ObjectMeta, ref rbacv1.RoleRef, subjects []rbacv1.Subject) []any {
	var users, groups, sas []string
	for _, s := range subjects {
		switch s.Kind {
		case rbacv1.UserKind:
			users = append(users, s.Name)
		case rbacv1.GroupKind:
			groups = append(groups, s.Name)
		case rbacv1.ServiceAccountKind:
			sas = append(sas, fmt.Sprintf("%s/%s", s.Namespace, s.Name))
		}
	}
	return []any{m.Name, ref.Kind + "/" + ref.Name, resources.Age(m.CreationTimestamp),
		strings.Join(users, ", "), strings.Join(groups, ", "), strings.Join(sas, ", ")}
}
