// Package flowcontrol describes the kinds of the
// flowcontrol.apiserver.k8s.io API group: API Priority and Fairness'
// FlowSchemas and PriorityLevelConfigurations. orch serves and keeps them
// (with Kubernetes' mandatory "exempt" and "catch-all" ones) so the tools
// and charts that read or ship them work; the server's own request limits
// (--max-requests-inflight) are what it enforces.
package flowcontrol

import (
	"strconv"

	"github.com/orch-dev/orch/internal/api/resources"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

// Resources describes the flowcontrol.apiserver.k8s.io group's kinds.
func Resources() []*resources.Resource {
	return []*resources.Resource{flowSchemas(), priorityLevels()}
}

func flowSchemas() *resources.Resource {
	return resources.Described[flowcontrolv1.FlowSchema, flowcontrolv1.FlowSchemaList](&resources.Resource{
		GroupVersionKind: resources.GVK(flowcontrolv1.GroupName, "FlowSchema"), Plural: "flowschemas", Singular: "flowschema",
		StorageKey: "flowschemas", HasSpec: true, Subresources: []resources.Subresource{resources.Status()},
		PrepareForCreate: resources.Typed(func(fs *flowcontrolv1.FlowSchema) { fs.Status = flowcontrolv1.FlowSchemaStatus{} }),
		Default: resources.Typed(func(fs *flowcontrolv1.FlowSchema) {
			if fs.Spec.MatchingPrecedence == 0 {
				fs.Spec.MatchingPrecedence = 1000
			}
		}),
		Validate: resources.TypedValidate(validateFlowSchema),
		Columns: []metav1.TableColumnDefinition{resources.NameCol,
			resources.Col("PriorityLevel", "string", 0, flowcontrolv1.FlowSchemaSpec{}.SwaggerDoc()["priorityLevelConfiguration"]),
			resources.Col("MatchingPrecedence", "string", 0, flowcontrolv1.FlowSchemaSpec{}.SwaggerDoc()["matchingPrecedence"]),
			resources.Col("DistinguisherMethod", "string", 0, flowcontrolv1.FlowSchemaSpec{}.SwaggerDoc()["distinguisherMethod"]),
			resources.AgeCol},
		Row: resources.TypedRow(func(fs *flowcontrolv1.FlowSchema) []any {
			method := "<none>"
			if fs.Spec.DistinguisherMethod != nil {
				method = string(fs.Spec.DistinguisherMethod.Type)
			}
			return []any{fs.Name, fs.Spec.PriorityLevelConfiguration.Name, fs.Spec.MatchingPrecedence, method, resources.Age(fs.CreationTimestamp)}
		}),
	})
}

// validateFlowSchema: a priority level named, a precedence from 1 to
// 10000, known distinguisher methods and subject kinds.
func validateFlowSchema(fs *flowcontrolv1.FlowSchema) field.ErrorList {
	var errs field.ErrorList
	spec := resources.SpecPath
	if fs.Spec.PriorityLevelConfiguration.Name == "" {
		errs = append(errs, field.Required(spec.Child("priorityLevelConfiguration", "name"), "must reference a priority level"))
	}
	if p := fs.Spec.MatchingPrecedence; p < 1 || p > 10000 {
		errs = append(errs, field.Invalid(spec.Child("matchingPrecedence"), p, "must be between 1 and 10000, inclusive"))
	}
	if m := fs.Spec.DistinguisherMethod; m != nil && m.Type != flowcontrolv1.FlowDistinguisherMethodByUserType && m.Type != flowcontrolv1.FlowDistinguisherMethodByNamespaceType {
		errs = append(errs, field.NotSupported(spec.Child("distinguisherMethod", "type"), m.Type,
			[]string{string(flowcontrolv1.FlowDistinguisherMethodByUserType), string(flowcontrolv1.FlowDistinguisherMethodByNamespaceType)}))
	}
	for i, rule := range fs.Spec.Rules {
		rp := spec.Child("rules").Index(i)
		if len(rule.Subjects) == 0 {
			errs = append(errs, field.Required(rp.Child("subjects"), "subjects must contain at least one value"))
		}
		for j, s := range rule.Subjects {
			sp := rp.Child("subjects").Index(j)
			switch s.Kind {
			case flowcontrolv1.SubjectKindUser:
				if s.User == nil {
					errs = append(errs, field.Required(sp.Child("user"), "user is required when subject kind is 'User'"))
				}
			case flowcontrolv1.SubjectKindGroup:
				if s.Group == nil {
					errs = append(errs, field.Required(sp.Child("group"), "group is required when subject kind is 'Group'"))
				}
			case flowcontrolv1.SubjectKindServiceAccount:
				if s.ServiceAccount == nil {
					errs = append(errs, field.Required(sp.Child("serviceAccount"), "serviceAccount is required when subject kind is 'ServiceAccount'"))
				}
			default:
				errs = append(errs, field.NotSupported(sp.Child("kind"), s.Kind,
					[]string{string(flowcontrolv1.SubjectKindUser), string(flowcontrolv1.SubjectKindGroup), string(flowcontrolv1.SubjectKindServiceAccount)}))
			}
		}
		if len(rule.ResourceRules) == 0 && len(rule.NonResourceRules) == 0 {
			errs = append(errs, field.Required(rp, "at least one of resourceRules and nonResourceRules has to be non-empty"))
		}
	}
	return errs
}

func priorityLevels() *resources.Resource {
	return resources.Described[flowcontrolv1.PriorityLevelConfiguration, flowcontrolv1.PriorityLevelConfigurationList](&resources.Resource{
		GroupVersionKind: resources.GVK(flowcontrolv1.GroupName, "PriorityLevelConfiguration"), Plural: "prioritylevelconfigurations",
		Singular: "prioritylevelconfiguration", StorageKey: "prioritylevelconfigurations", HasSpec: true,
		Subresources: []resources.Subresource{resources.Status()},
		PrepareForCreate: resources.Typed(func(pl *flowcontrolv1.PriorityLevelConfiguration) {
			pl.Status = flowcontrolv1.PriorityLevelConfigurationStatus{}
		}),
		Default:  resources.Typed(defaultPriorityLevel),
		Validate: resources.TypedValidate(validatePriorityLevel),
		Columns: []metav1.TableColumnDefinition{resources.NameCol,
			resources.Col("Type", "string", 0, flowcontrolv1.PriorityLevelConfigurationSpec{}.SwaggerDoc()["type"]),
			resources.Col("NominalConcurrencyShares", "string", 0, flowcontrolv1.LimitedPriorityLevelConfiguration{}.SwaggerDoc()["nominalConcurrencyShares"]),
			resources.AgeCol},
		Row: resources.TypedRow(func(pl *flowcontrolv1.PriorityLevelConfiguration) []any {
			shares := "<none>"
			if l := pl.Spec.Limited; l != nil && l.NominalConcurrencyShares != nil {
				shares = strconv.Itoa(int(*l.NominalConcurrencyShares))
			}
			return []any{pl.Name, string(pl.Spec.Type), shares, resources.Age(pl.CreationTimestamp)}
		}),
	})
}

// defaultPriorityLevel sets Kubernetes' defaults: 30 shares, nothing lent,
// queuing 64 queues of 50 with hand size 8.
func defaultPriorityLevel(pl *flowcontrolv1.PriorityLevelConfiguration) {
	if l := pl.Spec.Limited; l != nil {
		if l.NominalConcurrencyShares == nil {
			l.NominalConcurrencyShares = ptr.To[int32](30)
		}
		if l.LendablePercent == nil {
			l.LendablePercent = ptr.To[int32](0)
		}
		if q := l.LimitResponse.Queuing; l.LimitResponse.Type == flowcontrolv1.LimitResponseTypeQueue && q != nil {
			if q.Queues == 0 {
				q.Queues = 64
			}
			if q.HandSize == 0 {
				q.HandSize = 8
			}
			if q.QueueLengthLimit == 0 {
				q.QueueLengthLimit = 50
			}
		}
	}
	if e := pl.Spec.Exempt; e != nil {
		if e.NominalConcurrencyShares == nil {
			e.NominalConcurrencyShares = ptr.To[int32](0)
		}
		if e.LendablePercent == nil {
			e.LendablePercent = ptr.To[int32](0)
		}
	}
}

// validatePriorityLevel: Exempt or Limited, with the matching section only,
// percentages within 0-100 and queuing that fits.
func validatePriorityLevel(pl *flowcontrolv1.PriorityLevelConfiguration) field.ErrorList {
	var errs field.ErrorList
	spec := resources.SpecPath
	switch pl.Spec.Type {
	case flowcontrolv1.PriorityLevelEnablementExempt:
		if pl.Spec.Limited != nil {
			errs = append(errs, field.Forbidden(spec.Child("limited"), "must be nil if the type is not Limited"))
		}
	case flowcontrolv1.PriorityLevelEnablementLimited:
		l := pl.Spec.Limited
		if l == nil {
			return append(errs, field.Required(spec.Child("limited"), "must not be empty when type is Limited"))
		}
		if pl.Spec.Exempt != nil {
			errs = append(errs, field.Forbidden(spec.Child("exempt"), "must be nil if the type is Limited"))
		}
		lp := spec.Child("limited")
		if s := l.NominalConcurrencyShares; s != nil && *s < 0 {
			errs = append(errs, field.Invalid(lp.Child("nominalConcurrencyShares"), *s, "must be a non-negative integer"))
		}
		if p := l.LendablePercent; p != nil && (*p < 0 || *p > 100) {
			errs = append(errs, field.Invalid(lp.Child("lendablePercent"), *p, "must be between 0 and 100, inclusive"))
		}
		switch l.LimitResponse.Type {
		case flowcontrolv1.LimitResponseTypeReject:
			if l.LimitResponse.Queuing != nil {
				errs = append(errs, field.Forbidden(lp.Child("limitResponse", "queuing"), "must be nil if limited.limitResponse.type is not Limited"))
			}
		case flowcontrolv1.LimitResponseTypeQueue:
			q := l.LimitResponse.Queuing
			qp := lp.Child("limitResponse", "queuing")
			if q == nil {
				errs = append(errs, field.Required(qp, "must not be empty if limited.limitResponse.type is Limited"))
			} else if q.HandSize > q.Queues {
				errs = append(errs, field.Invalid(qp.Child("handSize"), q.HandSize, "should not be greater than queues"))
			}
		default:
			errs = append(errs, field.NotSupported(lp.Child("limitResponse", "type"), l.LimitResponse.Type,
				[]string{string(flowcontrolv1.LimitResponseTypeQueue), string(flowcontrolv1.LimitResponseTypeReject)}))
		}
	default:
		errs = append(errs, field.NotSupported(spec.Child("type"), pl.Spec.Type,
			[]string{string(flowcontrolv1.PriorityLevelEnablementExempt), string(flowcontrolv1.PriorityLevelEnablementLimited)}))
	}
	return errs
}

// Mandatory is Kubernetes' mandatory configuration: the exempt level for
// system:masters and the catch-all level every other request falls into.
func Mandatory() ([]*flowcontrolv1.PriorityLevelConfiguration, []*flowcontrolv1.FlowSchema) {
	levels := []*flowcontrolv1.PriorityLevelConfiguration{
		{ObjectMeta: metav1.ObjectMeta{Name: flowcontrolv1.PriorityLevelConfigurationNameExempt},
			Spec: flowcontrolv1.PriorityLevelConfigurationSpec{Type: flowcontrolv1.PriorityLevelEnablementExempt,
				Exempt: &flowcontrolv1.ExemptPriorityLevelConfiguration{}}},
		{ObjectMeta: metav1.ObjectMeta{Name: flowcontrolv1.PriorityLevelConfigurationNameCatchAll},
			Spec: flowcontrolv1.PriorityLevelConfigurationSpec{Type: flowcontrolv1.PriorityLevelEnablementLimited,
				Limited: &flowcontrolv1.LimitedPriorityLevelConfiguration{NominalConcurrencyShares: ptr.To[int32](5),
					LimitResponse: flowcontrolv1.LimitResponse{Type: flowcontrolv1.LimitResponseTypeReject}}}},
	}
	all := func(kind flowcontrolv1.SubjectKind, group string) flowcontrolv1.PolicyRulesWithSubjects {
		return flowcontrolv1.PolicyRulesWithSubjects{
			Subjects: []flowcontrolv1.Subject{{Kind: kind, Group: &flowcontrolv1.GroupSubject{Name: group}}},
			ResourceRules: []flowcontrolv1.ResourcePolicyRule{{Verbs: []string{"*"}, APIGroups: []string{"*"}, Resources: []string{"*"},
				ClusterScope: true, Namespaces: []string{"*"}}},
			NonResourceRules: []flowcontrolv1.NonResourcePolicyRule{{Verbs: []string{"*"}, NonResourceURLs: []string{"*"}}},
		}
	}
	schemas := []*flowcontrolv1.FlowSchema{
		{ObjectMeta: metav1.ObjectMeta{Name: flowcontrolv1.FlowSchemaNameExempt},
			Spec: flowcontrolv1.FlowSchemaSpec{PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: flowcontrolv1.PriorityLevelConfigurationNameExempt},
				MatchingPrecedence: 1, Rules: []flowcontrolv1.PolicyRulesWithSubjects{all(flowcontrolv1.SubjectKindGroup, "system:masters")}}},
		{ObjectMeta: metav1.ObjectMeta{Name: flowcontrolv1.FlowSchemaNameCatchAll},
			Spec: flowcontrolv1.FlowSchemaSpec{PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: flowcontrolv1.PriorityLevelConfigurationNameCatchAll},
				MatchingPrecedence: 10000, DistinguisherMethod: &flowcontrolv1.FlowDistinguisherMethod{Type: flowcontrolv1.FlowDistinguisherMethodByUserType},
				Rules: []flowcontrolv1.PolicyRulesWithSubjects{all(flowcontrolv1.SubjectKindGroup, "system:authenticated"), all(flowcontrolv1.SubjectKindGroup, "system:unauthenticated")}}},
	}
	for _, l := range levels {
		l.Annotations = map[string]string{flowcontrolv1.AutoUpdateAnnotationKey: "true"}
	}
	for _, s := range schemas {
		s.Annotations = map[string]string{flowcontrolv1.AutoUpdateAnnotationKey: "true"}
	}
	return levels, schemas
}
