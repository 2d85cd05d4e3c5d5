// Package policy is admission written in CEL: webhooks' matchConditions
// and ValidatingAdmissionPolicies with their bindings. Expressions compile
// and run with k8s.io/apiserver's admission CEL packages (its variables
// object, oldObject, request, params, namespaceObject, authorizer and
// variables, its libraries and cost limits); orch's requests are handed to
// them as k8s.io/apiserver admission attributes.
//
// The CEL environment is made on first use: a cluster with no policy and
// no match condition pays nothing for it.
package policy

import (
	"context"
	"errors"
	"sync"

	"github.com/orch-dev/orch/internal/api/admission"
	"github.com/orch-dev/orch/internal/api/admission/webhook"
	"github.com/orch-dev/orch/internal/api/auth"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	apiadmission "k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/cel/environment"
)

// baseEnv is Kubernetes' CEL environment for the version orch serves.
var baseEnv = sync.OnceValue(func() *environment.EnvSet {
	return environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion())
})

// conditionCompiler compiles conditions without variables (match
// conditions of webhooks).
var conditionCompiler = sync.OnceValue(func() plugincel.ConditionCompiler {
	return plugincel.NewConditionCompiler(baseEnv())
})

// Authorizer is what the CEL authorizer variable asks.
type Authorizer interface {
	Decide(ctx context.Context, u auth.User, a auth.Attributes) (auth.Decision, string)
}

// Conditions compiles webhooks' match conditions.
type Conditions struct {
	Authz Authorizer
}

var _ webhook.Conditions = Conditions{}

func matchExpressions(conds []admissionregistrationv1.MatchCondition) []plugincel.ExpressionAccessor {
	out := make([]plugincel.ExpressionAccessor, len(conds))
	for i, c := range conds {
		out[i] = &matchconditions.MatchCondition{Name: c.Name, Expression: c.Expression}
	}
	return out
}

// Compile implements webhook.Conditions.
func (c Conditions) Compile(conds []admissionregistrationv1.MatchCondition) (webhook.Matcher, error) {
	eval := conditionCompiler().CompileCondition(matchExpressions(conds), plugincel.OptionalVariableDeclarations{HasAuthorizer: true}, environment.StoredExpressions)
	if errs := eval.CompilationErrors(); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	// Failures are decided by the webhook's policy: the matcher fails closed
	// and the dispatcher applies the policy.
	fail := admissionregistrationv1.Fail
	return &conditionMatcher{m: matchconditions.NewMatcher(eval, &fail, "webhook", "validating", ""), authz: c.Authz}, nil
}

// ValidateMatchConditions compiles conditions as they are written,
// Kubernetes' check of a webhook configuration or policy.
func ValidateMatchConditions(conds []admissionregistrationv1.MatchCondition, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, e := range matchExpressions(conds) {
		r := plugincel.NewCompiler(baseEnv()).CompileCELExpression(e, plugincel.OptionalVariableDeclarations{HasAuthorizer: true}, environment.NewExpressions)
		if r.Error != nil {
			errs = append(errs, field.Invalid(path.Index(i).Child("expression"), conds[i].Expression, r.Error.Detail))
		}
	}
	return errs
}

type conditionMatcher struct {
	m     matchconditions.Matcher
	authz Authorizer
}

func (c *conditionMatcher) Match(ctx context.Context, a *admission.Attributes) (bool, error) {
	r := c.m.Match(ctx, versioned(ctx, a), nil, authorizerFor(c.authz))
	return r.Matches, r.Error
}

// versioned is a request as k8s.io/apiserver's admission sees it.
func versioned(ctx context.Context, a *admission.Attributes) *apiadmission.VersionedAttributes {
	var info user.Info = &user.DefaultInfo{}
	if u, ok := auth.UserFrom(ctx); ok {
		info = &user.DefaultInfo{Name: u.Name, UID: u.UID, Groups: u.Groups, Extra: u.Extra}
	}
	gvk := a.Resource.GroupVersionKind
	obj, old := a.Object, a.OldObject
	if obj != nil {
		if k := obj.GetObjectKind().GroupVersionKind(); k.Kind != "" {
			gvk = k
		}
	}
	attrs := apiadmission.NewAttributesRecord(obj, old, gvk, a.Namespace, a.Name, a.Resource.GroupVersionResource(), a.Subresource,
		apiadmission.Operation(a.Operation), a.Options, a.DryRun, info)
	va := &apiadmission.VersionedAttributes{Attributes: attrs, VersionedKind: gvk}
	if obj != nil {
		va.VersionedObject.Set(withKind(obj, gvk))
	}
	if old != nil {
		va.VersionedOldObject.Set(withKind(old, gvk))
	}
	return va
}

// withKind is obj with its apiVersion and kind set, as CEL sees them.
func withKind(obj runtime.Object, gvk schema.GroupVersionKind) runtime.Object {
	if obj.GetObjectKind().GroupVersionKind().Kind != "" {
		return obj
	}
	obj = obj.DeepCopyObject()
	obj.GetObjectKind().SetGroupVersionKind(gvk)
	return obj
}

// authorizerFor is the CEL authorizer variable: checks run as the
// request's user against the cluster's authorizer.
func authorizerFor(z Authorizer) authorizer.UnconditionalAuthorizer {
	if z == nil {
		return nil
	}
	return unconditional{z}
}

type unconditional struct{ z Authorizer }

func (u unconditional) Authorize(ctx context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	var who auth.User
	if ui := a.GetUser(); ui != nil {
		who = auth.User{Name: ui.GetName(), UID: ui.GetUID(), Groups: ui.GetGroups(), Extra: ui.GetExtra()}
	}
	d, why := u.z.Decide(ctx, who, auth.Attributes{Verb: a.GetVerb(), Group: a.GetAPIGroup(), Namespace: a.GetNamespace(), Resource: a.GetResource(),
		Subresource: a.GetSubresource(), Name: a.GetName(), IsResource: a.IsResourceRequest(), Path: a.GetPath()})
	switch d {
	case auth.Allow:
		return authorizer.DecisionAllow, why, nil
	case auth.Deny:
		return authorizer.DecisionDeny, why, nil
	}
	return authorizer.DecisionNoOpinion, why, nil
}
