package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"

	"github.com/google/cel-go/cel"
	celtypes "github.com/google/cel-go/common/types"
	"github.com/orch-dev/orch/internal/api/admission"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	apiadmission "k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/cel/environment"
)

// ParamStore reads the objects of one kind a policy takes its parameters
// from.
type ParamStore interface {
	Namespaced() bool
	Get(ctx context.Context, namespace, name string) (runtime.Object, error)
	List(ctx context.Context, namespace string, selector labels.Selector) ([]runtime.Object, error)
}

// ParamKinds finds the store of a paramKind; ok is false when the kind is
// not served.
type ParamKinds func(gvk schema.GroupVersionKind) (ParamStore, bool)

// Namespaces gets a namespace, for selectors and namespaceObject.
type Namespaces func(ctx context.Context, name string) (*corev1.Namespace, error)

// env is what evaluating policies of either kind needs of the server.
type env struct {
	params     ParamKinds
	namespaces Namespaces
	authz      Authorizer
	log        *slog.Logger
}

// Validating runs the cluster's ValidatingAdmissionPolicies through their
// bindings.
type Validating struct {
	env
	set *set[*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding, *compiledPolicy]
}

// bound is one binding with its compiled policy, ready to evaluate.
type bound = binding[*admissionregistrationv1.ValidatingAdmissionPolicyBinding, *compiledPolicy]

// NewValidating returns policies' admission, empty until fed.
func NewValidating(params ParamKinds, namespaces Namespaces, authz Authorizer, log *slog.Logger) *Validating {
	return &Validating{env: env{params: params, namespaces: namespaces, authz: authz, log: log},
		set: newSet(compile,
			func(b *admissionregistrationv1.ValidatingAdmissionPolicyBinding) string { return b.Spec.PolicyName },
			func(b *admissionregistrationv1.ValidatingAdmissionPolicyBinding) *matchPart {
				if m := b.Spec.MatchResources; m != nil {
					return &matchPart{m.NamespaceSelector, m.ObjectSelector}
				}
				return nil
			})}
}

// Follower feeds the policies or the bindings from a watch.
type Follower = setFollower[*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding, *compiledPolicy]

// Policies is the watch follower of the policies.
func (v *Validating) Policies() Follower { return Follower{v.set, true} }

// Bindings is the watch follower of the bindings.
func (v *Validating) Bindings() Follower { return Follower{v.set, false} }

func selectorOf(ls *metav1.LabelSelector) (labels.Selector, error) {
	if ls == nil {
		return labels.Everything(), nil
	}
	s, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		return labels.Nothing(), err
	}
	return s, nil
}

// Active reports whether any binding binds a policy.
func (v *Validating) Active() bool { return len(v.set.bound()) > 0 }

// Mutate does nothing: these policies only judge.
func (v *Validating) Mutate(context.Context, *admission.Attributes) error { return nil }

// compiledPolicy is a policy's expressions ready to evaluate.
type compiledPolicy struct {
	policy      *admissionregistrationv1.ValidatingAdmissionPolicy
	nsSel       labels.Selector
	objSel      labels.Selector
	matcher     matchconditions.Matcher
	validations plugincel.ConditionEvaluator
	messages    plugincel.ConditionEvaluator
	messageOf   []int // index into messages' results per validation, -1 without one
	audits      plugincel.ConditionEvaluator
	// broken says why the policy cannot run (an expression that no longer
	// compiles): its failure policy decides.
	broken error
}

type expression struct {
	name, expr string
	types      []*cel.Type
}

func (e *expression) GetExpression() string    { return e.expr }
func (e *expression) ReturnTypes() []*cel.Type { return e.types }
func (e *expression) GetName() string          { return e.name }

func options(p *admissionregistrationv1.ValidatingAdmissionPolicy) plugincel.OptionalVariableDeclarations {
	return plugincel.OptionalVariableDeclarations{HasParams: p.Spec.ParamKind != nil, HasAuthorizer: true}
}

// compileWith compiles p's expressions with a fresh composited compiler
// (its variables are the policy's own); check, when set, is told of each
// expression's result with its path.
func compileWith(p *admissionregistrationv1.ValidatingAdmissionPolicy, mode environment.Type, check func(path *field.Path, expr string, r plugincel.CompilationResult)) (*plugincel.CompositedCompiler, error) {
	c, err := plugincel.NewCompositedCompiler(baseEnv())
	if err != nil {
		return nil, err
	}
	opts := options(p)
	spec := field.NewPath("spec")
	for i, v := range p.Spec.Variables {
		r := c.CompileAndStoreVariable(&expression{name: v.Name, expr: v.Expression, types: []*cel.Type{cel.AnyType}}, opts, mode)
		if check != nil {
			check(spec.Child("variables").Index(i).Child("expression"), v.Expression, r)
		}
	}
	if check != nil {
		for i, v := range p.Spec.Validations {
			vp := spec.Child("validations").Index(i)
			check(vp.Child("expression"), v.Expression, c.CompileCELExpression(&expression{expr: v.Expression, types: []*cel.Type{cel.BoolType}}, opts, mode))
			if v.MessageExpression != "" {
				check(vp.Child("messageExpression"), v.MessageExpression, c.CompileCELExpression(&expression{expr: v.MessageExpression, types: []*cel.Type{cel.StringType}}, opts, mode))
			}
		}
		for i, a := range p.Spec.AuditAnnotations {
			check(spec.Child("auditAnnotations").Index(i).Child("valueExpression"), a.ValueExpression,
				c.CompileCELExpression(&expression{expr: a.ValueExpression, types: []*cel.Type{cel.StringType, cel.NullType}}, opts, mode))
		}
		for i, m := range p.Spec.MatchConditions {
			check(spec.Child("matchConditions").Index(i).Child("expression"), m.Expression,
				c.CompileCELExpression(&expression{expr: m.Expression, types: []*cel.Type{cel.BoolType}}, opts, mode))
		}
	}
	return c, nil
}

// ValidatePolicy compiles a policy's expressions as it is written, each
// refused at its path.
func ValidatePolicy(p *admissionregistrationv1.ValidatingAdmissionPolicy) field.ErrorList {
	var errs field.ErrorList
	_, err := compileWith(p, environment.NewExpressions, func(path *field.Path, expr string, r plugincel.CompilationResult) {
		if r.Error != nil {
			errs = append(errs, field.Invalid(path, expr, r.Error.Detail))
		}
	})
	if err != nil {
		errs = append(errs, field.InternalError(field.NewPath("spec"), err))
	}
	return errs
}

// compile readies a stored policy for requests.
func compile(p *admissionregistrationv1.ValidatingAdmissionPolicy) *compiledPolicy {
	cp := &compiledPolicy{policy: p, nsSel: labels.Everything(), objSel: labels.Everything()}
	var broken []string
	c, err := compileWith(p, environment.StoredExpressions, func(path *field.Path, _ string, r plugincel.CompilationResult) {
		if r.Error != nil {
			broken = append(broken, path.String()+": "+r.Error.Detail)
		}
	})
	if err != nil {
		cp.broken = err
		return cp
	}
	if len(broken) > 0 {
		cp.broken = fmt.Errorf("the policy does not compile: %s", strings.Join(broken, "; "))
		return cp
	}
	if m := p.Spec.MatchConstraints; m != nil {
		cp.nsSel, _ = selectorOf(m.NamespaceSelector)
		cp.objSel, _ = selectorOf(m.ObjectSelector)
	}
	opts := options(p)
	var validations, messages, audits []plugincel.ExpressionAccessor
	for _, v := range p.Spec.Validations {
		validations = append(validations, &expression{expr: v.Expression, types: []*cel.Type{cel.BoolType}})
		idx := -1
		if v.MessageExpression != "" {
			idx = len(messages)
			messages = append(messages, &expression{expr: v.MessageExpression, types: []*cel.Type{cel.StringType}})
		}
		cp.messageOf = append(cp.messageOf, idx)
	}
	for _, a := range p.Spec.AuditAnnotations {
		audits = append(audits, &expression{name: a.Key, expr: a.ValueExpression, types: []*cel.Type{cel.StringType, cel.NullType}})
	}
	cp.validations = c.CompileCondition(validations, opts, environment.StoredExpressions)
	cp.messages = c.CompileCondition(messages, opts, environment.StoredExpressions)
	cp.audits = c.CompileCondition(audits, opts, environment.StoredExpressions)
	if len(p.Spec.MatchConditions) > 0 {
		cp.matcher = matchconditions.NewMatcher(c.CompileCondition(matchExpressions(p.Spec.MatchConditions), opts, environment.StoredExpressions),
			p.Spec.FailurePolicy, "policy", "validate", p.Name)
	}
	return cp
}

func (cp *compiledPolicy) failOpen() bool {
	return cp.policy.Spec.FailurePolicy != nil && *cp.policy.Spec.FailurePolicy == admissionregistrationv1.Ignore
}

// Validate evaluates every binding whose policy matches the request: the
// first failed validation of a Deny binding refuses it; Warn bindings warn
// the client; Audit bindings are logged.
func (v *Validating) Validate(ctx context.Context, a *admission.Attributes) error {
	snap := v.set.bound()
	if len(snap) == 0 || admission.Exempt(a) {
		return nil
	}
	for i := range snap {
		b := &snap[i]
		if err := v.evaluate(ctx, b, a); err != nil {
			return err
		}
	}
	return nil
}

func (v *env) nsLabels(ctx context.Context, name string) (map[string]string, error) {
	ns, err := v.namespaces(ctx, name)
	if err != nil {
		return nil, err
	}
	return ns.Labels, nil
}

// matches is Kubernetes' matching of a policy's matchConstraints or a
// binding's matchResources.
func (v *env) matches(ctx context.Context, m *admissionregistrationv1.MatchResources, nsSel, objSel labels.Selector, a *admission.Attributes) (bool, error) {
	if m == nil {
		return true, nil
	}
	ok, err := admission.SelectorsMatch(ctx, a, nsSel, objSel, v.nsLabels)
	if err != nil || !ok {
		return false, err
	}
	named := func(rules []admissionregistrationv1.NamedRuleWithOperations) bool {
		for _, r := range rules {
			if admission.RuleMatches(r.RuleWithOperations, a) && (len(r.ResourceNames) == 0 || slices.Contains(r.ResourceNames, a.Name)) {
				return true
			}
		}
		return false
	}
	if len(m.ResourceRules) > 0 && !named(m.ResourceRules) {
		return false, nil
	}
	return !named(m.ExcludeResourceRules), nil
}

// matcher is one side of a policy's matching: the policy's constraints
// or the binding's resources, with their selectors compiled.
type matcher struct {
	m             *admissionregistrationv1.MatchResources
	nsSel, objSel labels.Selector
}

// matching returns the attributes a binding's policy is evaluated with: a
// when the policy's constraints and the binding's resources match it;
// under matchPolicy Equivalent (the default), a as made through another
// served version of its resource that they match, the objects converted;
// nil when neither.
func (v *env) matching(ctx context.Context, policy, binding matcher, a *admission.Attributes) (*admission.Attributes, error) {
	var matchErr error
	both := func(at *admission.Attributes) bool {
		ok, err := v.matches(ctx, policy.m, policy.nsSel, policy.objSel, at)
		if err == nil && ok && binding.m != nil {
			ok, err = v.matches(ctx, binding.m, binding.nsSel, binding.objSel, at)
		}
		if err != nil {
			matchErr = err
		}
		return ok && err == nil
	}
	if both(a) {
		return a, nil
	}
	if matchErr != nil {
		return nil, apierrors.NewInternalError(matchErr)
	}
	if policy.m != nil && policy.m.MatchPolicy != nil && *policy.m.MatchPolicy == admissionregistrationv1.Exact {
		return nil, nil
	}
	eq := a.Equivalent(both)
	if matchErr != nil {
		return nil, apierrors.NewInternalError(matchErr)
	}
	if eq == nil {
		return nil, nil
	}
	return a.As(eq)
}

// evaluate runs one binding; a non-nil error refuses the request.
func (v *Validating) evaluate(ctx context.Context, b *bound, a *admission.Attributes) error {
	p := b.policy
	a, err := v.matching(ctx, matcher{p.policy.Spec.MatchConstraints, p.nsSel, p.objSel}, matcher{b.binding.Spec.MatchResources, b.nsSel, b.objSel}, a)
	if err != nil || a == nil {
		return err
	}
	if p.broken != nil {
		return v.failure(b, fmt.Errorf("failed to configure policy: %w", p.broken))
	}
	params, err := v.paramsFor(ctx, headerOf(b), a)
	if err != nil {
		return v.failure(b, fmt.Errorf("failed to configure binding: %w", err))
	}
	if params == nil {
		return nil // no parameters, and the binding allows that
	}
	va := versioned(ctx, a)
	var ns *corev1.Namespace
	if a.Namespace != "" && a.Resource.Namespaced {
		var err error
		if ns, err = v.namespaces(ctx, a.Namespace); err != nil && !apierrors.IsNotFound(err) {
			return apierrors.NewInternalError(err)
		}
	}
	authz := authorizerFor(v.authz)
	for _, param := range params {
		if err := v.evaluateWith(ctx, b, a, va, param.obj, ns, authz); err != nil {
			return err
		}
	}
	return nil
}

// param is one parameter object; obj is nil for a policy without
// paramKind.
type param struct{ obj runtime.Object }

// header is what finding a binding's parameters needs.
type header struct {
	policy, binding string
	paramKind       *admissionregistrationv1.ParamKind
	paramRef        *admissionregistrationv1.ParamRef
}

// paramsFor resolves a binding's parameters: nil (with no error) when
// none are found and the binding allows that. Its errors are
// configuration errors, which the policy's failure policy decides.
func (v *env) paramsFor(ctx context.Context, h header, a *admission.Attributes) ([]param, error) {
	pk := h.paramKind
	if pk == nil {
		return []param{{}}, nil
	}
	ref := h.paramRef
	if ref == nil {
		return nil, fmt.Errorf("policy %s takes parameters of kind %s but binding %s names none (spec.paramRef)", h.policy, pk.Kind, h.binding)
	}
	gv, err := schema.ParseGroupVersion(pk.APIVersion)
	if err != nil {
		return nil, fmt.Errorf("paramKind: %w", err)
	}
	store, ok := v.params(gv.WithKind(pk.Kind))
	if !ok {
		return nil, fmt.Errorf("paramKind kind `%s` not known", gv.WithKind(pk.Kind))
	}
	namespace := ""
	if store.Namespaced() {
		namespace = ref.Namespace
		if namespace == "" {
			namespace = a.Namespace
		}
		if namespace == "" {
			return nil, fmt.Errorf("cannot use namespaced paramRef in policy binding that matches cluster-scoped resources")
		}
	}
	var found []param
	if ref.Name != "" {
		obj, err := store.Get(ctx, namespace, ref.Name)
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return nil, err
		default:
			found = append(found, param{obj})
		}
	} else {
		sel, err := selectorOf(ref.Selector)
		if err != nil {
			return nil, err
		}
		objs, err := store.List(ctx, namespace, sel)
		if err != nil {
			return nil, err
		}
		for _, o := range objs {
			found = append(found, param{o})
		}
	}
	if len(found) == 0 {
		if ref.ParameterNotFoundAction != nil && *ref.ParameterNotFoundAction == admissionregistrationv1.DenyAction {
			return nil, errors.New("no params found for policy binding with `Deny` parameterNotFoundAction")
		}
		return nil, nil
	}
	return found, nil
}

// failure is what a policy that could not be evaluated does: refuse, or
// let the request through when its failure policy says Ignore.
func (v *Validating) failure(b *bound, err error) error {
	if b.policy.failOpen() {
		v.log.Warn("admission policy failed, failing open", "policy", b.policy.policy.Name, "binding", b.binding.Name, "err", err)
		return nil
	}
	return statusFor(b, err.Error(), metav1.StatusReasonInvalid)
}

func headerOf(b *bound) header {
	return header{policy: b.policy.policy.Name, binding: b.binding.Name, paramKind: b.policy.policy.Spec.ParamKind, paramRef: b.binding.Spec.ParamRef}
}

// statusFor is Kubernetes' refusal by a policy.
func statusFor(b *bound, msg string, reason metav1.StatusReason) *apierrors.StatusError {
	code := map[metav1.StatusReason]int32{metav1.StatusReasonUnauthorized: http.StatusUnauthorized, metav1.StatusReasonForbidden: http.StatusForbidden,
		metav1.StatusReasonRequestEntityTooLarge: http.StatusRequestEntityTooLarge}[reason]
	if code == 0 {
		reason, code = metav1.StatusReasonInvalid, http.StatusUnprocessableEntity
	}
	return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Reason: reason, Code: code,
		Message: fmt.Sprintf("ValidatingAdmissionPolicy '%s' with binding '%s' denied request: %s", b.policy.policy.Name, b.binding.Name, msg)}}
}

// evaluateWith evaluates the binding's policy with one parameter object.
func (v *Validating) evaluateWith(ctx context.Context, b *bound, a *admission.Attributes, va *apiadmission.VersionedAttributes, params runtime.Object, ns *corev1.Namespace, authz authorizer.UnconditionalAuthorizer) error {
	p := b.policy
	if p.matcher != nil {
		r := p.matcher.Match(ctx, va, params, authz)
		if r.Error != nil {
			return v.failure(b, fmt.Errorf("evaluating matchConditions: %w", r.Error))
		}
		if !r.Matches {
			return nil
		}
	}
	req := plugincel.CreateAdmissionRequest(va.Attributes, metav1.GroupVersionResource(va.GetResource()), metav1.GroupVersionKind(va.VersionedKind))
	inputs := plugincel.OptionalVariableBindings{VersionedParams: params, Authorizer: authz}
	results, remaining, err := p.validations.ForInput(ctx, va, req, inputs, ns, celconfig.RuntimeCELCostBudget)
	if err != nil {
		return v.failure(b, err)
	}
	var msgResults []plugincel.EvaluationResult
	for i, r := range results {
		spec := p.policy.Spec.Validations[i]
		if r.Error != nil {
			if err := v.failure(b, fmt.Errorf("expression '%s' resulted in error: %w", spec.Expression, r.Error)); err != nil {
				return err
			}
			continue
		}
		if r.EvalResult == celtypes.True {
			continue
		}
		if msgResults == nil && p.messageOf[i] >= 0 {
			msgResults, remaining, _ = p.messages.ForInput(ctx, va, req, inputs, ns, remaining)
		}
		msg := message(spec, p.messageOf[i], msgResults)
		reason := metav1.StatusReasonInvalid
		if spec.Reason != nil {
			reason = *spec.Reason
		}
		if err := v.decide(ctx, b, a, msg, reason); err != nil {
			return err
		}
	}
	if len(p.policy.Spec.AuditAnnotations) > 0 {
		audits, _, err := p.audits.ForInput(ctx, va, req, inputs, ns, remaining)
		if err == nil {
			for i, r := range audits {
				if r.Error == nil && r.EvalResult != nil {
					if s, ok := r.EvalResult.Value().(string); ok {
						v.log.Info("admission policy audit annotation", "key", p.policy.Name+"/"+p.policy.Spec.AuditAnnotations[i].Key, "value", s,
							"resource", a.Resource.Plural, "namespace", a.Namespace, "name", a.Name)
					}
				}
			}
		}
	}
	return nil
}

// message is a failed validation's message: its messageExpression's, its
// message, or Kubernetes' default naming the expression.
func message(spec admissionregistrationv1.Validation, idx int, msgs []plugincel.EvaluationResult) string {
	if idx >= 0 && idx < len(msgs) && msgs[idx].Error == nil && msgs[idx].EvalResult != nil {
		if s, ok := msgs[idx].EvalResult.Value().(string); ok && strings.TrimSpace(s) != "" && !strings.Contains(s, "\n") {
			return strings.TrimSpace(s)
		}
	}
	if spec.Message != "" {
		return spec.Message
	}
	return "failed expression: " + strings.TrimSpace(spec.Expression)
}

// decide applies the binding's validation actions to a failed validation.
func (v *Validating) decide(ctx context.Context, b *bound, a *admission.Attributes, msg string, reason metav1.StatusReason) error {
	var deny error
	for _, act := range b.binding.Spec.ValidationActions {
		switch act {
		case admissionregistrationv1.Deny:
			deny = statusFor(b, msg, reason)
		case admissionregistrationv1.Warn:
			admission.Warn(ctx, fmt.Sprintf("Validation failed for ValidatingAdmissionPolicy '%s' with binding '%s': %s", b.policy.policy.Name, b.binding.Name, msg))
		case admissionregistrationv1.Audit:
			v.log.Info("admission policy validation failed (audit)", "policy", b.policy.policy.Name, "binding", b.binding.Name, "message", msg,
				"resource", a.Resource.Plural, "namespace", a.Namespace, "name", a.Name)
		}
	}
	return deny
}
