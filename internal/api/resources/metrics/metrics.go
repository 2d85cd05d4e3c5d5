// Package metrics describes the metrics.k8s.io group: NodeMetrics and
// PodMetrics, the CPU and memory `kubectl top` and the autoscalers read.
// They are computed from the nodes' figures when read, never stored (as
// metrics-server serves them); the source is the API server's to give.
package metrics

import (
	"time"

	"github.com/orch-dev/orch/internal/api/resources"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"
)

// Resources describes nodes and pods of metrics.k8s.io/v1beta1, read
// from nodes and pods.
func Resources(nodes, pods resources.Live) []*resources.Resource {
	gvk := metricsv1beta1.SchemeGroupVersion.WithKind
	window := func(w metav1.Duration) string { return w.Duration.Round(time.Second).String() }
	return []*resources.Resource{
		resources.Described[metricsv1beta1.NodeMetrics, metricsv1beta1.NodeMetricsList](&resources.Resource{
			GroupVersionKind: gvk("NodeMetrics"), Plural: "nodes", StorageKey: "metrics.k8s.io/nodes", Live: nodes,
			Columns: []metav1.TableColumnDefinition{
				{Name: "CPU", Type: "string", Description: "CPU used, in cores"},
				{Name: "Memory", Type: "string", Description: "Memory working set"},
				{Name: "Window", Type: "string", Description: "What CPU was measured over"},
			},
			Row: func(obj runtime.Object) []any {
				m := obj.(*metricsv1beta1.NodeMetrics)
				return []any{m.Usage.Cpu().String(), m.Usage.Memory().String(), window(m.Window)}
			},
		}),
		resources.Described[metricsv1beta1.PodMetrics, metricsv1beta1.PodMetricsList](&resources.Resource{
			GroupVersionKind: gvk("PodMetrics"), Plural: "pods", Namespaced: true, StorageKey: "metrics.k8s.io/pods", Live: pods,
			Columns: []metav1.TableColumnDefinition{
				{Name: "Containers", Type: "integer", Description: "Containers measured"},
				{Name: "Window", Type: "string", Description: "What CPU was measured over"},
			},
			Row: func(obj runtime.Object) []any {
				m := obj.(*metricsv1beta1.PodMetrics)
				return []any{int64(len(m.Containers)), window(m.Window)}
			},
		}),
	}
}
