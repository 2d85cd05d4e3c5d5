package core

import (
	"slices"
	"strings"

	"github.com/orch-dev/orch/internal/api/resources"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

func resourceQuotas() *resources.Resource {
	return resources.Described[corev1.ResourceQuota, corev1.ResourceQuotaList](&resources.Resource{
		StatusMetadata: resources.StatusMetadataAll, GroupVersionKind: resources.GVK("", "ResourceQuota"), Plural: "resourcequotas", Singular: "resourcequota", Namespaced: true,
		ShortNames: []string{"quota"}, StorageKey: "resourcequotas", HasSpec: true,
		Subresources:     []resources.Subresource{resources.Status()},
		PrepareForCreate: resources.Typed(func(q *corev1.ResourceQuota) { q.Status = corev1.ResourceQuotaStatus{} }),
		Validate:         resources.TypedValidate(validateResourceQuota),
		Columns:          resourceQuotaColumns, Row: resources.TypedRow(resourceQuotaRow),
	})
}

// standardQuotaResources are the names quota knows without a domain, as
// Kubernetes lists them.
var standardQuotaResources = sets.New[corev1.ResourceName](
	corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage,
	corev1.ResourceRequestsCPU, corev1.ResourceRequestsMemory, corev1.ResourceRequestsStorage, corev1.ResourceRequestsEphemeralStorage,
	corev1.ResourceLimitsCPU, corev1.ResourceLimitsMemory, corev1.ResourceLimitsEphemeralStorage,
	corev1.ResourcePods, corev1.ResourceQuotas, corev1.ResourceServices, corev1.ResourceReplicationControllers,
	corev1.ResourceSecrets, corev1.ResourcePersistentVolumeClaims, corev1.ResourceConfigMaps,
	corev1.ResourceServicesNodePorts, corev1.ResourceServicesLoadBalancers,
)

// integerQuotaResources are object counts: whole numbers only.
var integerQuotaResources = sets.New[corev1.ResourceName](
	corev1.ResourcePods, corev1.ResourceQuotas, corev1.ResourceServices, corev1.ResourceReplicationControllers,
	corev1.ResourceSecrets, corev1.ResourcePersistentVolumeClaims, corev1.ResourceConfigMaps,
	corev1.ResourceServicesNodePorts, corev1.ResourceServicesLoadBalancers,
)

// podCountResources are all a BestEffort scope may limit: its pods
// have no compute requests to count.
var podCountResources = sets.New[corev1.ResourceName](corev1.ResourcePods, "count/pods")

var quotaScopes = []corev1.ResourceQuotaScope{corev1.ResourceQuotaScopeTerminating, corev1.ResourceQuotaScopeNotTerminating,
	corev1.ResourceQuotaScopeBestEffort, corev1.ResourceQuotaScopeNotBestEffort, corev1.ResourceQuotaScopePriorityClass,
	corev1.ResourceQuotaScopeCrossNamespacePodAffinity}

// validateResourceQuota checks a quota as Kubernetes does: standard or
// domain-qualified resource names, non-negative amounts (whole numbers
// for object counts), known scopes that do not contradict each other, and
// BestEffort scopes only on pod counts.
func validateResourceQuota(q *corev1.ResourceQuota) field.ErrorList {
	var errs field.ErrorList
	hard := field.NewPath("spec", "hard")
	for name, v := range q.Spec.Hard {
		p := hard.Key(string(name))
		switch {
		case strings.HasPrefix(string(name), "count/"):
			if msgs := validation.IsQualifiedName(strings.TrimPrefix(string(name), "count/")); len(msgs) > 0 {
				errs = append(errs, field.Invalid(p, name, strings.Join(msgs, "; ")))
			}
		case strings.Contains(string(name), "/"):
			if msgs := validation.IsQualifiedName(string(name)); len(msgs) > 0 {
				errs = append(errs, field.Invalid(p, name, strings.Join(msgs, "; ")))
			}
		case strings.HasPrefix(string(name), "requests.hugepages-"), strings.HasPrefix(string(name), "hugepages-"):
		case !standardQuotaResources.Has(name):
			errs = append(errs, field.Invalid(p, name, "must be a standard resource for quota"))
		}
		if v.Sign() < 0 {
			errs = append(errs, field.Invalid(p, v.String(), "must be greater than or equal to 0"))
		}
		if (integerQuotaResources.Has(name) || strings.HasPrefix(string(name), "count/")) && v.MilliValue()%1000 != 0 {
			errs = append(errs, field.Invalid(p, v.String(), "must be an integer"))
		}
	}
	scopes := sets.New[corev1.ResourceQuotaScope]()
	for i, s := range q.Spec.Scopes {
		p := field.NewPath("spec", "scopes").Index(i)
		if !slices.Contains(quotaScopes, s) {
			errs = append(errs, field.Invalid(p, s, "unsupported scope"))
		}
		scopes.Insert(s)
	}
	if sel := q.Spec.ScopeSelector; sel != nil {
		for i, e := range sel.MatchExpressions {
			p := field.NewPath("spec", "scopeSelector", "matchExpressions").Index(i)
			if !slices.Contains(quotaScopes, e.ScopeName) {
				errs = append(errs, field.Invalid(p.Child("scopeName"), e.ScopeName, "unsupported scope"))
			}
			switch e.Operator {
			case corev1.ScopeSelectorOpIn, corev1.ScopeSelectorOpNotIn:
				if len(e.Values) == 0 {
					errs = append(errs, field.Required(p.Child("values"), "must be at least one value when `operator` is 'In' or 'NotIn' for scope selector"))
				}
			case corev1.ScopeSelectorOpExists, corev1.ScopeSelectorOpDoesNotExist:
				if len(e.Values) > 0 {
					errs = append(errs, field.Invalid(p.Child("values"), e.Values, "must be no value when `operator` is 'Exist' or 'DoesNotExist' for scope selector"))
				}
			default:
				errs = append(errs, field.Invalid(p.Child("operator"), e.Operator, "not a valid selector operator"))
			}
			if e.Operator == corev1.ScopeSelectorOpExists {
				scopes.Insert(e.ScopeName)
			}
		}
	}
	for _, pair := range [][2]corev1.ResourceQuotaScope{
		{corev1.ResourceQuotaScopeTerminating, corev1.ResourceQuotaScopeNotTerminating},
		{corev1.ResourceQuotaScopeBestEffort, corev1.ResourceQuotaScopeNotBestEffort},
	} {
		if scopes.Has(pair[0]) && scopes.Has(pair[1]) {
			errs = append(errs, field.Invalid(field.NewPath("spec", "scopes"), q.Spec.Scopes, "conflicting scopes"))
		}
	}
	if scopes.Has(corev1.ResourceQuotaScopeBestEffort) {
		for name := range q.Spec.Hard {
			if !podCountResources.Has(name) {
				errs = append(errs, field.Invalid(hard, q.Spec.Hard, "unsupported scope applied to resource"))
				break
			}
		}
	}
	return errs
}

var resourceQuotaColumns = []metav1.TableColumnDefinition{resources.NameCol, resources.AgeCol,
	resources.Col("Request", "string", 0, "The used and hard amounts of what is not a limit"),
	resources.Col("Limit", "string", 0, "The used and hard amounts of the limits")}

// resourceQuotaRow shows used/hard per resource, as kubectl get quota
// does: limits.* under Limit, the rest under Request.
func resourceQuotaRow(q *corev1.ResourceQuota) []any {
	names := make([]string, 0, len(q.Status.Hard))
	for r := range q.Status.Hard {
		names = append(names, string(r))
	}
	slices.Sort(names)
	var req, lim []string
	for _, n := range names {
		hard := q.Status.Hard[corev1.ResourceName(n)]
		used := q.Status.Used[corev1.ResourceName(n)]
		s := n + ": " + used.String() + "/" + hard.String()
		if strings.HasPrefix(n, "limits.") {
			lim = append(lim, s)
		} else {
			req = append(req, s)
		}
	}
	return []any{q.Name, resources.Age(q.CreationTimestamp), strings.Join(req, ", "), strings.Join(lim, ", ")}
}
