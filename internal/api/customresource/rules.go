package customresource

import (
	"context"
	"fmt"
	"math"
	"sync"

	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	schemacel "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel/model"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/cel/environment"
)

// The CEL rules of a schema (x-kubernetes-validations) are Kubernetes':
// compiled and costed by k8s.io/apiextensions-apiserver's schema/cel
// package with k8s.io/apiserver's CEL libraries (lists, regex, URLs,
// quantities, IPs and CIDRs, formats), evaluated with its cost limits.

// Kubernetes' limits on a rule's estimated cost and on all a schema's
// rules together (apiextensions' validation, which orch does not link:
// it pulls in the generic API server's webhook client).
const (
	staticCostLimit       = 10000000
	staticSchemaCostLimit = 100000000
)

// ruleEnv is the environment new rules compile in: what the Kubernetes
// version orch serves allows. Made on first use: a cluster without rules
// pays nothing for it.
var ruleEnv = sync.OnceValue(func() *environment.EnvSet {
	return environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion())
})

// ValidateRules compiles every rule of a structural schema as Kubernetes
// does when a definition is written: a rule that does not compile, whose
// messageExpression does not, or whose estimated cost exceeds the limit
// for one rule, and a schema whose rules together exceed the limit for a
// whole schema, are refused with the rule's path.
func ValidateRules(s *structuralschema.Structural, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	var total uint64
	walkRules(s, path, true, 1, func(node *structuralschema.Structural, p *field.Path, root bool, cardinality uint64) {
		results, err := schemacel.Compile(node, model.SchemaDeclType(node, root), celconfig.PerCallLimit, ruleEnv(), schemacel.NewExpressionsEnvLoader())
		rules := p.Child("x-kubernetes-validations")
		if err != nil {
			errs = append(errs, field.InternalError(rules, fmt.Errorf("rule compiler initialization error: %w", err)))
			return
		}
		for i, r := range results {
			rp := rules.Index(i)
			if r.Error != nil {
				errs = append(errs, field.Invalid(rp.Child("rule"), node.XValidations[i].Rule, "compilation failed: "+r.Error.Detail))
				continue
			}
			if r.MessageExpressionError != nil {
				errs = append(errs, field.Invalid(rp.Child("messageExpression"), node.XValidations[i].MessageExpression, "messageExpression compilation failed: "+r.MessageExpressionError.Detail))
				continue
			}
			// Under an unbounded list or map the compiler's own worst case
			// stands, as in Kubernetes' estimate.
			card := cardinality
			if card >= unbounded {
				card = r.MaxCardinality
			}
			cost := saturatingMul(r.MaxCost+r.MessageExpressionMaxCost, card)
			if r.MaxCost > staticCostLimit {
				errs = append(errs, field.Forbidden(rp.Child("rule"), fmt.Sprintf("estimated rule cost exceeds budget by factor of %s (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)",
					factor(r.MaxCost, staticCostLimit))))
				continue
			}
			total = saturatingAdd(total, cost)
			if total > staticSchemaCostLimit {
				errs = append(errs, field.Forbidden(rp.Child("rule"), "contributed to estimated rule & messageExpression cost total exceeding cost limit for entire OpenAPIv3 schema"))
			}
		}
	})
	return errs
}

// walkRules calls visit for every node of s holding rules, with how many
// times at most the node can occur in one object (maxItems and
// maxProperties above it; unbounded lists and maps make it large).
func walkRules(s *structuralschema.Structural, p *field.Path, root bool, cardinality uint64, visit func(*structuralschema.Structural, *field.Path, bool, uint64)) {
	if s == nil {
		return
	}
	if len(s.XValidations) > 0 {
		visit(s, p, root, cardinality)
	}
	for name, prop := range s.Properties {
		walkRules(&prop, p.Child("properties").Key(name), false, cardinality, visit)
	}
	if s.Items != nil {
		walkRules(s.Items, p.Child("items"), false, min(saturatingMul(cardinality, bound(s.ValueValidation, true)), unbounded), visit)
	}
	if s.AdditionalProperties != nil && s.AdditionalProperties.Structural != nil {
		walkRules(s.AdditionalProperties.Structural, p.Child("additionalProperties"), false, min(saturatingMul(cardinality, bound(s.ValueValidation, false)), unbounded), visit)
	}
}

// unbounded stands for a list or map without maxItems or maxProperties.
const unbounded = math.MaxUint32

// bound is a list's maxItems or a map's maxProperties, or a large number
// standing for "unbounded" as Kubernetes' estimate does.
func bound(v *structuralschema.ValueValidation, list bool) uint64 {
	if v == nil {
		return unbounded
	}
	if list && v.MaxItems != nil {
		return uint64(*v.MaxItems)
	}
	if !list && v.MaxProperties != nil {
		return uint64(*v.MaxProperties)
	}
	return unbounded
}

func factor(cost, limit uint64) string {
	return fmt.Sprintf("%.1fx", float64(cost)/float64(limit))
}

func saturatingMul(a, b uint64) uint64 {
	if a != 0 && b > math.MaxUint64/a {
		return math.MaxUint64
	}
	return a * b
}

func saturatingAdd(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}

// rules evaluates a custom resource's CEL rules, with the old object on
// update (transition rules, oldSelf); nil when the schema has none. The
// rules are compiled at the first write of the kind, not when it is
// served: compiled programs are most of what a definition with many
// rules costs (the Gateway API's take about 8 MB), and a cluster may
// serve kinds it never writes.
type rules struct {
	schema    *structuralschema.Structural
	compile   sync.Once
	validator *schemacel.Validator
}

func newRules(s *structuralschema.Structural) *rules {
	has := false
	walkRules(s, nil, true, 1, func(*structuralschema.Structural, *field.Path, bool, uint64) { has = true })
	if !has {
		return nil
	}
	return &rules{schema: s}
}

func (r *rules) validate(obj, old map[string]any) field.ErrorList {
	r.compile.Do(func() { r.validator = schemacel.NewValidator(r.schema, true, celconfig.PerCallLimit) })
	if r.validator == nil {
		return nil
	}
	var oldObj any
	if old != nil {
		oldObj = old
	}
	errs, remaining := r.validator.Validate(context.Background(), nil, r.schema, obj, oldObj, celconfig.RuntimeCELCostBudget)
	if remaining < 0 {
		errs = append(errs, field.Invalid(nil, nil, "validation failed due to running out of cost budget, no further validation rules will be run"))
	}
	return errs
}
