// Package autoscaling describes the autoscaling API group's
// HorizontalPodAutoscalers: stored as autoscaling/v2, also served as
// autoscaling/v1 (a CPU target), as Kubernetes serves them.
package autoscaling

import (
	"fmt"
	"slices"
	"strings"

	"github.com/orch-dev/orch/internal/api/resources"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

// DefaultCPUUtilization is the target of an autoscaler that names no
// metric.
const DefaultCPUUtilization = 80

// Resources describes the autoscaling group's kinds: v2 first, the
// preferred version.
func Resources() []*resources.Resource {
	return []*resources.Resource{horizontalPodAutoscalers(), horizontalPodAutoscalersV1()}
}

func horizontalPodAutoscalers() *resources.Resource {
	return resources.Described[autoscalingv2.HorizontalPodAutoscaler, autoscalingv2.HorizontalPodAutoscalerList](&resources.Resource{
		GroupVersionKind: schema.GroupVersionKind{Group: "autoscaling", Version: "v2", Kind: "HorizontalPodAutoscaler"},
		Plural:           "horizontalpodautoscalers", Singular: "horizontalpodautoscaler", Namespaced: true, ShortNames: []string{"hpa"},
		Categories: []string{"all"}, StorageKey: "horizontalpodautoscalers", StatusMetadata: resources.StatusMetadataAll,
		Subresources: []resources.Subresource{resources.Status()}, HasSpec: true,
		Default:  resources.Typed(Default),
		Validate: resources.TypedValidate(validate),
		PrepareForCreate: resources.Typed(func(h *autoscalingv2.HorizontalPodAutoscaler) {
			h.Status = autoscalingv2.HorizontalPodAutoscalerStatus{}
		}),
		Columns: columns, Row: resources.TypedRow(row),
	})
}

// Default is Kubernetes' defaulting of an autoscaler: one replica at
// least, CPU at 80% when no metric is named, and, once a behavior is
// given, every rule it leaves out.
func Default(h *autoscalingv2.HorizontalPodAutoscaler) {
	if h.Spec.MinReplicas == nil {
		h.Spec.MinReplicas = ptr.To[int32](1)
	}
	if len(h.Spec.Metrics) == 0 {
		h.Spec.Metrics = []autoscalingv2.MetricSpec{{Type: autoscalingv2.ResourceMetricSourceType, Resource: &autoscalingv2.ResourceMetricSource{
			Name: corev1.ResourceCPU, Target: autoscalingv2.MetricTarget{Type: autoscalingv2.UtilizationMetricType, AverageUtilization: ptr.To[int32](DefaultCPUUtilization)}}}}
	}
	if b := h.Spec.Behavior; b != nil {
		b.ScaleUp = defaultRules(b.ScaleUp, ScaleUpRules())
		b.ScaleDown = defaultRules(b.ScaleDown, ScaleDownRules())
	}
}

// ScaleUpRules are Kubernetes' default scale-up rules: at once, by four
// pods or doubling (whichever is more) every 15 seconds.
func ScaleUpRules() *autoscalingv2.HPAScalingRules {
	return &autoscalingv2.HPAScalingRules{StabilizationWindowSeconds: ptr.To[int32](0), SelectPolicy: ptr.To(autoscalingv2.MaxChangePolicySelect),
		Policies: []autoscalingv2.HPAScalingPolicy{{Type: autoscalingv2.PodsScalingPolicy, Value: 4, PeriodSeconds: 15}, {Type: autoscalingv2.PercentScalingPolicy, Value: 100, PeriodSeconds: 15}}}
}

// ScaleDownRules are Kubernetes' default scale-down rules: after five
// minutes of lower recommendations, down to what is needed at once.
func ScaleDownRules() *autoscalingv2.HPAScalingRules {
	return &autoscalingv2.HPAScalingRules{StabilizationWindowSeconds: ptr.To[int32](300), SelectPolicy: ptr.To(autoscalingv2.MaxChangePolicySelect),
		Policies: []autoscalingv2.HPAScalingPolicy{{Type: autoscalingv2.PercentScalingPolicy, Value: 100, PeriodSeconds: 15}}}
}

func defaultRules(r, def *autoscalingv2.HPAScalingRules) *autoscalingv2.HPAScalingRules {
	if r == nil {
		return def
	}
	if r.StabilizationWindowSeconds == nil {
		r.StabilizationWindowSeconds = def.StabilizationWindowSeconds
	}
	if r.SelectPolicy == nil {
		r.SelectPolicy = def.SelectPolicy
	}
	if r.Policies == nil {
		r.Policies = def.Policies
	}
	return r
}

// validate is Kubernetes' validation of an autoscaler: a target by kind
// and name, replica bounds, well-formed metrics and behavior.
func validate(h *autoscalingv2.HorizontalPodAutoscaler) field.ErrorList {
	spec, path := &h.Spec, resources.SpecPath
	var errs field.ErrorList
	ref, refPath := spec.ScaleTargetRef, path.Child("scaleTargetRef")
	if ref.Kind == "" {
		errs = append(errs, field.Required(refPath.Child("kind"), ""))
	} else {
		for _, msg := range resources.PathSegmentName(ref.Kind, false) {
			errs = append(errs, field.Invalid(refPath.Child("kind"), ref.Kind, msg))
		}
	}
	if ref.Name == "" {
		errs = append(errs, field.Required(refPath.Child("name"), ""))
	} else {
		for _, msg := range resources.PathSegmentName(ref.Name, false) {
			errs = append(errs, field.Invalid(refPath.Child("name"), ref.Name, msg))
		}
	}
	if spec.MinReplicas != nil && *spec.MinReplicas < 1 {
		errs = append(errs, field.Invalid(path.Child("minReplicas"), *spec.MinReplicas, "must be greater than or equal to 1"))
	}
	if spec.MaxReplicas < 1 {
		errs = append(errs, field.Invalid(path.Child("maxReplicas"), spec.MaxReplicas, "must be greater than 0"))
	}
	if spec.MinReplicas != nil && spec.MaxReplicas < *spec.MinReplicas {
		errs = append(errs, field.Invalid(path.Child("maxReplicas"), spec.MaxReplicas, "must be greater than or equal to `minReplicas`"))
	}
	for i := range spec.Metrics {
		errs = append(errs, validateMetric(&spec.Metrics[i], path.Child("metrics").Index(i))...)
	}
	if b := spec.Behavior; b != nil {
		errs = append(errs, validateRules(b.ScaleUp, path.Child("behavior", "scaleUp"))...)
		errs = append(errs, validateRules(b.ScaleDown, path.Child("behavior", "scaleDown"))...)
	}
	return errs
}

var metricTypes = []string{string(autoscalingv2.ContainerResourceMetricSourceType), string(autoscalingv2.ExternalMetricSourceType),
	string(autoscalingv2.ObjectMetricSourceType), string(autoscalingv2.PodsMetricSourceType), string(autoscalingv2.ResourceMetricSourceType)}

func validateMetric(m *autoscalingv2.MetricSpec, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	set := map[autoscalingv2.MetricSourceType]bool{
		autoscalingv2.ObjectMetricSourceType: m.Object != nil, autoscalingv2.PodsMetricSourceType: m.Pods != nil,
		autoscalingv2.ResourceMetricSourceType: m.Resource != nil, autoscalingv2.ContainerResourceMetricSourceType: m.ContainerResource != nil,
		autoscalingv2.ExternalMetricSourceType: m.External != nil,
	}
	n := 0
	for _, v := range set {
		if v {
			n++
		}
	}
	switch {
	case m.Type == "":
		return append(errs, field.Required(p.Child("type"), "must specify a metric source type"))
	case !slices.Contains(metricTypes, string(m.Type)):
		return append(errs, field.NotSupported(p.Child("type"), m.Type, metricTypes))
	case !set[m.Type]:
		return append(errs, field.Required(p.Child(lowerFirst(string(m.Type))), "must populate information for the given metric source"))
	case n > 1:
		errs = append(errs, field.Forbidden(p, "must populate the given metric source only"))
	}
	switch m.Type {
	case autoscalingv2.ResourceMetricSourceType:
		errs = append(errs, validateResourceTarget(string(m.Resource.Name), m.Resource.Target, p.Child("resource"))...)
	case autoscalingv2.ContainerResourceMetricSourceType:
		cp := p.Child("containerResource")
		if m.ContainerResource.Container == "" {
			errs = append(errs, field.Required(cp.Child("container"), "must specify a container"))
		}
		errs = append(errs, validateResourceTarget(string(m.ContainerResource.Name), m.ContainerResource.Target, cp)...)
	case autoscalingv2.PodsMetricSourceType:
		errs = append(errs, validateMetricIdentifier(m.Pods.Metric, p.Child("pods", "metric"))...)
		errs = append(errs, validateTarget(m.Pods.Target, p.Child("pods", "target"))...)
		if m.Pods.Target.AverageValue == nil {
			errs = append(errs, field.Required(p.Child("pods", "target", "averageValue"), "must specify a positive target averageValue"))
		}
	case autoscalingv2.ObjectMetricSourceType:
		op := p.Child("object")
		if m.Object.DescribedObject.Kind == "" {
			errs = append(errs, field.Required(op.Child("describedObject", "kind"), ""))
		}
		if m.Object.DescribedObject.Name == "" {
			errs = append(errs, field.Required(op.Child("describedObject", "name"), ""))
		}
		errs = append(errs, validateMetricIdentifier(m.Object.Metric, op.Child("metric"))...)
		errs = append(errs, validateTarget(m.Object.Target, op.Child("target"))...)
		if m.Object.Target.Value == nil && m.Object.Target.AverageValue == nil {
			errs = append(errs, field.Required(op.Child("target", "averageValue"), "must set either a target value or averageValue"))
		}
	case autoscalingv2.ExternalMetricSourceType:
		ep := p.Child("external")
		errs = append(errs, validateMetricIdentifier(m.External.Metric, ep.Child("metric"))...)
		errs = append(errs, validateTarget(m.External.Target, ep.Child("target"))...)
		if m.External.Target.Value == nil && m.External.Target.AverageValue == nil {
			errs = append(errs, field.Required(ep.Child("target", "averageValue"), "must set either a target value for metric or a per-pod target"))
		}
		if m.External.Target.Value != nil && m.External.Target.AverageValue != nil {
			errs = append(errs, field.Forbidden(ep.Child("target", "value"), "may not set both a target value for metric and a per-pod target"))
		}
	}
	return errs
}

func validateResourceTarget(name string, t autoscalingv2.MetricTarget, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if name == "" {
		errs = append(errs, field.Required(p.Child("name"), "must specify a resource name"))
	}
	errs = append(errs, validateTarget(t, p.Child("target"))...)
	tp := p.Child("target")
	switch {
	case t.AverageUtilization == nil && t.AverageValue == nil:
		errs = append(errs, field.Required(tp.Child("averageUtilization"), "must set either a target raw value or a target utilization"))
	case t.AverageUtilization != nil && t.AverageValue != nil:
		errs = append(errs, field.Forbidden(tp.Child("averageValue"), "may not set both a target raw value and a target utilization"))
	}
	return errs
}

func validateMetricIdentifier(id autoscalingv2.MetricIdentifier, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if id.Name == "" {
		errs = append(errs, field.Required(p.Child("name"), "must specify a metric name"))
	} else {
		for _, msg := range resources.PathSegmentName(id.Name, false) {
			errs = append(errs, field.Invalid(p.Child("name"), id.Name, msg))
		}
	}
	return append(errs, metav1validation.ValidateLabelSelector(id.Selector, metav1validation.LabelSelectorValidationOptions{}, p.Child("selector"))...)
}

var targetTypes = []string{string(autoscalingv2.AverageValueMetricType), string(autoscalingv2.UtilizationMetricType), string(autoscalingv2.ValueMetricType)}

func validateTarget(t autoscalingv2.MetricTarget, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if t.Type == "" {
		errs = append(errs, field.Required(p.Child("type"), "must specify a metric target type"))
	} else if !slices.Contains(targetTypes, string(t.Type)) {
		errs = append(errs, field.NotSupported(p.Child("type"), t.Type, targetTypes))
	}
	positive := func(q *resource.Quantity, name string) {
		if q != nil && q.Sign() <= 0 {
			errs = append(errs, field.Invalid(p.Child(name), q.String(), "must be positive"))
		}
	}
	positive(t.Value, "value")
	positive(t.AverageValue, "averageValue")
	if t.AverageUtilization != nil && *t.AverageUtilization < 1 {
		errs = append(errs, field.Invalid(p.Child("averageUtilization"), *t.AverageUtilization, "must be greater than 0"))
	}
	return errs
}

const maxPeriodSeconds, maxStabilizationWindowSeconds = 1800, 3600

var selectPolicies = []string{string(autoscalingv2.DisabledPolicySelect), string(autoscalingv2.MaxChangePolicySelect), string(autoscalingv2.MinChangePolicySelect)}

func validateRules(r *autoscalingv2.HPAScalingRules, p *field.Path) field.ErrorList {
	if r == nil {
		return nil
	}
	var errs field.ErrorList
	if w := r.StabilizationWindowSeconds; w != nil {
		if *w < 0 {
			errs = append(errs, field.Invalid(p.Child("stabilizationWindowSeconds"), *w, "must be greater than or equal to zero"))
		} else if *w > maxStabilizationWindowSeconds {
			errs = append(errs, field.Invalid(p.Child("stabilizationWindowSeconds"), *w, fmt.Sprintf("must be less than or equal to %v", maxStabilizationWindowSeconds)))
		}
	}
	if s := r.SelectPolicy; s != nil && !slices.Contains(selectPolicies, string(*s)) {
		errs = append(errs, field.NotSupported(p.Child("selectPolicy"), *s, selectPolicies))
	}
	if len(r.Policies) == 0 {
		errs = append(errs, field.Required(p.Child("policies"), "must specify at least one Policy"))
	}
	for i, pol := range r.Policies {
		pp := p.Child("policies").Index(i)
		if pol.Type != autoscalingv2.PodsScalingPolicy && pol.Type != autoscalingv2.PercentScalingPolicy {
			errs = append(errs, field.NotSupported(pp.Child("type"), pol.Type, []string{string(autoscalingv2.PercentScalingPolicy), string(autoscalingv2.PodsScalingPolicy)}))
		}
		if pol.Value <= 0 {
			errs = append(errs, field.Invalid(pp.Child("value"), pol.Value, "must be greater than zero"))
		}
		if pol.PeriodSeconds <= 0 {
			errs = append(errs, field.Invalid(pp.Child("periodSeconds"), pol.PeriodSeconds, "must be greater than zero"))
		} else if pol.PeriodSeconds > maxPeriodSeconds {
			errs = append(errs, field.Invalid(pp.Child("periodSeconds"), pol.PeriodSeconds, fmt.Sprintf("must be less than or equal to %v", maxPeriodSeconds)))
		}
	}
	return errs
}

func lowerFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToLower(s[:1]) + s[1:]
}

var columns = []metav1.TableColumnDefinition{
	resources.NameCol,
	resources.Col("Reference", "string", 0, autoscalingv2.HorizontalPodAutoscalerSpec{}.SwaggerDoc()["scaleTargetRef"]),
	resources.Col("Targets", "string", 0, autoscalingv2.HorizontalPodAutoscalerSpec{}.SwaggerDoc()["metrics"]),
	resources.Col("MinPods", "string", 0, autoscalingv2.HorizontalPodAutoscalerSpec{}.SwaggerDoc()["minReplicas"]),
	resources.Col("MaxPods", "integer", 0, autoscalingv2.HorizontalPodAutoscalerSpec{}.SwaggerDoc()["maxReplicas"]),
	resources.Col("Replicas", "integer", 0, autoscalingv2.HorizontalPodAutoscalerStatus{}.SwaggerDoc()["currentReplicas"]),
	resources.AgeCol,
}

func row(h *autoscalingv2.HorizontalPodAutoscaler) []any {
	minPods := "<unset>"
	if h.Spec.MinReplicas != nil {
		minPods = fmt.Sprint(*h.Spec.MinReplicas)
	}
	return []any{h.Name, h.Spec.ScaleTargetRef.Kind + "/" + h.Spec.ScaleTargetRef.Name, Targets(h.Spec.Metrics, h.Status.CurrentMetrics),
		minPods, int64(h.Spec.MaxReplicas), int64(h.Status.CurrentReplicas), resources.Age(h.CreationTimestamp)}
}

// Targets words an autoscaler's metrics as `kubectl get hpa` shows them:
// "cpu: 35%/50%", the current value <unknown> until measured; past two,
// how many more.
func Targets(specs []autoscalingv2.MetricSpec, statuses []autoscalingv2.MetricStatus) string {
	var list []string
	const shown = 2
	for i, spec := range specs {
		if len(list) == shown {
			return strings.Join(list, ", ") + fmt.Sprintf(" + %d more...", len(specs)-shown)
		}
		var st *autoscalingv2.MetricStatus
		if i < len(statuses) {
			st = &statuses[i]
		}
		current := "<unknown>"
		switch spec.Type {
		case autoscalingv2.ResourceMetricSourceType, autoscalingv2.ContainerResourceMetricSourceType:
			name, target := resourceMetric(spec)
			var cur *autoscalingv2.MetricValueStatus
			if st != nil && st.Resource != nil {
				cur = &st.Resource.Current
			} else if st != nil && st.ContainerResource != nil {
				cur = &st.ContainerResource.Current
			}
			if target.AverageValue != nil {
				if cur != nil && cur.AverageValue != nil {
					current = cur.AverageValue.String()
				}
				list = append(list, fmt.Sprintf("%s: %s/%s", name, current, target.AverageValue.String()))
				continue
			}
			if cur != nil && cur.AverageUtilization != nil {
				current = fmt.Sprintf("%d%%", *cur.AverageUtilization)
			}
			want := "<auto>"
			if target.AverageUtilization != nil {
				want = fmt.Sprintf("%d%%", *target.AverageUtilization)
			}
			list = append(list, fmt.Sprintf("%s: %s/%s", name, current, want))
		case autoscalingv2.PodsMetricSourceType:
			if st != nil && st.Pods != nil && st.Pods.Current.AverageValue != nil {
				current = st.Pods.Current.AverageValue.String()
			}
			list = append(list, fmt.Sprintf("%s/%s", current, quantityOr(spec.Pods.Target.AverageValue)))
		case autoscalingv2.ObjectMetricSourceType:
			if spec.Object.Target.AverageValue != nil {
				if st != nil && st.Object != nil && st.Object.Current.AverageValue != nil {
					current = st.Object.Current.AverageValue.String()
				}
				list = append(list, fmt.Sprintf("%s/%s (avg)", current, spec.Object.Target.AverageValue.String()))
				continue
			}
			if st != nil && st.Object != nil && st.Object.Current.Value != nil {
				current = st.Object.Current.Value.String()
			}
			list = append(list, fmt.Sprintf("%s/%s", current, quantityOr(spec.Object.Target.Value)))
		case autoscalingv2.ExternalMetricSourceType:
			if spec.External.Target.AverageValue != nil {
				if st != nil && st.External != nil && st.External.Current.AverageValue != nil {
					current = st.External.Current.AverageValue.String()
				}
				list = append(list, fmt.Sprintf("%s/%s (avg)", current, spec.External.Target.AverageValue.String()))
				continue
			}
			if st != nil && st.External != nil && st.External.Current.Value != nil {
				current = st.External.Current.Value.String()
			}
			list = append(list, fmt.Sprintf("%s/%s", current, quantityOr(spec.External.Target.Value)))
		default:
			list = append(list, "<unknown type>")
		}
	}
	if len(list) == 0 {
		return "<none>"
	}
	return strings.Join(list, ", ")
}

func resourceMetric(spec autoscalingv2.MetricSpec) (string, autoscalingv2.MetricTarget) {
	if spec.ContainerResource != nil {
		return string(spec.ContainerResource.Name), spec.ContainerResource.Target
	}
	if spec.Resource != nil {
		return string(spec.Resource.Name), spec.Resource.Target
	}
	return "", autoscalingv2.MetricTarget{}
}

func quantityOr(q *resource.Quantity) string {
	if q == nil {
		return "<unset>"
	}
	return q.String()
}
