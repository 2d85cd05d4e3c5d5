// Package policy describes the kinds of the policy API group: the
// PodDisruptionBudgets that voluntary disruptions (evictions, drains)
// respect.
package policy

import (
	"strconv"
	"strings"

	"github.com/orch-dev/orch/internal/api/resources"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Resources describes the policy group's kinds.
func Resources() []*resources.Resource { return []*resources.Resource{podDisruptionBudgets()} }

func podDisruptionBudgets() *resources.Resource {
	return resources.Described[policyv1.PodDisruptionBudget, policyv1.PodDisruptionBudgetList](&resources.Resource{
		GroupVersionKind: resources.GVK("policy", "PodDisruptionBudget"), Plural: "poddisruptionbudgets", Singular: "poddisruptionbudget",
		Namespaced: true, ShortNames: []string{"pdb"}, StorageKey: "poddisruptionbudgets",
		Subresources: []resources.Subresource{resources.Status()}, HasSpec: true,
		Validate:         resources.TypedValidate(validatePodDisruptionBudget),
		PrepareForCreate: resources.Typed(func(p *policyv1.PodDisruptionBudget) { p.Status = policyv1.PodDisruptionBudgetStatus{} }),
		Columns:          columns, Row: resources.TypedRow(row),
	})
}

var statusPath = field.NewPath("status")

// validatePodDisruptionBudget is Kubernetes' validation of a budget and of
// its status (which the disruption loop and the eviction API write).
func validatePodDisruptionBudget(p *policyv1.PodDisruptionBudget) field.ErrorList {
	var errs field.ErrorList
	spec, path := &p.Spec, resources.SpecPath
	if spec.MinAvailable != nil && spec.MaxUnavailable != nil {
		errs = append(errs, field.Invalid(path, *spec, "minAvailable and maxUnavailable cannot be both set"))
	}
	if spec.MinAvailable != nil {
		errs = append(errs, validateIntOrPercent(*spec.MinAvailable, path.Child("minAvailable"))...)
	}
	if spec.MaxUnavailable != nil {
		errs = append(errs, validateIntOrPercent(*spec.MaxUnavailable, path.Child("maxUnavailable"))...)
	}
	errs = append(errs, metav1validation.ValidateLabelSelector(spec.Selector, metav1validation.LabelSelectorValidationOptions{}, path.Child("selector"))...)
	if policy := spec.UnhealthyPodEvictionPolicy; policy != nil {
		if *policy != policyv1.IfHealthyBudget && *policy != policyv1.AlwaysAllow {
			errs = append(errs, field.NotSupported(path.Child("unhealthyPodEvictionPolicy"), *policy,
				[]string{string(policyv1.AlwaysAllow), string(policyv1.IfHealthyBudget)}))
		}
	}
	st := &p.Status
	errs = append(errs, metav1validation.ValidateConditions(st.Conditions, statusPath.Child("conditions"))...)
	for _, c := range []struct {
		name string
		n    int32
	}{{"disruptionsAllowed", st.DisruptionsAllowed}, {"currentHealthy", st.CurrentHealthy}, {"desiredHealthy", st.DesiredHealthy}, {"expectedPods", st.ExpectedPods}} {
		if c.n < 0 {
			errs = append(errs, field.Invalid(statusPath.Child(c.name), int64(c.n), "must be greater than or equal to 0"))
		}
	}
	return errs
}

// validateIntOrPercent: a count that is not negative or a percentage of at
// most 100, Kubernetes' ValidatePositiveIntOrPercent and
// IsNotMoreThan100Percent.
func validateIntOrPercent(v intstr.IntOrString, path *field.Path) field.ErrorList {
	switch v.Type {
	case intstr.Int:
		if v.IntVal < 0 {
			return field.ErrorList{field.Invalid(path, v, "must be greater than or equal to 0")}
		}
	case intstr.String:
		if msgs := validation.IsValidPercent(v.StrVal); len(msgs) > 0 {
			return field.ErrorList{field.Invalid(path, v, strings.Join(msgs, "; "))}
		}
		if n, _ := strconv.Atoi(strings.TrimSuffix(v.StrVal, "%")); n > 100 {
			return field.ErrorList{field.Invalid(path, v, "must not be greater than 100%")}
		}
	default:
		return field.ErrorList{field.Invalid(path, v, "must be an integer or percentage (e.g '5%')")}
	}
	return nil
}

var columns = []metav1.TableColumnDefinition{
	resources.NameCol,
	resources.Col("Min Available", "string", 0, "The minimum number of pods that must be available, either an absolute number or a percentage."),
	resources.Col("Max Unavailable", "string", 0, "The maximum number of pods that may be unavailable, either an absolute number or a percentage."),
	resources.Col("Allowed Disruptions", "integer", 0, "Number of pod disruptions that are currently allowed."),
	resources.AgeCol,
}

func row(p *policyv1.PodDisruptionBudget) []any {
	orNA := func(v *intstr.IntOrString) string {
		if v == nil {
			return "N/A"
		}
		return v.String()
	}
	return []any{p.Name, orNA(p.Spec.MinAvailable), orNA(p.Spec.MaxUnavailable), int64(p.Status.DisruptionsAllowed), resources.Age(p.CreationTimestamp)}
}
