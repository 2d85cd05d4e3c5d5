package podautoscaler

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api/apitest"
	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/loops/controller"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	toolscache "k8s.io/client-go/tools/cache"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"
	"k8s.io/utils/ptr"
)

// steadyUsage has every pod of an app at 50m, on target for a 100m
// request at 50%: answered from memory, as cheaply as can be, so that
// the loop's own cost is what is measured.
type steadyUsage map[string]*metricsv1beta1.PodMetricsList

func (u steadyUsage) List(_ context.Context, _ string, sel labels.Selector) (*metricsv1beta1.PodMetricsList, error) {
	return u[sel.String()], nil
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkAutoscalers1000: one sync period of 1,000 autoscalers at
// steady state, each over a Deployment of two ready pods on target: the
// target's scale read through the API (in-process loopback), its pods from
// the pod informer, their usage answered from memory (hollow nodes serve
// no metrics). In the process's CPU time — the loop's own work and the API
// server's it causes — and as the share of a core at the 15 s period.
// Target: under 1%.
func BenchmarkAutoscalers1000(b *testing.B) {
	srv := apitest.Start(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client, err := kube.NewForConfig(srv.Loopback())
	if err != nil {
		b.Fatal(err)
	}
	factory := kube.NewInformers(client, 0)
	usage := steadyUsage{}
	c, err := New(client, factory, NewInformerScales(factory, kube.NewScales(client)), usage, nopRecorder{}, 0, controller.Env{})
	if err != nil {
		b.Fatal(err)
	}
	const n = 1000
	started := metav1.NewTime(time.Now().Add(-time.Hour))
	for i := range n {
		app := fmt.Sprintf("app-%d", i)
		list := &metricsv1beta1.PodMetricsList{}
		usage["app="+app] = list
		for j := range 2 {
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", app, j), Labels: map[string]string{"app": app}},
				Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "app", Image: "busybox",
					Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}}}}}}
			list.Items = append(list.Items, metricsv1beta1.PodMetrics{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: "default"}, Timestamp: metav1.Now(),
				Window: metav1.Duration{Duration: 15 * time.Second}, Containers: []metricsv1beta1.ContainerMetrics{{Name: "app", Usage: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m")}}}})
			created, err := srv.Client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
			if err != nil {
				b.Fatal(err)
			}
			created.Status = corev1.PodStatus{Phase: corev1.PodRunning, StartTime: &started, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: started}}}
			if _, err := srv.Client.CoreV1().Pods("default").UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		labels := map[string]string{"app": app}
		d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: app}, Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox"}}}}}}
		if _, err := srv.Client.AppsV1().Deployments("default").Create(ctx, d, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		h := &autoscalingv2.HorizontalPodAutoscaler{ObjectMeta: metav1.ObjectMeta{Name: app}, Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: app}, MinReplicas: ptr.To[int32](1), MaxReplicas: 10,
			Metrics: []autoscalingv2.MetricSpec{{Type: autoscalingv2.ResourceMetricSourceType, Resource: &autoscalingv2.ResourceMetricSource{Name: corev1.ResourceCPU,
				Target: autoscalingv2.MetricTarget{Type: autoscalingv2.UtilizationMetricType, AverageUtilization: ptr.To[int32](50)}}}}}}
		if _, err := srv.Client.AutoscalingV2().HorizontalPodAutoscalers("default").Create(ctx, h, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	factory.Start(ctx)
	defer func() { cancel(); factory.Shutdown(); c.queue.ShutDown() }()
	if !toolscache.WaitForCacheSync(ctx.Done(), c.synced...) {
		b.Fatal("caches never synced")
	}
	round := func() {
		for i := range n {
			hpa, err := c.autoscalers.HorizontalPodAutoscalers("default").Get(fmt.Sprintf("app-%d", i))
			if err != nil {
				b.Fatal(err)
			}
			if err := c.reconcile(ctx, "default/"+hpa.Name, hpa.DeepCopy()); err != nil {
				b.Fatal(err)
			}
		}
	}
	// The first round writes each status; steady state is the next ones.
	round()
	time.Sleep(time.Second) // the informer sees the statuses
	round()
	for b.Loop() {
		before := cpuTime()
		round()
		used := cpuTime() - before
		b.ReportMetric(float64(used.Milliseconds()), "cpu-ms/round")
		b.ReportMetric(100*used.Seconds()/SyncPeriod.Seconds(), "core-%")
	}
}

type nopRecorder struct{}

func (nopRecorder) Eventf(_, _ runtime.Object, _, _, _, _ string, _ ...any) {}
