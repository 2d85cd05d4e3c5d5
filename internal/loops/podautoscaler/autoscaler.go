// Package podautoscaler is the loop that keeps HorizontalPodAutoscalers,
// as Kubernetes' horizontal pod autoscaler controller: every 15 seconds
// each autoscaler reads its target's scale, the usage of the target's pods
// from the metrics API (what `kubectl top` reads), computes the replicas
// each metric asks for with Kubernetes' arithmetic (tolerance, missing and
// unready pods), takes the most, holds it within the stabilization windows
// and rate policies of its behavior and its bounds, and writes the scale,
// saying why in its conditions and events.
package podautoscaler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/loops/controller"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	autoscalinglisters "k8s.io/client-go/listers/autoscaling/v2"
	corelisters "k8s.io/client-go/listers/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"
)

// SyncPeriod is how often each autoscaler is looked at
// (kube-controller-manager's --horizontal-pod-autoscaler-sync-period).
const SyncPeriod = 15 * time.Second

// ScaleTargets reads and writes the scale of an autoscaler's target.
type ScaleTargets interface {
	Get(ctx context.Context, gvk schema.GroupVersionKind, namespace, name string) (*autoscalingv1.Scale, error)
	Update(ctx context.Context, gvk schema.GroupVersionKind, scale *autoscalingv1.Scale) (*autoscalingv1.Scale, error)
}

// PodUsage lists the resource usage of the pods a selector selects (the
// metrics API's PodMetrics).
type PodUsage interface {
	List(ctx context.Context, namespace string, selector labels.Selector) (*metricsv1beta1.PodMetricsList, error)
}

// Controller is the autoscaling loop.
type Controller struct {
	client   *kube.Client
	scales   ScaleTargets
	usage    PodUsage
	recorder kube.EventRecorder
	env      controller.Env
	period   time.Duration

	autoscalers autoscalinglisters.HorizontalPodAutoscalerLister
	pods        corelisters.PodLister
	podIndex    toolscache.Indexer
	synced      []toolscache.InformerSynced
	queue       *controller.Queue[string]
	history     *history
}

// New registers the loop with the informers; period 0 is SyncPeriod.
func New(client *kube.Client, factory *kube.Informers, scales ScaleTargets, usage PodUsage, recorder kube.EventRecorder, period time.Duration, env controller.Env) (*Controller, error) {
	env = env.WithDefaults()
	if period <= 0 {
		period = SyncPeriod
	}
	hpas, pods := factory.HorizontalPodAutoscalers(), factory.Pods()
	// Every sync lists its target's pods by selector: by label, not by a
	// scan of the namespace (1,000 autoscalers over 2,000 pods would match
	// two million label sets each period).
	if err := pods.Informer().AddIndexers(toolscache.Indexers{labelIndex: podLabels}); err != nil {
		return nil, err
	}
	c := &Controller{client: client, scales: scales, usage: usage, recorder: recorder, env: env, period: period,
		autoscalers: hpas.Lister(), pods: pods.Lister(), podIndex: pods.Informer().GetIndexer(), history: newHistory(),
		synced: []toolscache.InformerSynced{hpas.Informer().HasSynced, pods.Informer().HasSynced},
		queue:  controller.NewQueue[string]("horizontalpodautoscaler", env)}
	if err := c.queue.EnqueueObjects(hpas.Informer(), controller.NamespacedKey); err != nil {
		return nil, err
	}
	return c, nil
}

// Run syncs autoscalers with the given number of workers until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	c.queue.Run(ctx, workers, c.synced, c.sync)
}

// MetricsAPI reads pod usage through the API server's metrics.k8s.io.
type MetricsAPI struct{ Client *kube.Client }

// List implements PodUsage.
func (m MetricsAPI) List(ctx context.Context, namespace string, selector labels.Selector) (*metricsv1beta1.PodMetricsList, error) {
	return m.Client.PodMetrics(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector.String()})
}

func (c *Controller) sync(ctx context.Context, key string) error {
	ns, name, err := toolscache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	hpa, err := c.autoscalers.HorizontalPodAutoscalers(ns).Get(name)
	if apierrors.IsNotFound(err) {
		c.history.forget(key)
		return nil
	}
	if err != nil {
		return err
	}
	// Looked at again a period from now, whatever happens.
	defer c.queue.AddAfter(key, c.period)
	return c.reconcile(ctx, key, hpa.DeepCopy())
}

// reconcile is Kubernetes' reconcileAutoscaler.
func (c *Controller) reconcile(ctx context.Context, key string, hpa *autoscalingv2.HorizontalPodAutoscaler) error {
	original := hpa.Status.DeepCopy()
	now := c.env.Clock.Now()
	conds := conditions{set: func(t autoscalingv2.HorizontalPodAutoscalerConditionType, status corev1.ConditionStatus, reason, message string) {
		setCondition(hpa, t, status, reason, message, now)
	}}
	ref := hpa.Spec.ScaleTargetRef
	reference := fmt.Sprintf("%s/%s/%s", ref.Kind, hpa.Namespace, ref.Name)
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	if err == nil && ref.APIVersion == "" {
		err = errors.New("no apiVersion")
	}
	var scale *autoscalingv1.Scale
	if err == nil {
		scale, err = c.scales.Get(ctx, gv.WithKind(ref.Kind), hpa.Namespace, ref.Name)
	}
	if err != nil {
		c.recorder.Eventf(hpa, nil, corev1.EventTypeWarning, "FailedGetScale", "GetScale", "%v", err)
		conds.set(autoscalingv2.AbleToScale, corev1.ConditionFalse, "FailedGetScale", fmt.Sprintf("the HPA controller was unable to get the target's current scale: %v", err))
		if uerr := c.updateStatus(ctx, original, hpa); uerr != nil {
			return uerr
		}
		// Reported; the next period tries again.
		return nil
	}
	conds.set(autoscalingv2.AbleToScale, corev1.ConditionTrue, "SucceededGetScale", "the HPA controller was able to get the target's current scale")
	current := scale.Spec.Replicas
	minReplicas := int32(1)
	if hpa.Spec.MinReplicas != nil {
		minReplicas = *hpa.Spec.MinReplicas
	}
	var statuses []autoscalingv2.MetricStatus
	desired, reason, rescale := int32(0), "", true
	switch {
	case current == 0 && minReplicas != 0:
		rescale = false
		conds.set(autoscalingv2.ScalingActive, corev1.ConditionFalse, "ScalingDisabled", "scaling is disabled since the replica count of the target is zero")
	case current > hpa.Spec.MaxReplicas:
		reason, desired = "Current number of replicas above Spec.MaxReplicas", hpa.Spec.MaxReplicas
	case current < minReplicas:
		reason, desired = "Current number of replicas below Spec.MinReplicas", minReplicas
	default:
		proposed, metric, st, err := c.replicasForMetrics(ctx, hpa, scale, now, conds)
		statuses = st
		if err != nil && proposed == -1 {
			hpa.Status.CurrentReplicas, hpa.Status.CurrentMetrics = current, statuses
			if uerr := c.updateStatus(ctx, original, hpa); uerr != nil {
				return uerr
			}
			c.recorder.Eventf(hpa, nil, corev1.EventTypeWarning, "FailedComputeMetricsReplicas", "ComputeReplicas", "%v", err)
			c.env.Log.Debug("autoscaler could not compute replicas", "hpa", key, "target", reference, "err", err)
			return nil
		}
		desired = proposed
		switch {
		case desired > current:
			reason = fmt.Sprintf("%s above target", metric)
		case desired < current:
			reason = "All metrics below target"
		}
		if hpa.Spec.Behavior == nil {
			desired = c.history.normalize(key, current, desired, minReplicas, hpa.Spec.MaxReplicas, now, conds)
		} else {
			desired = c.history.normalizeWithBehavior(key, hpa.Spec.Behavior, current, desired, minReplicas, hpa.Spec.MaxReplicas, now, conds)
		}
		rescale = desired != current
	}
	if rescale {
		scale.Spec.Replicas = desired
		if _, err := c.scales.Update(ctx, gv.WithKind(ref.Kind), scale); err != nil {
			c.recorder.Eventf(hpa, nil, corev1.EventTypeWarning, "FailedRescale", "Rescale", "New size: %d; reason: %s; error: %v", desired, reason, err)
			conds.set(autoscalingv2.AbleToScale, corev1.ConditionFalse, "FailedUpdateScale", fmt.Sprintf("the HPA controller was unable to update the target scale: %v", err))
			hpa.Status.CurrentReplicas, hpa.Status.CurrentMetrics = current, statuses
			if uerr := c.updateStatus(ctx, original, hpa); uerr != nil {
				return uerr
			}
			return fmt.Errorf("failed to rescale %s: %w", reference, err)
		}
		conds.set(autoscalingv2.AbleToScale, corev1.ConditionTrue, "SucceededRescale", fmt.Sprintf("the HPA controller was able to update the target scale to %d", desired))
		c.recorder.Eventf(hpa, nil, corev1.EventTypeNormal, "SuccessfulRescale", "Rescale", "New size: %d; reason: %s", desired, reason)
		c.history.recordScale(key, hpa.Spec.Behavior, current, desired, now)
		hpa.Status.LastScaleTime = &metav1.Time{Time: now}
	} else {
		desired = current
	}
	hpa.Status.CurrentReplicas, hpa.Status.DesiredReplicas, hpa.Status.CurrentMetrics = current, desired, statuses
	return c.updateStatus(ctx, original, hpa)
}

// replicasForMetrics takes the most replicas any metric asks for. A
// metric that cannot be computed is reported in ScalingActive; when all
// fail, or some fail and the rest would scale down, nothing changes (-1).
func (c *Controller) replicasForMetrics(ctx context.Context, hpa *autoscalingv2.HorizontalPodAutoscaler, scale *autoscalingv1.Scale, now time.Time, conds conditions) (int32, string, []autoscalingv2.MetricStatus, error) {
	selector, err := labels.Parse(scale.Status.Selector)
	if scale.Status.Selector == "" {
		err = errors.New("selector is required")
	}
	if err != nil {
		msg := fmt.Sprintf("the HPA target's scale is missing a selector: %v", err)
		if scale.Status.Selector != "" {
			msg = fmt.Sprintf("couldn't convert selector into a corresponding internal selector object: %v", err)
		}
		c.recorder.Eventf(hpa, nil, corev1.EventTypeWarning, "InvalidSelector", "ComputeReplicas", "%s", msg)
		conds.set(autoscalingv2.ScalingActive, corev1.ConditionFalse, "InvalidSelector", msg)
		return -1, "", nil, errors.New(msg)
	}
	statuses := make([]autoscalingv2.MetricStatus, len(hpa.Spec.Metrics))
	var replicas int32
	var metric string
	var invalid int
	var firstErr error
	var firstReason, firstMessage string
	for i, spec := range hpa.Spec.Metrics {
		proposed, name, status, reason, err := c.replicasForMetric(ctx, hpa.Namespace, spec, scale.Spec.Replicas, selector, now)
		if err != nil {
			if invalid == 0 {
				firstErr, firstReason = err, reason
				firstMessage = fmt.Sprintf("the HPA was unable to compute the replica count: %v", err)
				c.recorder.Eventf(hpa, nil, corev1.EventTypeWarning, reason, "ComputeReplicas", "%v", err)
			}
			invalid++
			continue
		}
		statuses[i] = status
		if replicas == 0 || proposed > replicas {
			replicas, metric = proposed, name
		}
	}
	if firstErr != nil {
		firstErr = fmt.Errorf("invalid metrics (%v invalid out of %v), first error is: %w", invalid, len(hpa.Spec.Metrics), firstErr)
	}
	if invalid >= len(hpa.Spec.Metrics) || (invalid > 0 && replicas < scale.Spec.Replicas) {
		conds.set(autoscalingv2.ScalingActive, corev1.ConditionFalse, firstReason, firstMessage)
		return -1, "", statuses, firstErr
	}
	conds.set(autoscalingv2.ScalingActive, corev1.ConditionTrue, "ValidMetricFound", fmt.Sprintf("the HPA was able to successfully calculate a replica count from %s", metric))
	return replicas, metric, statuses, firstErr
}

// replicasForMetric computes one metric's proposal, its status, and on
// failure the condition reason Kubernetes gives.
func (c *Controller) replicasForMetric(ctx context.Context, ns string, spec autoscalingv2.MetricSpec, current int32, selector labels.Selector, now time.Time) (int32, string, autoscalingv2.MetricStatus, string, error) {
	switch spec.Type {
	case autoscalingv2.ResourceMetricSourceType, autoscalingv2.ContainerResourceMetricSourceType:
		failed := "FailedGetResourceMetric"
		var res corev1.ResourceName
		var target autoscalingv2.MetricTarget
		var container string
		if spec.Type == autoscalingv2.ContainerResourceMetricSourceType && spec.ContainerResource != nil {
			failed, res, target, container = "FailedGetContainerResourceMetric", spec.ContainerResource.Name, spec.ContainerResource.Target, spec.ContainerResource.Container
		} else if spec.Resource != nil {
			res, target = spec.Resource.Name, spec.Resource.Target
		} else {
			return 0, "", autoscalingv2.MetricStatus{}, "InvalidMetricSourceType", errors.New("the metric source is not set")
		}
		metrics, err := c.podMetrics(ctx, ns, selector, res, container)
		if err != nil {
			return 0, "", autoscalingv2.MetricStatus{}, failed, fmt.Errorf("failed to get %s utilization: %w", res, err)
		}
		pods, err := c.selectPods(ns, selector)
		if err != nil {
			return 0, "", autoscalingv2.MetricStatus{}, failed, err
		}
		value := autoscalingv2.MetricValueStatus{}
		var replicas int32
		if target.AverageValue != nil {
			var usage int64
			replicas, usage, err = valueReplicas(current, target.AverageValue.MilliValue(), metrics, pods, res, now)
			value.AverageValue = resource.NewMilliQuantity(usage, resource.DecimalSI)
		} else {
			if target.AverageUtilization == nil {
				return 0, "", autoscalingv2.MetricStatus{}, failed, errors.New("invalid resource metric source: neither a utilization target nor a value target was set")
			}
			var utilization int32
			var raw int64
			replicas, utilization, raw, err = utilizationReplicas(current, *target.AverageUtilization, metrics, pods, container, res, now)
			value.AverageUtilization, value.AverageValue = &utilization, resource.NewMilliQuantity(raw, resource.DecimalSI)
		}
		if err != nil {
			return 0, "", autoscalingv2.MetricStatus{}, failed, fmt.Errorf("failed to get %s utilization: %w", res, err)
		}
		status := autoscalingv2.MetricStatus{Type: spec.Type}
		name := fmt.Sprintf("%s resource", res)
		if spec.Type == autoscalingv2.ContainerResourceMetricSourceType {
			status.ContainerResource = &autoscalingv2.ContainerResourceMetricStatus{Name: res, Container: container, Current: value}
			name = fmt.Sprintf("%s container resource", res)
		} else {
			status.Resource = &autoscalingv2.ResourceMetricStatus{Name: res, Current: value}
		}
		if target.AverageUtilization != nil {
			name += " utilization (percentage of request)"
		}
		return replicas, name, status, "", nil
	case autoscalingv2.PodsMetricSourceType:
		return 0, "", autoscalingv2.MetricStatus{}, "FailedGetPodsMetric", fmt.Errorf("unable to get metric %s: %w", metricName(spec), errNoCustomMetrics)
	case autoscalingv2.ObjectMetricSourceType:
		return 0, "", autoscalingv2.MetricStatus{}, "FailedGetObjectMetric", fmt.Errorf("unable to get metric %s: %w", metricName(spec), errNoCustomMetrics)
	case autoscalingv2.ExternalMetricSourceType:
		return 0, "", autoscalingv2.MetricStatus{}, "FailedGetExternalMetric", fmt.Errorf("unable to get external metric %s/%s: %w", ns, metricName(spec), errNoExternalMetrics)
	}
	return 0, "", autoscalingv2.MetricStatus{}, "InvalidMetricSourceType", fmt.Errorf("unknown metric source type %q", spec.Type)
}

// What Kubernetes' autoscaler says when no adapter serves custom or
// external metrics (orch serves neither API itself).
var (
	errNoCustomMetrics   = errors.New("unable to fetch metrics from custom metrics API: no custom metrics API (custom.metrics.k8s.io) registered")
	errNoExternalMetrics = errors.New("unable to fetch metrics from external metrics API: no external metrics API (external.metrics.k8s.io) registered")
)

func metricName(spec autoscalingv2.MetricSpec) string {
	switch {
	case spec.Pods != nil:
		return spec.Pods.Metric.Name
	case spec.Object != nil:
		return spec.Object.Metric.Name
	case spec.External != nil:
		return spec.External.Metric.Name
	}
	return ""
}

// podMetrics reads the selected pods' usage of res (of one container when
// container is set), in milli-units; a pod whose sample lacks the
// resource is left out.
func (c *Controller) podMetrics(ctx context.Context, ns string, selector labels.Selector, res corev1.ResourceName, container string) (podMetrics, error) {
	list, err := c.usage.List(ctx, ns, selector)
	if err != nil {
		return nil, fmt.Errorf("unable to get metrics for resource %s: unable to fetch metrics from resource metrics API: %w", res, err)
	}
	if len(list.Items) == 0 {
		return nil, fmt.Errorf("unable to get metrics for resource %s: no metrics returned from resource metrics API", res)
	}
	out := podMetrics{}
	for _, m := range list.Items {
		var sum int64
		missing := len(m.Containers) == 0
		for _, ctr := range m.Containers {
			if container != "" && ctr.Name != container {
				continue
			}
			q, ok := ctr.Usage[res]
			if !ok {
				missing = true
				break
			}
			sum += q.MilliValue()
		}
		if !missing {
			out[m.Name] = podMetric{Timestamp: m.Timestamp.Time, Window: m.Window.Duration, Value: sum}
		}
	}
	return out, nil
}

// labelIndex indexes pods by namespace and each label.
const labelIndex = "orch.dev/namespace-label"

func podLabels(obj any) ([]string, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return nil, nil
	}
	out := make([]string, 0, len(p.Labels))
	for k, v := range p.Labels {
		out = append(out, p.Namespace+"/"+k+"="+v)
	}
	return out, nil
}

// selectPods lists the namespace's pods the selector selects: from the
// fewest pods carrying one of its key=value labels, or by a scan when it
// has none.
func (c *Controller) selectPods(ns string, sel labels.Selector) ([]*corev1.Pod, error) {
	reqs, _ := sel.Requirements()
	var fewest []any
	indexed := false
	for _, r := range reqs {
		op := r.Operator()
		if op != selection.Equals && op != selection.DoubleEquals && (op != selection.In || r.Values().Len() != 1) {
			continue
		}
		items, err := c.podIndex.ByIndex(labelIndex, ns+"/"+r.Key()+"="+r.Values().UnsortedList()[0])
		if err != nil {
			return nil, err
		}
		if !indexed || len(items) < len(fewest) {
			fewest, indexed = items, true
		}
	}
	if !indexed {
		return c.pods.Pods(ns).List(sel)
	}
	out := make([]*corev1.Pod, 0, len(fewest))
	for _, obj := range fewest {
		if p := obj.(*corev1.Pod); sel.Matches(labels.Set(p.Labels)) {
			out = append(out, p)
		}
	}
	return out, nil
}

// setCondition sets a condition, its transition time moving only when its
// status does.
func setCondition(hpa *autoscalingv2.HorizontalPodAutoscaler, t autoscalingv2.HorizontalPodAutoscalerConditionType, status corev1.ConditionStatus, reason, message string, now time.Time) {
	for i := range hpa.Status.Conditions {
		c := &hpa.Status.Conditions[i]
		if c.Type != t {
			continue
		}
		if c.Status != status {
			c.LastTransitionTime = metav1.NewTime(now)
		}
		c.Status, c.Reason, c.Message = status, reason, message
		return
	}
	hpa.Status.Conditions = append(hpa.Status.Conditions, autoscalingv2.HorizontalPodAutoscalerCondition{Type: t, Status: status,
		LastTransitionTime: metav1.NewTime(now), Reason: reason, Message: message})
}

func (c *Controller) updateStatus(ctx context.Context, original *autoscalingv2.HorizontalPodAutoscalerStatus, hpa *autoscalingv2.HorizontalPodAutoscaler) error {
	if apiequality.Semantic.DeepEqual(original, &hpa.Status) {
		return nil
	}
	_, err := c.client.HorizontalPodAutoscalers(hpa.Namespace).UpdateStatus(ctx, hpa, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("failed to update status for %s: %w", hpa.Name, err)
	}
	return nil
}
