//go:build e2e

package e2e_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent/agenttest"
	"github.com/orch-dev/orch/internal/api/apitest"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
)

func deployment(name string, replicas int32, ctr corev1.Container) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: appsv1.DeploymentSpec{Replicas: &replicas,
		Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](1), Containers: []corev1.Container{ctr}}}}}
}

func readyCount(pods map[string]*corev1.Pod) int {
	n := 0
	for _, p := range pods {
		if p.DeletionTimestamp != nil {
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				n++
			}
		}
	}
	return n
}

// TestMaintenanceAndLoad: a server and two agents, driven as an operator
// would. `kubectl drain` of the node that runs both replicas of a
// Deployment under a budget of minAvailable 1 evicts one, waits for its
// replacement to be ready on the other node, then the second: the
// Deployment is never without a ready pod. A pod of high priority has a
// lower one preempted from the full node it must run on. Then an autoscaler scales a
// Deployment whose pod burns CPU from 1 to at least 3, and back to 1 once
// the burning stops and its (shortened) scale-down window has passed.
func TestMaintenanceAndLoad(t *testing.T) {
	c := newCluster(t)
	c.addNode("node-a", "198.18.0.51")
	c.addNode("node-b", "198.18.0.52")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	agenttest.Eventually(t, "both nodes Ready", func() bool {
		list, err := c.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil || len(list.Items) != 2 {
			return false
		}
		for _, n := range list.Items {
			if !agenttest.NodeReady(&n) {
				return false
			}
		}
		return true
	})
	k := apitest.NewKubectl(t, c.kubeconfig)

	t.Run("drain", func(t *testing.T) {
		k.Run("cordon", "node-b")
		web := deployment("web", 2, agenttest.Busybox("web", "sleep 3600"))
		web.Spec.Template.Spec.Containers[0].ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}, PeriodSeconds: 1}
		if _, err := c.client.AppsV1().Deployments("default").Create(ctx, web, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		k.Run("rollout", "status", "deployment/web", "--timeout=3m")
		k.Run("uncordon", "node-b")
		k.Run("create", "poddisruptionbudget", "web", "--selector=app=web", "--min-available=1")
		agenttest.Eventually(t, "the budget allows one disruption", func() bool {
			p, err := c.client.PolicyV1().PodDisruptionBudgets("default").Get(ctx, "web", metav1.GetOptions{})
			return err == nil && p.Status.DisruptionsAllowed == 1 && p.Status.ExpectedPods == 2
		})

		w, err := c.client.CoreV1().Pods("default").Watch(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		fewest, seen := 2, map[string]*corev1.Pod{}
		done := make(chan struct{})
		go func() {
			defer close(done)
			for ev := range w.ResultChan() {
				p, ok := ev.Object.(*corev1.Pod)
				if !ok {
					continue
				}
				mu.Lock()
				if ev.Type == watch.Deleted {
					delete(seen, p.Name)
				} else {
					seen[p.Name] = p
				}
				if len(seen) >= 2 {
					fewest = min(fewest, readyCount(seen))
				}
				mu.Unlock()
			}
		}()
		start := time.Now()
		out := k.Run("drain", "node-a", "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=4m")
		t.Logf("drain took %v", time.Since(start).Round(time.Second))
		w.Stop()
		<-done
		if !strings.Contains(out, "node/node-a drained") {
			t.Errorf("kubectl drain:\n%s", out)
		}
		mu.Lock()
		defer mu.Unlock()
		if fewest < 1 {
			t.Errorf("during the drain the Deployment went down to %d ready pods", fewest)
		}
		list, err := c.client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil && p.Spec.NodeName != "node-b" {
				t.Errorf("pod %s on %s after the drain", p.Name, p.Spec.NodeName)
			}
		}
		k.Run("uncordon", "node-a")
	})

	t.Run("preempt", func(t *testing.T) {
		for name, value := range map[string]int32{"batch": 10, "urgent": 100000} {
			pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: value}
			if _, err := c.client.SchedulingV1().PriorityClasses().Create(ctx, pc, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		// node-a is full of a batch pod; an urgent pod must run there.
		onA := map[string]string{"kubernetes.io/hostname": "node-a"}
		batch := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "batch"}, Spec: corev1.PodSpec{PriorityClassName: "batch", NodeSelector: onA,
			TerminationGracePeriodSeconds: ptr.To[int64](1), Containers: []corev1.Container{agenttest.Busybox("work", "sleep 3600")}}}
		node, err := c.client.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		most := node.Status.Allocatable.Cpu().DeepCopy()
		most.Sub(resource.MustParse("100m"))
		batch.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: most}
		if _, err := c.client.CoreV1().Pods("default").Create(ctx, batch, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		agenttest.EventuallyWithin(t, "the batch pod running", 2*time.Minute, func() bool {
			p, err := c.client.CoreV1().Pods("default").Get(ctx, "batch", metav1.GetOptions{})
			return err == nil && p.Status.Phase == corev1.PodRunning
		})
		urgent := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "urgent"}, Spec: corev1.PodSpec{PriorityClassName: "urgent", NodeSelector: onA,
			TerminationGracePeriodSeconds: ptr.To[int64](1), Containers: []corev1.Container{agenttest.Busybox("work", "sleep 3600")}}}
		urgent.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m")}
		start := time.Now()
		if _, err := c.client.CoreV1().Pods("default").Create(ctx, urgent, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		agenttest.EventuallyWithin(t, "the urgent pod running where the batch pod was", 2*time.Minute, func() bool {
			p, err := c.client.CoreV1().Pods("default").Get(ctx, "urgent", metav1.GetOptions{})
			return err == nil && p.Status.Phase == corev1.PodRunning && p.Spec.NodeName == "node-a"
		})
		t.Logf("urgent pod running %v after it was made", time.Since(start).Round(100*time.Millisecond))
		if _, err := c.client.CoreV1().Pods("default").Get(ctx, "batch", metav1.GetOptions{}); err == nil {
			p, _ := c.client.CoreV1().Pods("default").Get(ctx, "batch", metav1.GetOptions{})
			if p.DeletionTimestamp == nil {
				t.Error("the batch pod was not preempted")
			}
		}
	})

	t.Run("autoscale", func(t *testing.T) {
		// Each pod burns a core for 90 s from its start, then idles.
		burn := agenttest.Busybox("burn", `end=$(( $(date +%s) + 90 )); while [ "$(date +%s)" -lt "$end" ]; do :; done; sleep 3600`)
		burn.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}
		if _, err := c.client.AppsV1().Deployments("default").Create(ctx, deployment("burn", 1, burn), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		hpa := &autoscalingv2.HorizontalPodAutoscaler{ObjectMeta: metav1.ObjectMeta{Name: "burn"}, Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "burn"},
			MinReplicas:    ptr.To[int32](1), MaxReplicas: 4,
			Metrics: []autoscalingv2.MetricSpec{{Type: autoscalingv2.ResourceMetricSourceType, Resource: &autoscalingv2.ResourceMetricSource{
				Name: corev1.ResourceCPU, Target: autoscalingv2.MetricTarget{Type: autoscalingv2.UtilizationMetricType, AverageUtilization: ptr.To[int32](50)}}}},
			Behavior: &autoscalingv2.HorizontalPodAutoscalerBehavior{ScaleDown: &autoscalingv2.HPAScalingRules{StabilizationWindowSeconds: ptr.To[int32](20)}},
		}}
		if _, err := c.client.AutoscalingV2().HorizontalPodAutoscalers("default").Create(ctx, hpa, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		agenttest.Eventually(t, "the autoscaler scales the burning Deployment to 3 or more", func() bool {
			d, err := c.client.AppsV1().Deployments("default").Get(ctx, "burn", metav1.GetOptions{})
			return err == nil && *d.Spec.Replicas >= 3
		})
		t.Logf("scaled up %v after the autoscaler was made", time.Since(start).Round(time.Second))
		if out := k.Run("get", "hpa", "burn"); !strings.Contains(out, "cpu: ") || !strings.Contains(out, "/50%") {
			t.Errorf("kubectl get hpa:\n%s", out)
		}
		agenttest.EventuallyWithin(t, "back to 1 once the pods idle", 3*time.Minute, func() bool {
			d, err := c.client.AppsV1().Deployments("default").Get(ctx, "burn", metav1.GetOptions{})
			return err == nil && *d.Spec.Replicas == 1
		})
		t.Logf("scaled down %v after the autoscaler was made", time.Since(start).Round(time.Second))
		got, err := c.client.AutoscalingV2().HorizontalPodAutoscalers("default").Get(ctx, "burn", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		reasons := map[autoscalingv2.HorizontalPodAutoscalerConditionType]string{}
		for _, cond := range got.Status.Conditions {
			reasons[cond.Type] = cond.Reason
		}
		if reasons[autoscalingv2.ScalingActive] != "ValidMetricFound" || reasons[autoscalingv2.AbleToScale] == "" {
			t.Errorf("conditions after scaling: %+v", got.Status.Conditions)
		}
	})
}
