// Package admissionregistration describes the kinds of the
// admissionregistration.k8s.io API group: the webhook configurations
// dynamic admission calls and the ValidatingAdmissionPolicies with their
// bindings, with Kubernetes' defaults and validation.
package admissionregistration

import (
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/orch-dev/orch/internal/api/resources"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

// ConditionCompiler checks match conditions (CEL) as they are written; nil
// refuses any, for a server without CEL.
type ConditionCompiler func(conds []admissionregistrationv1.MatchCondition, path *field.Path) field.ErrorList

// Resources describes the group's kinds; conditions checks webhooks'
// match conditions, policies the expressions of admission policies.
func Resources(conditions ConditionCompiler, policies PolicyCompiler, mutating MutatingPolicyCompiler) []*resources.Resource {
	return []*resources.Resource{mutatingWebhooks(conditions), validatingWebhooks(conditions), validatingPolicies(policies), validatingPolicyBindings(),
		mutatingPolicies(mutating), mutatingPolicyBindings()}
}

var webhookColumns = []metav1.TableColumnDefinition{resources.NameCol,
	resources.Col("Webhooks", "integer", 0, "The number of webhooks in the configuration."), resources.AgeCol}

func mutatingWebhooks(compile ConditionCompiler) *resources.Resource {
	return resources.Described[admissionregistrationv1.MutatingWebhookConfiguration, admissionregistrationv1.MutatingWebhookConfigurationList](&resources.Resource{
		GroupVersionKind: resources.GVK(admissionregistrationv1.GroupName, "MutatingWebhookConfiguration"),
		Plural:           "mutatingwebhookconfigurations", Singular: "mutatingwebhookconfiguration", StorageKey: "mutatingwebhookconfigurations",
		Categories: []string{"api-extensions"},
		Default: resources.Typed(func(c *admissionregistrationv1.MutatingWebhookConfiguration) {
			for i := range c.Webhooks {
				w := &c.Webhooks[i]
				defaultWebhook(&w.FailurePolicy, &w.MatchPolicy, &w.NamespaceSelector, &w.ObjectSelector, &w.TimeoutSeconds, &w.ClientConfig, w.Rules)
				if w.ReinvocationPolicy == nil {
					w.ReinvocationPolicy = ptr.To(admissionregistrationv1.NeverReinvocationPolicy)
				}
			}
		}),
		Validate: resources.TypedValidate(func(c *admissionregistrationv1.MutatingWebhookConfiguration) field.ErrorList {
			var errs field.ErrorList
			names := sets.New[string]()
			for i, w := range c.Webhooks {
				p := field.NewPath("webhooks").Index(i)
				errs = append(errs, validateWebhook(p, names, commonOf(w.Name, w.ClientConfig, w.Rules, w.FailurePolicy, w.MatchPolicy, w.NamespaceSelector,
					w.ObjectSelector, w.SideEffects, w.TimeoutSeconds, w.AdmissionReviewVersions, w.MatchConditions), compile)...)
				if r := w.ReinvocationPolicy; r != nil && *r != admissionregistrationv1.NeverReinvocationPolicy && *r != admissionregistrationv1.IfNeededReinvocationPolicy {
					errs = append(errs, field.NotSupported(p.Child("reinvocationPolicy"), *r, []string{"Never", "IfNeeded"}))
				}
			}
			return errs
		}),
		Columns: webhookColumns,
		Row: resources.TypedRow(func(c *admissionregistrationv1.MutatingWebhookConfiguration) []any {
			return []any{c.Name, int64(len(c.Webhooks)), resources.Age(c.CreationTimestamp)}
		}),
	})
}

func validatingWebhooks(compile ConditionCompiler) *resources.Resource {
	return resources.Described[admissionregistrationv1.ValidatingWebhookConfiguration, admissionregistrationv1.ValidatingWebhookConfigurationList](&resources.Resource{
		GroupVersionKind: resources.GVK(admissionregistrationv1.GroupName, "ValidatingWebhookConfiguration"),
		Plural:           "validatingwebhookconfigurations", Singular: "validatingwebhookconfiguration", StorageKey: "validatingwebhookconfigurations",
		Categories: []string{"api-extensions"},
		Default: resources.Typed(func(c *admissionregistrationv1.ValidatingWebhookConfiguration) {
			for i := range c.Webhooks {
				w := &c.Webhooks[i]
				defaultWebhook(&w.FailurePolicy, &w.MatchPolicy, &w.NamespaceSelector, &w.ObjectSelector, &w.TimeoutSeconds, &w.ClientConfig, w.Rules)
			}
		}),
		Validate: resources.TypedValidate(func(c *admissionregistrationv1.ValidatingWebhookConfiguration) field.ErrorList {
			var errs field.ErrorList
			names := sets.New[string]()
			for i, w := range c.Webhooks {
				errs = append(errs, validateWebhook(field.NewPath("webhooks").Index(i), names, commonOf(w.Name, w.ClientConfig, w.Rules, w.FailurePolicy, w.MatchPolicy,
					w.NamespaceSelector, w.ObjectSelector, w.SideEffects, w.TimeoutSeconds, w.AdmissionReviewVersions, w.MatchConditions), compile)...)
			}
			return errs
		}),
		Columns: webhookColumns,
		Row: resources.TypedRow(func(c *admissionregistrationv1.ValidatingWebhookConfiguration) []any {
			return []any{c.Name, int64(len(c.Webhooks)), resources.Age(c.CreationTimestamp)}
		}),
	})
}

// defaultWebhook is Kubernetes' v1 defaulting of what both kinds share.
func defaultWebhook(fp **admissionregistrationv1.FailurePolicyType, mp **admissionregistrationv1.MatchPolicyType, ns, obj **metav1.LabelSelector,
	timeout **int32, cc *admissionregistrationv1.WebhookClientConfig, rules []admissionregistrationv1.RuleWithOperations) {
	if *fp == nil {
		*fp = ptr.To(admissionregistrationv1.Fail)
	}
	if *mp == nil {
		*mp = ptr.To(admissionregistrationv1.Equivalent)
	}
	if *ns == nil {
		*ns = &metav1.LabelSelector{}
	}
	if *obj == nil {
		*obj = &metav1.LabelSelector{}
	}
	if *timeout == nil {
		*timeout = ptr.To[int32](10)
	}
	if cc.Service != nil && cc.Service.Port == nil {
		cc.Service.Port = ptr.To[int32](443)
	}
	for i := range rules {
		if rules[i].Scope == nil {
			rules[i].Scope = ptr.To(admissionregistrationv1.AllScopes)
		}
	}
}

// common is what the two webhook kinds share, for validation.
type common struct {
	name           string
	clientConfig   admissionregistrationv1.WebhookClientConfig
	rules          []admissionregistrationv1.RuleWithOperations
	failurePolicy  *admissionregistrationv1.FailurePolicyType
	matchPolicy    *admissionregistrationv1.MatchPolicyType
	nsSel, objSel  *metav1.LabelSelector
	sideEffects    *admissionregistrationv1.SideEffectClass
	timeout        *int32
	reviewVersions []string
	conditions     []admissionregistrationv1.MatchCondition
}

func commonOf(name string, cc admissionregistrationv1.WebhookClientConfig, rules []admissionregistrationv1.RuleWithOperations, fp *admissionregistrationv1.FailurePolicyType,
	mp *admissionregistrationv1.MatchPolicyType, ns, obj *metav1.LabelSelector, se *admissionregistrationv1.SideEffectClass, timeout *int32, versions []string,
	conds []admissionregistrationv1.MatchCondition) common {
	return common{name, cc, rules, fp, mp, ns, obj, se, timeout, versions, conds}
}

func validateWebhook(p *field.Path, names sets.Set[string], w common, compile ConditionCompiler) field.ErrorList {
	var errs field.ErrorList
	errs = append(errs, validation.IsFullyQualifiedName(p.Child("name"), w.name)...)
	if names.Has(w.name) {
		errs = append(errs, field.Duplicate(p.Child("name"), w.name))
	}
	names.Insert(w.name)
	for i, r := range w.rules {
		errs = append(errs, validateRule(p.Child("rules").Index(i), r)...)
	}
	if fp := w.failurePolicy; fp != nil && *fp != admissionregistrationv1.Fail && *fp != admissionregistrationv1.Ignore {
		errs = append(errs, field.NotSupported(p.Child("failurePolicy"), *fp, []string{"Fail", "Ignore"}))
	}
	if mp := w.matchPolicy; mp != nil && *mp != admissionregistrationv1.Exact && *mp != admissionregistrationv1.Equivalent {
		errs = append(errs, field.NotSupported(p.Child("matchPolicy"), *mp, []string{"Equivalent", "Exact"}))
	}
	switch se := w.sideEffects; {
	case se == nil:
		errs = append(errs, field.Required(p.Child("sideEffects"), "must specify one of None, NoneOnDryRun"))
	case *se != admissionregistrationv1.SideEffectClassNone && *se != admissionregistrationv1.SideEffectClassNoneOnDryRun:
		errs = append(errs, field.NotSupported(p.Child("sideEffects"), *se, []string{"None", "NoneOnDryRun"}))
	}
	if t := w.timeout; t != nil && (*t < 1 || *t > 30) {
		errs = append(errs, field.Invalid(p.Child("timeoutSeconds"), *t, "the timeout value must be between 1 and 30 seconds"))
	}
	errs = append(errs, validateReviewVersions(p.Child("admissionReviewVersions"), w.reviewVersions)...)
	errs = append(errs, validateClientConfig(p.Child("clientConfig"), w.clientConfig)...)
	opts := metav1validation.LabelSelectorValidationOptions{}
	if w.nsSel != nil {
		errs = append(errs, metav1validation.ValidateLabelSelector(w.nsSel, opts, p.Child("namespaceSelector"))...)
	}
	if w.objSel != nil {
		errs = append(errs, metav1validation.ValidateLabelSelector(w.objSel, opts, p.Child("objectSelector"))...)
	}
	errs = append(errs, validateMatchConditions(p.Child("matchConditions"), w.conditions, compile)...)
	return errs
}

var operations = []string{"*", "CREATE", "UPDATE", "DELETE", "CONNECT"}

func validateRule(p *field.Path, r admissionregistrationv1.RuleWithOperations) field.ErrorList {
	var errs field.ErrorList
	if len(r.Operations) == 0 {
		errs = append(errs, field.Required(p.Child("operations"), ""))
	}
	if len(r.Operations) > 1 && slices.Contains(r.Operations, admissionregistrationv1.OperationAll) {
		errs = append(errs, field.Invalid(p.Child("operations"), r.Operations, "if '*' is present, must not specify other operations"))
	}
	for i, op := range r.Operations {
		if !slices.Contains(operations, string(op)) {
			errs = append(errs, field.NotSupported(p.Child("operations").Index(i), op, operations))
		}
	}
	errs = append(errs, validateStarList(p.Child("apiGroups"), r.APIGroups, true)...)
	errs = append(errs, validateStarList(p.Child("apiVersions"), r.APIVersions, false)...)
	if len(r.Resources) == 0 {
		errs = append(errs, field.Required(p.Child("resources"), ""))
	}
	seen := sets.New[string]()
	for i, res := range r.Resources {
		rp := p.Child("resources").Index(i)
		if res == "" {
			errs = append(errs, field.Required(rp, ""))
			continue
		}
		name, sub, hasSub := strings.Cut(res, "/")
		if hasSub && (name == "" || sub == "" || strings.Contains(sub, "/")) {
			errs = append(errs, field.Invalid(rp, res, "must be a resource, a resource/subresource, '*', '*/*' or '*/subresource'"))
		}
		if seen.Has(res) {
			errs = append(errs, field.Duplicate(rp, res))
		}
		seen.Insert(res)
	}
	if (seen.Has("*") || seen.Has("*/*")) && len(r.Resources) > 1 && (len(r.Resources) != 2 || !seen.Has("*") || !seen.Has("*/*")) {
		for _, res := range r.Resources {
			if res != "*" && res != "*/*" && !strings.HasPrefix(res, "*/") {
				errs = append(errs, field.Invalid(p.Child("resources"), r.Resources, "if '*' or '*/*' is present, resources of other names must not be specified"))
				break
			}
		}
	}
	if s := r.Scope; s != nil && *s != admissionregistrationv1.AllScopes && *s != admissionregistrationv1.ClusterScope && *s != admissionregistrationv1.NamespacedScope {
		errs = append(errs, field.NotSupported(p.Child("scope"), *s, []string{"*", "Cluster", "Namespaced"}))
	}
	return errs
}

func validateStarList(p *field.Path, list []string, emptyOK bool) field.ErrorList {
	var errs field.ErrorList
	if len(list) == 0 {
		errs = append(errs, field.Required(p, ""))
	}
	if len(list) > 1 && slices.Contains(list, "*") {
		errs = append(errs, field.Invalid(p, list, "if '*' is present, must not specify other values"))
	}
	for i, v := range list {
		if v == "" && !emptyOK {
			errs = append(errs, field.Required(p.Index(i), ""))
		}
	}
	return errs
}

func validateReviewVersions(p *field.Path, versions []string) field.ErrorList {
	var errs field.ErrorList
	if len(versions) == 0 {
		return field.ErrorList{field.Required(p, "must specify one of v1, v1beta1")}
	}
	seen := sets.New[string]()
	known := false
	for i, v := range versions {
		for _, msg := range validation.IsDNS1035Label(v) {
			errs = append(errs, field.Invalid(p.Index(i), v, msg))
		}
		if seen.Has(v) {
			errs = append(errs, field.Invalid(p.Index(i), v, "duplicate version"))
		}
		seen.Insert(v)
		known = known || v == "v1" || v == "v1beta1"
	}
	if !known {
		errs = append(errs, field.Invalid(p, versions, "must include at least one of v1, v1beta1"))
	}
	return errs
}

func validateClientConfig(p *field.Path, cc admissionregistrationv1.WebhookClientConfig) field.ErrorList {
	var errs field.ErrorList
	switch {
	case cc.URL == nil && cc.Service == nil:
		errs = append(errs, field.Required(p, "exactly one of url or service is required"))
	case cc.URL != nil && cc.Service != nil:
		errs = append(errs, field.Required(p, "exactly one of url or service is required"))
	case cc.URL != nil:
		u, err := url.Parse(*cc.URL)
		up := p.Child("url")
		switch {
		case err != nil:
			errs = append(errs, field.Invalid(up, *cc.URL, fmt.Sprintf("url must be a valid URL: %v", err)))
		case u.Scheme != "https":
			errs = append(errs, field.Invalid(up, u.Scheme, "'https' is the only allowed URL scheme"))
		case u.Host == "":
			errs = append(errs, field.Invalid(up, u.Host, "host must be specified"))
		case u.User != nil:
			errs = append(errs, field.Invalid(up, u.User.String(), "user information is not permitted in the URL"))
		case u.Fragment != "" || strings.Contains(*cc.URL, "#"):
			errs = append(errs, field.Invalid(up, u.Fragment, "fragments are not permitted in the URL"))
		case u.RawQuery != "":
			errs = append(errs, field.Invalid(up, u.RawQuery, "query parameters are not permitted in the URL"))
		}
	default:
		s, sp := cc.Service, p.Child("service")
		if s.Name == "" {
			errs = append(errs, field.Required(sp.Child("name"), "service name is required"))
		} else {
			for _, msg := range validation.IsDNS1035Label(s.Name) {
				errs = append(errs, field.Invalid(sp.Child("name"), s.Name, msg))
			}
		}
		if s.Namespace == "" {
			errs = append(errs, field.Required(sp.Child("namespace"), "service namespace is required"))
		} else {
			for _, msg := range validation.IsDNS1123Label(s.Namespace) {
				errs = append(errs, field.Invalid(sp.Child("namespace"), s.Namespace, msg))
			}
		}
		if s.Path != nil && *s.Path != "" && !strings.HasPrefix(*s.Path, "/") {
			errs = append(errs, field.Invalid(sp.Child("path"), *s.Path, "must start with a '/'"))
		}
		if s.Port != nil {
			for _, msg := range validation.IsValidPortNum(int(*s.Port)) {
				errs = append(errs, field.Invalid(sp.Child("port"), *s.Port, msg))
			}
		}
	}
	return errs
}

// maxMatchConditions is Kubernetes' limit per webhook or policy.
const maxMatchConditions = 64

func validateMatchConditions(p *field.Path, conds []admissionregistrationv1.MatchCondition, compile ConditionCompiler) field.ErrorList {
	if len(conds) == 0 {
		return nil
	}
	var errs field.ErrorList
	if len(conds) > maxMatchConditions {
		errs = append(errs, field.TooMany(p, len(conds), maxMatchConditions))
	}
	names := sets.New[string]()
	for i, c := range conds {
		cp := p.Index(i)
		if c.Name == "" {
			errs = append(errs, field.Required(cp.Child("name"), ""))
		} else {
			for _, msg := range validation.IsQualifiedName(c.Name) {
				errs = append(errs, field.Invalid(cp.Child("name"), c.Name, msg))
			}
		}
		if names.Has(c.Name) {
			errs = append(errs, field.Duplicate(cp.Child("name"), c.Name))
		}
		names.Insert(c.Name)
		if strings.TrimSpace(c.Expression) == "" {
			errs = append(errs, field.Required(cp.Child("expression"), ""))
		}
	}
	if len(errs) > 0 {
		return errs
	}
	if compile == nil {
		return field.ErrorList{field.Forbidden(p, "match conditions (CEL) are not supported by this server")}
	}
	return compile(conds, p)
}
