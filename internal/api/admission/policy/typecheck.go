package policy

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/cel-go/cel"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/util/version"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	apiservercel "k8s.io/apiserver/pkg/cel"
	"k8s.io/apiserver/pkg/cel/common"
	"k8s.io/apiserver/pkg/cel/environment"
	"k8s.io/apiserver/pkg/cel/library"
	"k8s.io/apiserver/pkg/cel/openapi"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

// maxTypesToCheck bounds the kinds a policy is type checked against, as
// Kubernetes bounds it.
const maxTypesToCheck = 10

// TypeChecker checks a ValidatingAdmissionPolicy's expressions against
// the schemas of the kinds it matches, as Kubernetes' policy controller
// does: what would not compile with object typed as one of them is a
// warning in the policy's status.typeChecking.
type TypeChecker struct {
	// Kind maps a matched resource to its kind; ok is false when not served.
	Kind func(gvr schema.GroupVersionResource) (schema.GroupVersionKind, bool)
	// Schema is a kind's OpenAPI schema with its references resolved.
	Schema func(gvk schema.GroupVersionKind) (*spec.Schema, error)
}

// Check returns the policy's expression warnings (none: an empty list).
func (c TypeChecker) Check(p *admissionregistrationv1.ValidatingAdmissionPolicy) []admissionregistrationv1.ExpressionWarning {
	warnings := []admissionregistrationv1.ExpressionWarning{}
	gvks := c.typesToCheck(p)
	var types []*apiservercel.DeclType
	var checked []schema.GroupVersionKind
	for _, gvk := range gvks {
		if t := c.declType(gvk); t != nil {
			types, checked = append(types, t), append(checked, gvk)
		}
	}
	if len(checked) == 0 {
		return warnings
	}
	var params *apiservercel.DeclType
	hasParams := p.Spec.ParamKind != nil
	if hasParams {
		if gv, err := schema.ParseGroupVersion(p.Spec.ParamKind.APIVersion); err == nil {
			params = c.declType(gv.WithKind(p.Spec.ParamKind.Kind))
		}
	}
	check := func(path *field.Path, expr string) {
		var msgs []string
		for i, gvk := range checked {
			if err := compileTyped(p, types[i], params, hasParams, expr); err != "" {
				msgs = append(msgs, fmt.Sprintf("%v: %s\n", gvk, err))
			}
		}
		if len(msgs) > 0 {
			warnings = append(warnings, admissionregistrationv1.ExpressionWarning{FieldRef: path.String(), Warning: strings.Join(msgs, "\n")})
		}
	}
	for i, v := range p.Spec.Validations {
		vp := field.NewPath("spec", "validations").Index(i)
		check(vp.Child("expression"), v.Expression)
		if v.MessageExpression != "" {
			check(vp.Child("messageExpression"), v.MessageExpression)
		}
	}
	return warnings
}

func (c TypeChecker) declType(gvk schema.GroupVersionKind) *apiservercel.DeclType {
	s, err := c.Schema(gvk)
	if err != nil || s == nil {
		return nil
	}
	t := common.SchemaDeclType(&openapi.Schema{Schema: s}, true)
	if t == nil {
		return nil
	}
	return t.MaybeAssignTypeName(fmt.Sprintf("%s%d", gvk.Kind, time.Now().Nanosecond()))
}

// typesToCheck are the kinds the policy's rules name explicitly.
func (c TypeChecker) typesToCheck(p *admissionregistrationv1.ValidatingAdmissionPolicy) []schema.GroupVersionKind {
	m := p.Spec.MatchConstraints
	if m == nil {
		return nil
	}
	var out []schema.GroupVersionKind
	explicit := func(list []string) []string {
		var keep []string
		for _, s := range list {
			if s != "*" && !strings.Contains(s, "/") {
				keep = append(keep, s)
			}
		}
		slices.Sort(keep)
		return keep
	}
	for _, r := range m.ResourceRules {
		for _, g := range explicit(r.APIGroups) {
			for _, v := range explicit(r.APIVersions) {
				for _, res := range explicit(r.Resources) {
					gvk, ok := c.Kind(schema.GroupVersionResource{Group: g, Version: v, Resource: res})
					if ok && !slices.Contains(out, gvk) {
						out = append(out, gvk)
						if len(out) == maxTypesToCheck {
							return out
						}
					}
				}
			}
		}
	}
	return out
}

// compileTyped compiles expr with object and oldObject (and params) typed,
// the policy's variables declared; it returns what the compiler says, or
// "" when it compiles.
func compileTyped(p *admissionregistrationv1.ValidatingAdmissionPolicy, object, params *apiservercel.DeclType, hasParams bool, expr string) string {
	env, err := typedEnv(object, params, hasParams)
	if err != nil {
		return "type checking error: " + err.Error()
	}
	c, err := plugincel.NewCompositedCompilerForTypeChecking(env)
	if err != nil {
		return "type checking error: " + err.Error()
	}
	c.Compiler = &typeCheckingCompiler{c}
	opts := plugincel.OptionalVariableDeclarations{HasParams: hasParams, HasAuthorizer: true}
	for _, v := range p.Spec.Variables {
		c.CompileAndStoreVariable(&expression{name: v.Name, expr: v.Expression, types: anyType}, opts, environment.StoredExpressions)
	}
	r := c.CompileCELExpression(&expression{expr: expr, types: anyType}, opts, environment.StoredExpressions)
	if r.Error != nil {
		return r.Error.Detail
	}
	return ""
}

// typedEnv is Kubernetes' admission environment with object, oldObject
// and params of the given types (dyn when nil).
func typedEnv(object, params *apiservercel.DeclType, hasParams bool) (*environment.EnvSet, error) {
	request, namespace := plugincel.BuildRequestType(), plugincel.BuildNamespaceType()
	declTypes := []*apiservercel.DeclType{namespace, request}
	vars := []cel.EnvOption{cel.Variable("namespaceObject", namespace.CelType()), cel.Variable("request", request.CelType())}
	typeOf := func(t *apiservercel.DeclType) *cel.Type {
		if t == nil {
			return cel.DynType
		}
		declTypes = append(declTypes, t)
		return t.CelType()
	}
	ot := typeOf(object)
	vars = append(vars, cel.Variable("object", ot), cel.Variable("oldObject", ot))
	if hasParams {
		vars = append(vars, cel.Variable("params", typeOf(params)))
	}
	vars = append(vars, cel.Variable("authorizer", library.AuthorizerType))
	return baseEnv().Extend(environment.VersionedOptions{IntroducedVersion: version.MajorMinor(1, 0), EnvOptions: vars, DeclTypes: declTypes})
}

// typeCheckingCompiler compiles without building programs and without
// checking the result's type, as Kubernetes' type checking does.
type typeCheckingCompiler struct{ c *plugincel.CompositedCompiler }

func (t *typeCheckingCompiler) CompileCELExpression(e plugincel.ExpressionAccessor, _ plugincel.OptionalVariableDeclarations, mode environment.Type) plugincel.CompilationResult {
	env, err := t.c.Env(mode)
	if err != nil {
		return plugincel.CompilationResult{Error: &apiservercel.Error{Type: apiservercel.ErrorTypeInternal, Detail: err.Error()}, ExpressionAccessor: e}
	}
	ast, issues := env.Compile(e.GetExpression())
	if issues != nil {
		return plugincel.CompilationResult{Error: &apiservercel.Error{Type: apiservercel.ErrorTypeInvalid, Detail: issues.String()}, ExpressionAccessor: e}
	}
	return plugincel.CompilationResult{OutputType: ast.OutputType(), ExpressionAccessor: e}
}
