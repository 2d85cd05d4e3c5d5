package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync"

	"github.com/google/cel-go/cel"
	"github.com/orch-dev/orch/internal/api/admission"
	"github.com/orch-dev/orch/internal/api/apply"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	apiadmission "k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/mutating/patch"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/cel/environment"
)

// Mutating runs the cluster's MutatingAdmissionPolicies through their
// bindings: each mutation (an apply configuration merged as server-side
// apply merges, or a JSON patch) made by k8s.io/apiserver's patchers.
type Mutating struct {
	env
	set *set[*admissionregistrationv1.MutatingAdmissionPolicy, *admissionregistrationv1.MutatingAdmissionPolicyBinding, *compiledMutation]
}

type compiledMutation struct {
	policy   *admissionregistrationv1.MutatingAdmissionPolicy
	compiler *plugincel.CompositedCompiler
	nsSel    labels.Selector
	objSel   labels.Selector
	matcher  matchconditions.Matcher
	patchers []patch.Patcher
	broken   error
}

type boundMutation = binding[*admissionregistrationv1.MutatingAdmissionPolicyBinding, *compiledMutation]

// NewMutating returns mutating policies' admission, empty until fed.
func NewMutating(params ParamKinds, namespaces Namespaces, authz Authorizer, log *slog.Logger) *Mutating {
	return &Mutating{env: env{params: params, namespaces: namespaces, authz: authz, log: log},
		set: newSet(compileMutation,
			func(b *admissionregistrationv1.MutatingAdmissionPolicyBinding) string { return b.Spec.PolicyName },
			func(b *admissionregistrationv1.MutatingAdmissionPolicyBinding) *matchPart {
				if m := b.Spec.MatchResources; m != nil {
					return &matchPart{m.NamespaceSelector, m.ObjectSelector}
				}
				return nil
			})}
}

// MutatingFollower feeds the policies or the bindings from a watch.
type MutatingFollower = setFollower[*admissionregistrationv1.MutatingAdmissionPolicy, *admissionregistrationv1.MutatingAdmissionPolicyBinding, *compiledMutation]

// Policies is the watch follower of the policies.
func (m *Mutating) Policies() MutatingFollower { return MutatingFollower{m.set, true} }

// Bindings is the watch follower of the bindings.
func (m *Mutating) Bindings() MutatingFollower { return MutatingFollower{m.set, false} }

// Active reports whether any binding binds a policy.
func (m *Mutating) Active() bool { return len(m.set.bound()) > 0 }

// Validate does nothing: these policies only change objects.
func (m *Mutating) Validate(context.Context, *admission.Attributes) error { return nil }

func mutationOptions(p *admissionregistrationv1.MutatingAdmissionPolicy) plugincel.OptionalVariableDeclarations {
	return plugincel.OptionalVariableDeclarations{HasParams: p.Spec.ParamKind != nil, HasAuthorizer: true}
}

// compileMutationWith compiles p's variables, match conditions and
// mutations; check, when set, is told of each expression's result.
func compileMutationWith(p *admissionregistrationv1.MutatingAdmissionPolicy, mode environment.Type, check func(*field.Path, string, plugincel.CompilationResult)) (*plugincel.CompositedCompiler, error) {
	c, err := plugincel.NewCompositedCompiler(baseEnv())
	if err != nil {
		return nil, err
	}
	opts := mutationOptions(p)
	spec := field.NewPath("spec")
	for i, v := range p.Spec.Variables {
		r := c.CompileAndStoreVariable(&expression{name: v.Name, expr: v.Expression, types: anyType}, opts, mode)
		if check != nil {
			check(spec.Child("variables").Index(i).Child("expression"), v.Expression, r)
		}
	}
	if check == nil {
		return c, nil
	}
	for i, mc := range p.Spec.MatchConditions {
		check(spec.Child("matchConditions").Index(i).Child("expression"), mc.Expression, c.CompileCELExpression(&matchconditions.MatchCondition{Name: mc.Name, Expression: mc.Expression}, opts, mode))
	}
	patchOpts := opts
	patchOpts.HasPatchTypes = true
	for i, mu := range p.Spec.Mutations {
		mp := spec.Child("mutations").Index(i)
		switch {
		case mu.PatchType == admissionregistrationv1.PatchTypeApplyConfiguration && mu.ApplyConfiguration != nil:
			check(mp.Child("applyConfiguration", "expression"), mu.ApplyConfiguration.Expression,
				c.CompileCELExpression(&patch.ApplyConfigurationCondition{Expression: mu.ApplyConfiguration.Expression}, patchOpts, mode))
		case mu.PatchType == admissionregistrationv1.PatchTypeJSONPatch && mu.JSONPatch != nil:
			check(mp.Child("jsonPatch", "expression"), mu.JSONPatch.Expression,
				c.CompileCELExpression(&patch.JSONPatchCondition{Expression: mu.JSONPatch.Expression}, patchOpts, mode))
		}
	}
	return c, nil
}

// ValidateMutatingPolicy compiles a mutating policy's expressions as it is
// written, each refused at its path.
func ValidateMutatingPolicy(p *admissionregistrationv1.MutatingAdmissionPolicy) field.ErrorList {
	var errs field.ErrorList
	if _, err := compileMutationWith(p, environment.NewExpressions, func(path *field.Path, expr string, r plugincel.CompilationResult) {
		if r.Error != nil {
			errs = append(errs, field.Invalid(path, expr, r.Error.Detail))
		}
	}); err != nil {
		errs = append(errs, field.InternalError(field.NewPath("spec"), err))
	}
	return errs
}

func compileMutation(p *admissionregistrationv1.MutatingAdmissionPolicy) *compiledMutation {
	cm := &compiledMutation{policy: p, nsSel: labels.Everything(), objSel: labels.Everything()}
	c, err := compileMutationWith(p, environment.StoredExpressions, nil)
	if err != nil {
		cm.broken = err
		return cm
	}
	cm.compiler = c
	if mr := p.Spec.MatchConstraints; mr != nil {
		cm.nsSel, _ = selectorOf(mr.NamespaceSelector)
		cm.objSel, _ = selectorOf(mr.ObjectSelector)
	}
	opts := mutationOptions(p)
	if len(p.Spec.MatchConditions) > 0 {
		cm.matcher = matchconditions.NewMatcher(c.CompileCondition(matchExpressions(p.Spec.MatchConditions), opts, environment.StoredExpressions),
			p.Spec.FailurePolicy, "policy", "validate", p.Name)
	}
	patchOpts := opts
	patchOpts.HasPatchTypes = true
	for _, mu := range p.Spec.Mutations {
		switch {
		case mu.PatchType == admissionregistrationv1.PatchTypeApplyConfiguration && mu.ApplyConfiguration != nil:
			cm.patchers = append(cm.patchers, patch.NewApplyConfigurationPatcher(c.CompileMutatingEvaluator(
				&patch.ApplyConfigurationCondition{Expression: mu.ApplyConfiguration.Expression}, patchOpts, environment.StoredExpressions)))
		case mu.PatchType == admissionregistrationv1.PatchTypeJSONPatch && mu.JSONPatch != nil:
			cm.patchers = append(cm.patchers, patch.NewJSONPatcher(c.CompileMutatingEvaluator(
				&patch.JSONPatchCondition{Expression: mu.JSONPatch.Expression}, patchOpts, environment.StoredExpressions)))
		default:
			cm.broken = fmt.Errorf("mutation of unknown patchType %q", mu.PatchType)
		}
	}
	return cm
}

// objectInterfaces are the scheme of the built-in kinds, as k8s.io/apiserver's
// patchers decode and convert with.
var objectInterfaces = sync.OnceValue(func() apiadmission.ObjectInterfaces {
	s, _ := apply.Builtin()
	return apiadmission.NewObjectInterfacesFromScheme(s)
})

// Mutate applies every bound policy that matches a, in binding order;
// policies that ask to be reinvoked run once more when a later one changed
// the object.
func (m *Mutating) Mutate(ctx context.Context, a *admission.Attributes) error {
	snap := m.set.bound()
	if len(snap) == 0 || admission.Exempt(a) || !a.OwnKind() {
		return nil
	}
	var reinvoke []*boundMutation
	changedAfter := map[*boundMutation]bool{}
	for i := range snap {
		b := &snap[i]
		changed, err := m.apply(ctx, b, a)
		if err != nil {
			return err
		}
		if changed {
			for prev := range changedAfter {
				changedAfter[prev] = true
			}
		}
		if b.policy.policy.Spec.ReinvocationPolicy == admissionregistrationv1.IfNeededReinvocationPolicy {
			changedAfter[b] = false
			reinvoke = append(reinvoke, b)
		}
	}
	for _, b := range reinvoke {
		if changedAfter[b] {
			if _, err := m.apply(ctx, b, a); err != nil {
				return err
			}
		}
	}
	return nil
}

// failure is a mutating policy's configuration or evaluation error: the
// request refused (403) unless the policy's failure policy is Ignore.
func (m *Mutating) failure(b *boundMutation, err error) error {
	p := b.policy.policy
	if p.Spec.FailurePolicy != nil && *p.Spec.FailurePolicy == admissionregistrationv1.Ignore {
		m.log.Warn("mutating admission policy failed, failing open", "policy", p.Name, "binding", b.binding.Name, "err", err)
		return nil
	}
	msg := fmt.Sprintf("policy '%s' with binding '%s' denied request: %v", p.Name, b.binding.Name, err)
	return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 403, Reason: metav1.StatusReasonInvalid, Message: msg,
		Details: &metav1.StatusDetails{Name: "", Causes: []metav1.StatusCause{{Message: msg}}}}}
}

// apply runs one binding's policy; it reports whether the object changed.
// A policy matched through another version of a's resource mutates the
// object converted to that version, and what it changed is converted
// back.
func (m *Mutating) apply(ctx context.Context, b *boundMutation, a *admission.Attributes) (bool, error) {
	at, err := m.matching(ctx, matcher{b.policy.policy.Spec.MatchConstraints, b.policy.nsSel, b.policy.objSel},
		matcher{b.binding.Spec.MatchResources, b.nsSel, b.objSel}, a)
	if err != nil || at == nil {
		return false, err
	}
	changed, err := m.applyTo(ctx, b, at)
	if err != nil || !changed || at == a {
		return changed, err
	}
	back, err := a.Resource.FromStorage(at.Object)
	if err != nil {
		return false, m.failure(b, fmt.Errorf("converting the mutated object back to %s: %w", a.Resource.GroupVersion(), err))
	}
	a.Replace(back)
	return true, nil
}

// applyTo runs one binding's policy on a, which it matches.
func (m *Mutating) applyTo(ctx context.Context, b *boundMutation, a *admission.Attributes) (bool, error) {
	p := b.policy
	if p.broken != nil {
		return false, m.failure(b, fmt.Errorf("failed to configure policy: %w", p.broken))
	}
	params, err := m.paramsFor(ctx, header{policy: p.policy.Name, binding: b.binding.Name, paramKind: p.policy.Spec.ParamKind, paramRef: b.binding.Spec.ParamRef}, a)
	if err != nil {
		return false, m.failure(b, fmt.Errorf("failed to configure binding: %w", err))
	}
	var ns *corev1.Namespace
	if a.Namespace != "" && a.Resource.Namespaced {
		if ns, err = m.namespaces(ctx, a.Namespace); err != nil && !apierrors.IsNotFound(err) {
			return false, apierrors.NewInternalError(err)
		}
	}
	tc := a.Resource.TypeConverter
	if tc == nil {
		_, tc = apply.Builtin()
	}
	authz := authorizerFor(m.authz)
	changed := false
	for _, param := range params {
		va := versioned(ctx, a)
		if p.matcher != nil {
			r := p.matcher.Match(ctx, va, param.obj, authz)
			if r.Error != nil {
				return false, m.failure(b, r.Error)
			}
			if !r.Matches {
				continue
			}
		}
		pctx := p.compiler.CreateContext(ctx)
		before := va.VersionedObject.Object()
		for _, patcher := range p.patchers {
			out, err := patcher.Patch(pctx, patch.Request{MatchedResource: a.Resource.GroupVersionResource(), VersionedAttributes: va,
				ObjectInterfaces: objectInterfaces(), OptionalVariables: plugincel.OptionalVariableBindings{VersionedParams: param.obj, Authorizer: authz},
				Namespace: ns, TypeConverter: tc}, celconfig.RuntimeCELCostBudget)
			if err != nil {
				var se *apierrors.StatusError
				if ok := asStatus(err, &se); ok {
					return false, se
				}
				return false, m.failure(b, err)
			}
			if out, err = typedLike(a, out); err != nil {
				return false, m.failure(b, err)
			}
			if a.Resource.Default != nil {
				a.Resource.Default(out)
			}
			va.UpdateObject(out)
		}
		if after := va.VersionedObject.Object(); !apiequality.Semantic.DeepEqual(before, after) {
			a.Replace(after)
			changed = true
		}
	}
	return changed, nil
}

var anyType = []*cel.Type{cel.AnyType}

func asStatus(err error, target **apierrors.StatusError) bool { return errors.As(err, target) }

// typedLike is a patcher's result as an object of a.Object's type.
func typedLike(a *admission.Attributes, out runtime.Object) (runtime.Object, error) {
	u, isU := out.(*unstructured.Unstructured)
	if _, want := a.Object.(*unstructured.Unstructured); want || !isU {
		return out, nil
	}
	fresh := reflect.New(reflect.TypeOf(a.Object).Elem()).Interface().(runtime.Object)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, fresh); err != nil {
		return nil, fmt.Errorf("the mutated object does not decode: %w", err)
	}
	return fresh, nil
}
