package autoscaling

import (
	"encoding/json"
	"maps"

	"github.com/orch-dev/orch/internal/api/resources"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

// The annotations an autoscaling/v1 autoscaler keeps what v1 cannot say
// in, so that a v1 client's read and write loses nothing (Kubernetes'
// names).
const (
	metricsAnnotation        = "autoscaling.alpha.kubernetes.io/metrics"
	currentMetricsAnnotation = "autoscaling.alpha.kubernetes.io/current-metrics"
	conditionsAnnotation     = "autoscaling.alpha.kubernetes.io/conditions"
	behaviorAnnotation       = "autoscaling.alpha.kubernetes.io/behavior"
)

// horizontalPodAutoscalersV1 serves the stored v2 autoscalers as v1: a
// CPU utilization target, the rest in annotations.
func horizontalPodAutoscalersV1() *resources.Resource {
	v2 := horizontalPodAutoscalers()
	toV2 := func(o runtime.Object) *autoscalingv2.HorizontalPodAutoscaler {
		h, err := ToV2(o.(*autoscalingv1.HorizontalPodAutoscaler))
		if err != nil {
			// Unreadable annotations are kept as they are; the rest converts.
			h, _ = ToV2(&autoscalingv1.HorizontalPodAutoscaler{ObjectMeta: o.(*autoscalingv1.HorizontalPodAutoscaler).ObjectMeta})
		}
		return h
	}
	return resources.Described[autoscalingv1.HorizontalPodAutoscaler, autoscalingv1.HorizontalPodAutoscalerList](&resources.Resource{
		GroupVersionKind: schema.GroupVersionKind{Group: "autoscaling", Version: "v1", Kind: "HorizontalPodAutoscaler"},
		Plural:           v2.Plural, Singular: v2.Singular, Namespaced: true, ShortNames: v2.ShortNames, Categories: v2.Categories,
		StorageKey: v2.StorageKey, StatusMetadata: v2.StatusMetadata, Subresources: v2.Subresources, HasSpec: true,
		Default: resources.Typed(func(h *autoscalingv1.HorizontalPodAutoscaler) {
			if h.Spec.MinReplicas == nil {
				h.Spec.MinReplicas = ptr.To[int32](1)
			}
		}),
		Validate: func(o runtime.Object) field.ErrorList {
			h, err := ToV2(o.(*autoscalingv1.HorizontalPodAutoscaler))
			if err != nil {
				return field.ErrorList{field.Invalid(field.NewPath("metadata", "annotations"), "", err.Error())}
			}
			return validate(h)
		},
		PrepareForCreate: resources.Typed(func(h *autoscalingv1.HorizontalPodAutoscaler) {
			h.Status = autoscalingv1.HorizontalPodAutoscalerStatus{}
		}),
		StorageNew: func() runtime.Object { return &autoscalingv2.HorizontalPodAutoscaler{} },
		ToStorage: func(o runtime.Object) (runtime.Object, error) {
			h, err := ToV2(o.(*autoscalingv1.HorizontalPodAutoscaler))
			if err != nil {
				return nil, apierrors.NewBadRequest(err.Error())
			}
			return h, nil
		},
		FromStorage: func(o runtime.Object) (runtime.Object, error) {
			return ToV1(o.(*autoscalingv2.HorizontalPodAutoscaler))
		},
		Columns: columns, Row: func(o runtime.Object) []any { return row(toV2(o)) },
	})
}

// ToV1 is Kubernetes' conversion of an autoscaler to autoscaling/v1.
func ToV1(in *autoscalingv2.HorizontalPodAutoscaler) (*autoscalingv1.HorizontalPodAutoscaler, error) {
	out := &autoscalingv1.HorizontalPodAutoscaler{TypeMeta: in.TypeMeta, ObjectMeta: *in.ObjectMeta.DeepCopy()}
	if out.APIVersion != "" {
		out.APIVersion = autoscalingv1.SchemeGroupVersion.String()
	}
	ref := in.Spec.ScaleTargetRef
	out.Spec = autoscalingv1.HorizontalPodAutoscalerSpec{
		ScaleTargetRef: autoscalingv1.CrossVersionObjectReference{Kind: ref.Kind, Name: ref.Name, APIVersion: ref.APIVersion},
		MinReplicas:    in.Spec.MinReplicas, MaxReplicas: in.Spec.MaxReplicas,
	}
	st := in.Status
	out.Status = autoscalingv1.HorizontalPodAutoscalerStatus{ObservedGeneration: st.ObservedGeneration, LastScaleTime: st.LastScaleTime,
		CurrentReplicas: st.CurrentReplicas, DesiredReplicas: st.DesiredReplicas}
	var others []autoscalingv1.MetricSpec
	for _, m := range in.Spec.Metrics {
		if cpuUtilization(m) {
			if out.Spec.TargetCPUUtilizationPercentage == nil {
				out.Spec.TargetCPUUtilizationPercentage = ptr.To(*m.Resource.Target.AverageUtilization)
			}
			continue
		}
		others = append(others, metricToV1(m))
	}
	var current []autoscalingv1.MetricStatus
	for _, m := range st.CurrentMetrics {
		current = append(current, statusToV1(m))
		if m.Type == autoscalingv2.ResourceMetricSourceType && m.Resource != nil && m.Resource.Name == corev1.ResourceCPU && m.Resource.Current.AverageUtilization != nil &&
			out.Status.CurrentCPUUtilizationPercentage == nil {
			out.Status.CurrentCPUUtilizationPercentage = ptr.To(*m.Resource.Current.AverageUtilization)
		}
	}
	var conditions []autoscalingv1.HorizontalPodAutoscalerCondition
	for _, c := range st.Conditions {
		conditions = append(conditions, autoscalingv1.HorizontalPodAutoscalerCondition{Type: autoscalingv1.HorizontalPodAutoscalerConditionType(c.Type),
			Status: c.Status, LastTransitionTime: c.LastTransitionTime, Reason: c.Reason, Message: c.Message})
	}
	annotate := func(key string, v any, when bool) error {
		if !when {
			return nil
		}
		data, err := json.Marshal(v)
		if err != nil {
			return err
		}
		if out.Annotations == nil {
			out.Annotations = map[string]string{}
		}
		out.Annotations[key] = string(data)
		return nil
	}
	for _, a := range []struct {
		key  string
		v    any
		when bool
	}{{metricsAnnotation, others, len(others) > 0}, {currentMetricsAnnotation, current, len(current) > 0},
		{behaviorAnnotation, in.Spec.Behavior, in.Spec.Behavior != nil}, {conditionsAnnotation, conditions, len(conditions) > 0}} {
		if err := annotate(a.key, a.v, a.when); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// ToV2 is Kubernetes' conversion of an autoscaling/v1 autoscaler to v2:
// the metrics in its annotations, then its CPU target.
func ToV2(in *autoscalingv1.HorizontalPodAutoscaler) (*autoscalingv2.HorizontalPodAutoscaler, error) {
	out := &autoscalingv2.HorizontalPodAutoscaler{TypeMeta: in.TypeMeta, ObjectMeta: *in.ObjectMeta.DeepCopy()}
	if out.APIVersion != "" {
		out.APIVersion = autoscalingv2.SchemeGroupVersion.String()
	}
	ref := in.Spec.ScaleTargetRef
	out.Spec = autoscalingv2.HorizontalPodAutoscalerSpec{
		ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{Kind: ref.Kind, Name: ref.Name, APIVersion: ref.APIVersion},
		MinReplicas:    in.Spec.MinReplicas, MaxReplicas: in.Spec.MaxReplicas,
	}
	out.Status = autoscalingv2.HorizontalPodAutoscalerStatus{ObservedGeneration: in.Status.ObservedGeneration, LastScaleTime: in.Status.LastScaleTime,
		CurrentReplicas: in.Status.CurrentReplicas, DesiredReplicas: in.Status.DesiredReplicas}
	annotations := maps.Clone(in.Annotations)
	read := func(key string, into any) error {
		data, ok := annotations[key]
		if !ok {
			return nil
		}
		delete(annotations, key)
		return json.Unmarshal([]byte(data), into)
	}
	var others []autoscalingv1.MetricSpec
	var current []autoscalingv1.MetricStatus
	var conditions []autoscalingv1.HorizontalPodAutoscalerCondition
	var behavior *autoscalingv2.HorizontalPodAutoscalerBehavior
	for key, into := range map[string]any{metricsAnnotation: &others, currentMetricsAnnotation: &current, conditionsAnnotation: &conditions, behaviorAnnotation: &behavior} {
		if err := read(key, into); err != nil {
			return nil, err
		}
	}
	if len(annotations) == 0 {
		annotations = nil
	}
	out.Annotations = annotations
	for _, m := range others {
		out.Spec.Metrics = append(out.Spec.Metrics, metricToV2(m))
	}
	if t := in.Spec.TargetCPUUtilizationPercentage; t != nil {
		out.Spec.Metrics = append(out.Spec.Metrics, autoscalingv2.MetricSpec{Type: autoscalingv2.ResourceMetricSourceType, Resource: &autoscalingv2.ResourceMetricSource{
			Name: corev1.ResourceCPU, Target: autoscalingv2.MetricTarget{Type: autoscalingv2.UtilizationMetricType, AverageUtilization: ptr.To(*t)}}})
	}
	out.Spec.Behavior = behavior
	for _, m := range current {
		out.Status.CurrentMetrics = append(out.Status.CurrentMetrics, statusToV2(m))
	}
	if len(current) == 0 && in.Status.CurrentCPUUtilizationPercentage != nil {
		out.Status.CurrentMetrics = []autoscalingv2.MetricStatus{{Type: autoscalingv2.ResourceMetricSourceType, Resource: &autoscalingv2.ResourceMetricStatus{
			Name: corev1.ResourceCPU, Current: autoscalingv2.MetricValueStatus{AverageUtilization: ptr.To(*in.Status.CurrentCPUUtilizationPercentage)}}}}
	}
	for _, c := range conditions {
		out.Status.Conditions = append(out.Status.Conditions, autoscalingv2.HorizontalPodAutoscalerCondition{Type: autoscalingv2.HorizontalPodAutoscalerConditionType(c.Type),
			Status: c.Status, LastTransitionTime: c.LastTransitionTime, Reason: c.Reason, Message: c.Message})
	}
	return out, nil
}

func cpuUtilization(m autoscalingv2.MetricSpec) bool {
	return m.Type == autoscalingv2.ResourceMetricSourceType && m.Resource != nil && m.Resource.Name == corev1.ResourceCPU && m.Resource.Target.AverageUtilization != nil
}

func valueOr(q *resource.Quantity) resource.Quantity {
	if q == nil {
		return resource.Quantity{}
	}
	return q.DeepCopy()
}

func nonZero(q resource.Quantity) *resource.Quantity {
	if q.IsZero() {
		return nil
	}
	return &q
}

func metricToV1(m autoscalingv2.MetricSpec) autoscalingv1.MetricSpec {
	out := autoscalingv1.MetricSpec{Type: autoscalingv1.MetricSourceType(m.Type)}
	switch {
	case m.Resource != nil:
		out.Resource = &autoscalingv1.ResourceMetricSource{Name: m.Resource.Name, TargetAverageUtilization: m.Resource.Target.AverageUtilization, TargetAverageValue: m.Resource.Target.AverageValue}
	case m.ContainerResource != nil:
		c := m.ContainerResource
		out.ContainerResource = &autoscalingv1.ContainerResourceMetricSource{Name: c.Name, Container: c.Container, TargetAverageUtilization: c.Target.AverageUtilization, TargetAverageValue: c.Target.AverageValue}
	case m.Pods != nil:
		out.Pods = &autoscalingv1.PodsMetricSource{MetricName: m.Pods.Metric.Name, Selector: m.Pods.Metric.Selector, TargetAverageValue: valueOr(m.Pods.Target.AverageValue)}
	case m.Object != nil:
		o := m.Object
		out.Object = &autoscalingv1.ObjectMetricSource{Target: autoscalingv1.CrossVersionObjectReference(o.DescribedObject), MetricName: o.Metric.Name,
			Selector: o.Metric.Selector, TargetValue: valueOr(o.Target.Value), AverageValue: o.Target.AverageValue}
	case m.External != nil:
		e := m.External
		out.External = &autoscalingv1.ExternalMetricSource{MetricName: e.Metric.Name, MetricSelector: e.Metric.Selector, TargetValue: e.Target.Value, TargetAverageValue: e.Target.AverageValue}
	}
	return out
}

func target(utilization *int32, value *resource.Quantity) autoscalingv2.MetricTarget {
	if utilization != nil {
		return autoscalingv2.MetricTarget{Type: autoscalingv2.UtilizationMetricType, AverageUtilization: utilization}
	}
	return autoscalingv2.MetricTarget{Type: autoscalingv2.AverageValueMetricType, AverageValue: value}
}

func metricToV2(m autoscalingv1.MetricSpec) autoscalingv2.MetricSpec {
	out := autoscalingv2.MetricSpec{Type: autoscalingv2.MetricSourceType(m.Type)}
	switch {
	case m.Resource != nil:
		out.Resource = &autoscalingv2.ResourceMetricSource{Name: m.Resource.Name, Target: target(m.Resource.TargetAverageUtilization, m.Resource.TargetAverageValue)}
	case m.ContainerResource != nil:
		c := m.ContainerResource
		out.ContainerResource = &autoscalingv2.ContainerResourceMetricSource{Name: c.Name, Container: c.Container, Target: target(c.TargetAverageUtilization, c.TargetAverageValue)}
	case m.Pods != nil:
		out.Pods = &autoscalingv2.PodsMetricSource{Metric: autoscalingv2.MetricIdentifier{Name: m.Pods.MetricName, Selector: m.Pods.Selector},
			Target: autoscalingv2.MetricTarget{Type: autoscalingv2.AverageValueMetricType, AverageValue: ptr.To(m.Pods.TargetAverageValue)}}
	case m.Object != nil:
		o := m.Object
		t := autoscalingv2.MetricTarget{Type: autoscalingv2.ValueMetricType, Value: nonZero(o.TargetValue)}
		if o.AverageValue != nil {
			t = autoscalingv2.MetricTarget{Type: autoscalingv2.AverageValueMetricType, AverageValue: o.AverageValue}
		}
		out.Object = &autoscalingv2.ObjectMetricSource{DescribedObject: autoscalingv2.CrossVersionObjectReference(o.Target),
			Metric: autoscalingv2.MetricIdentifier{Name: o.MetricName, Selector: o.Selector}, Target: t}
	case m.External != nil:
		e := m.External
		t := autoscalingv2.MetricTarget{Type: autoscalingv2.ValueMetricType, Value: e.TargetValue}
		if e.TargetAverageValue != nil {
			t = autoscalingv2.MetricTarget{Type: autoscalingv2.AverageValueMetricType, AverageValue: e.TargetAverageValue}
		}
		out.External = &autoscalingv2.ExternalMetricSource{Metric: autoscalingv2.MetricIdentifier{Name: e.MetricName, Selector: e.MetricSelector}, Target: t}
	}
	return out
}

func statusToV1(m autoscalingv2.MetricStatus) autoscalingv1.MetricStatus {
	out := autoscalingv1.MetricStatus{Type: autoscalingv1.MetricSourceType(m.Type)}
	switch {
	case m.Resource != nil:
		out.Resource = &autoscalingv1.ResourceMetricStatus{Name: m.Resource.Name, CurrentAverageUtilization: m.Resource.Current.AverageUtilization,
			CurrentAverageValue: valueOr(m.Resource.Current.AverageValue)}
	case m.ContainerResource != nil:
		c := m.ContainerResource
		out.ContainerResource = &autoscalingv1.ContainerResourceMetricStatus{Name: c.Name, Container: c.Container,
			CurrentAverageUtilization: c.Current.AverageUtilization, CurrentAverageValue: valueOr(c.Current.AverageValue)}
	case m.Pods != nil:
		out.Pods = &autoscalingv1.PodsMetricStatus{MetricName: m.Pods.Metric.Name, Selector: m.Pods.Metric.Selector, CurrentAverageValue: valueOr(m.Pods.Current.AverageValue)}
	case m.Object != nil:
		o := m.Object
		out.Object = &autoscalingv1.ObjectMetricStatus{Target: autoscalingv1.CrossVersionObjectReference(o.DescribedObject), MetricName: o.Metric.Name,
			Selector: o.Metric.Selector, CurrentValue: valueOr(o.Current.Value), AverageValue: o.Current.AverageValue}
	case m.External != nil:
		e := m.External
		out.External = &autoscalingv1.ExternalMetricStatus{MetricName: e.Metric.Name, MetricSelector: e.Metric.Selector,
			CurrentValue: valueOr(e.Current.Value), CurrentAverageValue: e.Current.AverageValue}
	}
	return out
}

func statusToV2(m autoscalingv1.MetricStatus) autoscalingv2.MetricStatus {
	out := autoscalingv2.MetricStatus{Type: autoscalingv2.MetricSourceType(m.Type)}
	switch {
	case m.Resource != nil:
		out.Resource = &autoscalingv2.ResourceMetricStatus{Name: m.Resource.Name, Current: autoscalingv2.MetricValueStatus{
			AverageUtilization: m.Resource.CurrentAverageUtilization, AverageValue: ptr.To(m.Resource.CurrentAverageValue)}}
	case m.ContainerResource != nil:
		c := m.ContainerResource
		out.ContainerResource = &autoscalingv2.ContainerResourceMetricStatus{Name: c.Name, Container: c.Container, Current: autoscalingv2.MetricValueStatus{
			AverageUtilization: c.CurrentAverageUtilization, AverageValue: ptr.To(c.CurrentAverageValue)}}
	case m.Pods != nil:
		out.Pods = &autoscalingv2.PodsMetricStatus{Metric: autoscalingv2.MetricIdentifier{Name: m.Pods.MetricName, Selector: m.Pods.Selector},
			Current: autoscalingv2.MetricValueStatus{AverageValue: ptr.To(m.Pods.CurrentAverageValue)}}
	case m.Object != nil:
		o := m.Object
		out.Object = &autoscalingv2.ObjectMetricStatus{DescribedObject: autoscalingv2.CrossVersionObjectReference(o.Target),
			Metric: autoscalingv2.MetricIdentifier{Name: o.MetricName, Selector: o.Selector}, Current: autoscalingv2.MetricValueStatus{Value: ptr.To(o.CurrentValue), AverageValue: o.AverageValue}}
	case m.External != nil:
		e := m.External
		out.External = &autoscalingv2.ExternalMetricStatus{Metric: autoscalingv2.MetricIdentifier{Name: e.MetricName, Selector: e.MetricSelector},
			Current: autoscalingv2.MetricValueStatus{Value: ptr.To(e.CurrentValue), AverageValue: e.CurrentAverageValue}}
	}
	return out
}
