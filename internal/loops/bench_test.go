package loops_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/loops/hollow"
	"github.com/orch-dev/orch/internal/loops/loopstest"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
)

// BenchmarkDeployment100: a Deployment of 100 replicas on 10 hollow nodes,
// from create to every pod bound and Ready (the whole loop: deployment and
// replicaset controllers, scheduler, kubelet status, over the API).
func BenchmarkDeployment100(b *testing.B) {
	nodes := map[string]hollow.NodeOptions{}
	for i := range 10 {
		nodes[fmt.Sprintf("n%02d", i)] = hollow.NodeOptions{}
	}
	for i := range b.N {
		c := loopstest.Start(b, nodes, hollow.Options{LeaseEvery: -1, Workers: 16})
		labels := map[string]string{"app": "bench"}
		d := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-%d", i)},
			Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](100), Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}},
		}
		start := time.Now()
		if _, err := c.Client.AppsV1().Deployments("default").Create(c.Ctx, d, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		err := wait.PollUntilContextTimeout(c.Ctx, 5*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			got, err := c.Client.AppsV1().Deployments("default").Get(ctx, d.Name, metav1.GetOptions{})
			return err == nil && got.Status.ReadyReplicas == 100 && got.Status.UpdatedReplicas == 100, nil
		})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(time.Since(start).Milliseconds()), "ms-to-ready")
	}
}
