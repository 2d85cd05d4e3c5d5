package nodelifecycle_test

import (
	"context"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/loops"
	"github.com/orch-dev/orch/internal/loops/hollow"
	"github.com/orch-dev/orch/internal/loops/loopstest"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestSilentNodeLosesItsPods: a node that stops renewing its lease turns
// Unknown and gets the unreachable taints; its pods are evicted when
// their toleration runs out and come back on the other nodes.
func TestSilentNodeLosesItsPods(t *testing.T) {
	three := map[string]hollow.NodeOptions{"n1": {}, "n2": {}, "n3": {}}
	c := loopstest.StartWith(t, three, hollow.Options{LeaseEvery: 100 * time.Millisecond},
		loops.Options{NodeMonitorGracePeriod: time.Second, NodeCheckEvery: 100 * time.Millisecond})
	labels := map[string]string{"app": "web"}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](6), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "c", Image: "busybox"}},
				// Kubernetes' admission gives 300 s; this test cannot wait that long.
				Tolerations: []corev1.Toleration{{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](1)}},
			}}},
	}
	if _, err := c.Client.AppsV1().Deployments("default").Create(c.Ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	onNode := func(ctx context.Context) (map[string]int, error) {
		pods, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return nil, err
		}
		out := map[string]int{}
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
				out[p.Spec.NodeName]++
			}
		}
		return out, nil
	}
	c.Eventually("6 pods running, 2 per node", 30*time.Second, func(ctx context.Context) (bool, error) {
		got, err := onNode(ctx)
		return err == nil && got["n1"] == 2 && got["n2"] == 2 && got["n3"] == 2, nil
	})

	c.Nodes.Silence("n1")
	c.Eventually("n1 Unknown and tainted unreachable", 20*time.Second, func(ctx context.Context) (bool, error) {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		unknown, tainted := false, 0
		for _, cond := range n.Status.Conditions {
			unknown = unknown || cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionUnknown
		}
		for _, taint := range n.Spec.Taints {
			if taint.Key == corev1.TaintNodeUnreachable {
				tainted++
			}
		}
		return unknown && tainted == 2, nil
	})
	c.Eventually("the 6 pods running on n2 and n3", 30*time.Second, func(ctx context.Context) (bool, error) {
		got, err := onNode(ctx)
		return err == nil && got["n1"] == 0 && got["n2"]+got["n3"] == 6, nil
	})
	// The healthy nodes keep no health taint.
	n2, _ := c.Client.CoreV1().Nodes().Get(c.Ctx, "n2", metav1.GetOptions{})
	if len(n2.Spec.Taints) != 0 {
		t.Errorf("healthy node tainted: %v", n2.Spec.Taints)
	}
}
