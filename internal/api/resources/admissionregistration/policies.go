package admissionregistration

import (
	"slices"
	"strings"

	"github.com/orch-dev/orch/internal/api/resources"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

// PolicyCompiler checks a policy's expressions (CEL) as they are written.
type PolicyCompiler func(p *admissionregistrationv1.ValidatingAdmissionPolicy) field.ErrorList

func validatingPolicies(compile PolicyCompiler) *resources.Resource {
	return resources.Described[admissionregistrationv1.ValidatingAdmissionPolicy, admissionregistrationv1.ValidatingAdmissionPolicyList](&resources.Resource{
		GroupVersionKind: resources.GVK(admissionregistrationv1.GroupName, "ValidatingAdmissionPolicy"),
		Plural:           "validatingadmissionpolicies", Singular: "validatingadmissionpolicy", StorageKey: "validatingadmissionpolicies",
		Categories: []string{"api-extensions"}, HasSpec: true, Subresources: []resources.Subresource{resources.Status()},
		PrepareForCreate: resources.Typed(func(p *admissionregistrationv1.ValidatingAdmissionPolicy) {
			p.Status = admissionregistrationv1.ValidatingAdmissionPolicyStatus{}
		}),
		Default: resources.Typed(func(p *admissionregistrationv1.ValidatingAdmissionPolicy) {
			if p.Spec.FailurePolicy == nil {
				p.Spec.FailurePolicy = ptr.To(admissionregistrationv1.Fail)
			}
			defaultMatchResources(p.Spec.MatchConstraints)
		}),
		Validate: resources.TypedValidate(func(p *admissionregistrationv1.ValidatingAdmissionPolicy) field.ErrorList {
			errs := validatePolicySpec(&p.Spec)
			if len(errs) == 0 && compile != nil {
				errs = compile(p)
			}
			return errs
		}),
		Columns: []metav1.TableColumnDefinition{resources.NameCol,
			resources.Col("Validations", "integer", 0, "The number of validations in the policy."),
			resources.Col("ParamKind", "string", 0, "The kind of the policy's parameters."), resources.AgeCol},
		Row: resources.TypedRow(func(p *admissionregistrationv1.ValidatingAdmissionPolicy) []any {
			kind := "<unset>"
			if pk := p.Spec.ParamKind; pk != nil {
				kind = pk.APIVersion + "/" + pk.Kind
			}
			return []any{p.Name, int64(len(p.Spec.Validations)), kind, resources.Age(p.CreationTimestamp)}
		}),
	})
}

func validatingPolicyBindings() *resources.Resource {
	return resources.Described[admissionregistrationv1.ValidatingAdmissionPolicyBinding, admissionregistrationv1.ValidatingAdmissionPolicyBindingList](&resources.Resource{
		GroupVersionKind: resources.GVK(admissionregistrationv1.GroupName, "ValidatingAdmissionPolicyBinding"),
		Plural:           "validatingadmissionpolicybindings", Singular: "validatingadmissionpolicybinding", StorageKey: "validatingadmissionpolicybindings",
		Categories: []string{"api-extensions"}, HasSpec: true,
		Default: resources.Typed(func(b *admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
			defaultMatchResources(b.Spec.MatchResources)
		}),
		Validate: resources.TypedValidate(validateBinding),
		Columns: []metav1.TableColumnDefinition{resources.NameCol,
			resources.Col("PolicyName", "string", 0, "The policy the binding binds."),
			resources.Col("ParamRef", "string", 0, "The parameters of the binding."), resources.AgeCol},
		Row: resources.TypedRow(func(b *admissionregistrationv1.ValidatingAdmissionPolicyBinding) []any {
			ref := "<unset>"
			if r := b.Spec.ParamRef; r != nil {
				ref = r.Name
				if r.Namespace != "" {
					ref = r.Namespace + "/" + r.Name
				}
				if r.Selector != nil {
					ref = "selector " + metav1.FormatLabelSelector(r.Selector)
				}
			}
			return []any{b.Name, b.Spec.PolicyName, ref, resources.Age(b.CreationTimestamp)}
		}),
	})
}

// defaultMatchResources is Kubernetes' defaulting of a policy's or a
// binding's match.
func defaultMatchResources(m *admissionregistrationv1.MatchResources) {
	if m == nil {
		return
	}
	if m.MatchPolicy == nil {
		m.MatchPolicy = ptr.To(admissionregistrationv1.Equivalent)
	}
	if m.NamespaceSelector == nil {
		m.NamespaceSelector = &metav1.LabelSelector{}
	}
	if m.ObjectSelector == nil {
		m.ObjectSelector = &metav1.LabelSelector{}
	}
	for _, rules := range [][]admissionregistrationv1.NamedRuleWithOperations{m.ResourceRules, m.ExcludeResourceRules} {
		for i := range rules {
			if rules[i].Scope == nil {
				rules[i].Scope = ptr.To(admissionregistrationv1.AllScopes)
			}
		}
	}
}

var reasons = []string{string(metav1.StatusReasonUnauthorized), string(metav1.StatusReasonForbidden), string(metav1.StatusReasonInvalid), string(metav1.StatusReasonRequestEntityTooLarge)}

func validatePolicySpec(s *admissionregistrationv1.ValidatingAdmissionPolicySpec) field.ErrorList {
	var errs field.ErrorList
	spec := field.NewPath("spec")
	if pk := s.ParamKind; pk != nil {
		pp := spec.Child("paramKind")
		if pk.Kind == "" {
			errs = append(errs, field.Required(pp.Child("kind"), ""))
		}
		if pk.APIVersion == "" {
			errs = append(errs, field.Required(pp.Child("apiVersion"), ""))
		} else if gv, err := schema.ParseGroupVersion(pk.APIVersion); err != nil || gv.Version == "" {
			errs = append(errs, field.Invalid(pp.Child("apiVersion"), pk.APIVersion, "must be a valid group/version"))
		}
	}
	if s.MatchConstraints == nil {
		errs = append(errs, field.Required(spec.Child("matchConstraints"), ""))
	} else {
		errs = append(errs, validateMatchResources(s.MatchConstraints, spec.Child("matchConstraints"))...)
		if len(s.MatchConstraints.ResourceRules) == 0 {
			errs = append(errs, field.Required(spec.Child("matchConstraints", "resourceRules"), ""))
		}
	}
	if fp := s.FailurePolicy; fp != nil && *fp != admissionregistrationv1.Fail && *fp != admissionregistrationv1.Ignore {
		errs = append(errs, field.NotSupported(spec.Child("failurePolicy"), *fp, []string{"Fail", "Ignore"}))
	}
	if len(s.Validations) == 0 && len(s.AuditAnnotations) == 0 {
		errs = append(errs, field.Required(spec.Child("validations"), "validations or auditAnnotations must contain at least one item"))
	}
	for i, v := range s.Validations {
		vp := spec.Child("validations").Index(i)
		if strings.TrimSpace(v.Expression) == "" {
			errs = append(errs, field.Required(vp.Child("expression"), "expression is not specified"))
		}
		if strings.Contains(v.Message, "\n") {
			errs = append(errs, field.Invalid(vp.Child("message"), v.Message, "message must not contain line breaks"))
		}
		if v.Reason != nil && !slices.Contains(reasons, string(*v.Reason)) {
			errs = append(errs, field.NotSupported(vp.Child("reason"), *v.Reason, reasons))
		}
	}
	keys := sets.New[string]()
	for i, a := range s.AuditAnnotations {
		ap := spec.Child("auditAnnotations").Index(i)
		if a.Key == "" {
			errs = append(errs, field.Required(ap.Child("key"), ""))
		} else if keys.Has(a.Key) {
			errs = append(errs, field.Duplicate(ap.Child("key"), a.Key))
		}
		keys.Insert(a.Key)
		if strings.TrimSpace(a.ValueExpression) == "" {
			errs = append(errs, field.Required(ap.Child("valueExpression"), "valueExpression is not specified"))
		}
	}
	names := sets.New[string]()
	for i, v := range s.Variables {
		vp := spec.Child("variables").Index(i)
		if v.Name == "" {
			errs = append(errs, field.Required(vp.Child("name"), ""))
		} else if len(validation.IsCIdentifier(v.Name)) > 0 {
			errs = append(errs, field.Invalid(vp.Child("name"), v.Name, "name is not a valid CEL identifier"))
		} else if names.Has(v.Name) {
			errs = append(errs, field.Duplicate(vp.Child("name"), v.Name))
		}
		names.Insert(v.Name)
		if strings.TrimSpace(v.Expression) == "" {
			errs = append(errs, field.Required(vp.Child("expression"), ""))
		}
	}
	errs = append(errs, validateMatchConditions(spec.Child("matchConditions"), s.MatchConditions, noCompile)...)
	return errs
}

// noCompile lets validateMatchConditions check names only: a policy's
// conditions compile with the rest of it.
func noCompile([]admissionregistrationv1.MatchCondition, *field.Path) field.ErrorList { return nil }

func validateMatchResources(m *admissionregistrationv1.MatchResources, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if mp := m.MatchPolicy; mp != nil && *mp != admissionregistrationv1.Exact && *mp != admissionregistrationv1.Equivalent {
		errs = append(errs, field.NotSupported(p.Child("matchPolicy"), *mp, []string{"Equivalent", "Exact"}))
	}
	opts := metav1validation.LabelSelectorValidationOptions{}
	if m.NamespaceSelector != nil {
		errs = append(errs, metav1validation.ValidateLabelSelector(m.NamespaceSelector, opts, p.Child("namespaceSelector"))...)
	}
	if m.ObjectSelector != nil {
		errs = append(errs, metav1validation.ValidateLabelSelector(m.ObjectSelector, opts, p.Child("objectSelector"))...)
	}
	for name, rules := range map[string][]admissionregistrationv1.NamedRuleWithOperations{"resourceRules": m.ResourceRules, "excludeResourceRules": m.ExcludeResourceRules} {
		for i, r := range rules {
			rp := p.Child(name).Index(i)
			errs = append(errs, validateRule(rp, r.RuleWithOperations)...)
			for j, n := range r.ResourceNames {
				for _, msg := range validation.IsDNS1123Subdomain(n) {
					errs = append(errs, field.Invalid(rp.Child("resourceNames").Index(j), n, msg))
				}
			}
		}
	}
	return errs
}

var actions = []string{string(admissionregistrationv1.Deny), string(admissionregistrationv1.Warn), string(admissionregistrationv1.Audit)}

func validateBinding(b *admissionregistrationv1.ValidatingAdmissionPolicyBinding) field.ErrorList {
	var errs field.ErrorList
	spec := field.NewPath("spec")
	if b.Spec.PolicyName == "" {
		errs = append(errs, field.Required(spec.Child("policyName"), ""))
	} else {
		for _, msg := range validation.IsDNS1123Subdomain(b.Spec.PolicyName) {
			errs = append(errs, field.Invalid(spec.Child("policyName"), b.Spec.PolicyName, msg))
		}
	}
	errs = append(errs, validateParamRef(b.Spec.ParamRef, spec.Child("paramRef"))...)
	vp := spec.Child("validationActions")
	if len(b.Spec.ValidationActions) == 0 {
		errs = append(errs, field.Required(vp, "at least one validation action is required"))
	}
	seen := sets.New[admissionregistrationv1.ValidationAction]()
	for i, a := range b.Spec.ValidationActions {
		if !slices.Contains(actions, string(a)) {
			errs = append(errs, field.NotSupported(vp.Index(i), a, actions))
		} else if seen.Has(a) {
			errs = append(errs, field.Duplicate(vp.Index(i), a))
		}
		seen.Insert(a)
	}
	if seen.Has(admissionregistrationv1.Deny) && seen.Has(admissionregistrationv1.Warn) {
		errs = append(errs, field.Invalid(vp, b.Spec.ValidationActions, "must not contain both Deny and Warn (repeating the same validation failure information in the API response and headers serves no purpose)"))
	}
	if b.Spec.MatchResources != nil {
		errs = append(errs, validateMatchResources(b.Spec.MatchResources, spec.Child("matchResources"))...)
	}
	return errs
}

// MutatingPolicyCompiler checks a mutating policy's expressions (CEL) as
// they are written.
type MutatingPolicyCompiler func(p *admissionregistrationv1.MutatingAdmissionPolicy) field.ErrorList

func mutatingPolicies(compile MutatingPolicyCompiler) *resources.Resource {
	return resources.Described[admissionregistrationv1.MutatingAdmissionPolicy, admissionregistrationv1.MutatingAdmissionPolicyList](&resources.Resource{
		GroupVersionKind: resources.GVK(admissionregistrationv1.GroupName, "MutatingAdmissionPolicy"),
		Plural:           "mutatingadmissionpolicies", Singular: "mutatingadmissionpolicy", StorageKey: "mutatingadmissionpolicies",
		Categories: []string{"api-extensions"}, HasSpec: true,
		Default: resources.Typed(func(p *admissionregistrationv1.MutatingAdmissionPolicy) {
			if p.Spec.FailurePolicy == nil {
				p.Spec.FailurePolicy = ptr.To(admissionregistrationv1.Fail)
			}
			if p.Spec.ReinvocationPolicy == "" {
				p.Spec.ReinvocationPolicy = admissionregistrationv1.NeverReinvocationPolicy
			}
			defaultMatchResources(p.Spec.MatchConstraints)
		}),
		Validate: resources.TypedValidate(func(p *admissionregistrationv1.MutatingAdmissionPolicy) field.ErrorList {
			errs := validateMutatingPolicySpec(&p.Spec)
			if len(errs) == 0 && compile != nil {
				errs = compile(p)
			}
			return errs
		}),
		Columns: []metav1.TableColumnDefinition{resources.NameCol,
			resources.Col("Mutations", "integer", 0, "The number of mutations in the policy."),
			resources.Col("ParamKind", "string", 0, "The kind of the policy's parameters."), resources.AgeCol},
		Row: resources.TypedRow(func(p *admissionregistrationv1.MutatingAdmissionPolicy) []any {
			kind := "<unset>"
			if pk := p.Spec.ParamKind; pk != nil {
				kind = pk.APIVersion + "/" + pk.Kind
			}
			return []any{p.Name, int64(len(p.Spec.Mutations)), kind, resources.Age(p.CreationTimestamp)}
		}),
	})
}

func mutatingPolicyBindings() *resources.Resource {
	return resources.Described[admissionregistrationv1.MutatingAdmissionPolicyBinding, admissionregistrationv1.MutatingAdmissionPolicyBindingList](&resources.Resource{
		GroupVersionKind: resources.GVK(admissionregistrationv1.GroupName, "MutatingAdmissionPolicyBinding"),
		Plural:           "mutatingadmissionpolicybindings", Singular: "mutatingadmissionpolicybinding", StorageKey: "mutatingadmissionpolicybindings",
		Categories: []string{"api-extensions"}, HasSpec: true,
		Default: resources.Typed(func(b *admissionregistrationv1.MutatingAdmissionPolicyBinding) {
			defaultMatchResources(b.Spec.MatchResources)
		}),
		Validate: resources.TypedValidate(func(b *admissionregistrationv1.MutatingAdmissionPolicyBinding) field.ErrorList {
			spec := field.NewPath("spec")
			var errs field.ErrorList
			if b.Spec.PolicyName == "" {
				errs = append(errs, field.Required(spec.Child("policyName"), ""))
			} else {
				for _, msg := range validation.IsDNS1123Subdomain(b.Spec.PolicyName) {
					errs = append(errs, field.Invalid(spec.Child("policyName"), b.Spec.PolicyName, msg))
				}
			}
			errs = append(errs, validateParamRef(b.Spec.ParamRef, spec.Child("paramRef"))...)
			if b.Spec.MatchResources != nil {
				errs = append(errs, validateMatchResources(b.Spec.MatchResources, spec.Child("matchResources"))...)
				errs = append(errs, createOrUpdateOnly(b.Spec.MatchResources, spec.Child("matchResources"))...)
			}
			return errs
		}),
		Columns: []metav1.TableColumnDefinition{resources.NameCol,
			resources.Col("PolicyName", "string", 0, "The policy the binding binds."), resources.AgeCol},
		Row: resources.TypedRow(func(b *admissionregistrationv1.MutatingAdmissionPolicyBinding) []any {
			return []any{b.Name, b.Spec.PolicyName, resources.Age(b.CreationTimestamp)}
		}),
	})
}

func validateMutatingPolicySpec(s *admissionregistrationv1.MutatingAdmissionPolicySpec) field.ErrorList {
	var errs field.ErrorList
	spec := field.NewPath("spec")
	if pk := s.ParamKind; pk != nil {
		pp := spec.Child("paramKind")
		if pk.Kind == "" {
			errs = append(errs, field.Required(pp.Child("kind"), ""))
		}
		if gv, err := schema.ParseGroupVersion(pk.APIVersion); pk.APIVersion == "" || err != nil || gv.Version == "" {
			errs = append(errs, field.Invalid(pp.Child("apiVersion"), pk.APIVersion, "must be a valid group/version"))
		}
	}
	if s.MatchConstraints == nil {
		errs = append(errs, field.Required(spec.Child("matchConstraints"), ""))
	} else {
		errs = append(errs, validateMatchResources(s.MatchConstraints, spec.Child("matchConstraints"))...)
		errs = append(errs, createOrUpdateOnly(s.MatchConstraints, spec.Child("matchConstraints"))...)
		if len(s.MatchConstraints.ResourceRules) == 0 {
			errs = append(errs, field.Required(spec.Child("matchConstraints", "resourceRules"), ""))
		}
	}
	if fp := s.FailurePolicy; fp != nil && *fp != admissionregistrationv1.Fail && *fp != admissionregistrationv1.Ignore {
		errs = append(errs, field.NotSupported(spec.Child("failurePolicy"), *fp, []string{"Fail", "Ignore"}))
	}
	if r := s.ReinvocationPolicy; r != "" && r != admissionregistrationv1.NeverReinvocationPolicy && r != admissionregistrationv1.IfNeededReinvocationPolicy {
		errs = append(errs, field.NotSupported(spec.Child("reinvocationPolicy"), r, []string{"Never", "IfNeeded"}))
	}
	if len(s.Mutations) == 0 {
		errs = append(errs, field.Required(spec.Child("mutations"), "mutations must contain at least one item"))
	}
	for i, m := range s.Mutations {
		mp := spec.Child("mutations").Index(i)
		switch m.PatchType {
		case admissionregistrationv1.PatchTypeApplyConfiguration:
			if m.ApplyConfiguration == nil || strings.TrimSpace(m.ApplyConfiguration.Expression) == "" {
				errs = append(errs, field.Required(mp.Child("applyConfiguration", "expression"), "required when patchType is ApplyConfiguration"))
			}
			if m.JSONPatch != nil {
				errs = append(errs, field.Forbidden(mp.Child("jsonPatch"), "must not be set when patchType is ApplyConfiguration"))
			}
		case admissionregistrationv1.PatchTypeJSONPatch:
			if m.JSONPatch == nil || strings.TrimSpace(m.JSONPatch.Expression) == "" {
				errs = append(errs, field.Required(mp.Child("jsonPatch", "expression"), "required when patchType is JSONPatch"))
			}
			if m.ApplyConfiguration != nil {
				errs = append(errs, field.Forbidden(mp.Child("applyConfiguration"), "must not be set when patchType is JSONPatch"))
			}
		default:
			errs = append(errs, field.NotSupported(mp.Child("patchType"), m.PatchType, []string{"ApplyConfiguration", "JSONPatch"}))
		}
	}
	names := sets.New[string]()
	for i, v := range s.Variables {
		vp := spec.Child("variables").Index(i)
		if v.Name == "" || len(validation.IsCIdentifier(v.Name)) > 0 {
			errs = append(errs, field.Invalid(vp.Child("name"), v.Name, "name is not a valid CEL identifier"))
		} else if names.Has(v.Name) {
			errs = append(errs, field.Duplicate(vp.Child("name"), v.Name))
		}
		names.Insert(v.Name)
	}
	return append(errs, validateMatchConditions(spec.Child("matchConditions"), s.MatchConditions, noCompile)...)
}

// createOrUpdateOnly: mutating policies act on creates and updates only,
// as Kubernetes requires of their rules.
func createOrUpdateOnly(m *admissionregistrationv1.MatchResources, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, r := range m.ResourceRules {
		for j, op := range r.Operations {
			if op != admissionregistrationv1.Create && op != admissionregistrationv1.Update {
				errs = append(errs, field.NotSupported(p.Child("resourceRules").Index(i).Child("operations").Index(j), op, []string{"CREATE", "UPDATE"}))
			}
		}
	}
	return errs
}

func validateParamRef(r *admissionregistrationv1.ParamRef, rp *field.Path) field.ErrorList {
	var errs field.ErrorList
	if r != nil {
		switch {
		case r.Name != "" && r.Selector != nil:
			errs = append(errs, field.Forbidden(rp.Child("name"), "name and selector are mutually exclusive"))
		case r.Name == "" && r.Selector == nil:
			errs = append(errs, field.Required(rp, "one of name or selector must be specified"))
		case r.Selector != nil:
			errs = append(errs, metav1validation.ValidateLabelSelector(r.Selector, metav1validation.LabelSelectorValidationOptions{}, rp.Child("selector"))...)
		}
		if r.Namespace != "" {
			for _, msg := range validation.IsDNS1123Label(r.Namespace) {
				errs = append(errs, field.Invalid(rp.Child("namespace"), r.Namespace, msg))
			}
		}
		switch a := r.ParameterNotFoundAction; {
		case a == nil:
			errs = append(errs, field.Required(rp.Child("parameterNotFoundAction"), ""))
		case *a != admissionregistrationv1.AllowAction && *a != admissionregistrationv1.DenyAction:
			errs = append(errs, field.NotSupported(rp.Child("parameterNotFoundAction"), *a, []string{"Allow", "Deny"}))
		}
	}
	return errs
}
