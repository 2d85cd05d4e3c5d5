package deployment_test

import (
	"context"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/loops/hollow"
	"github.com/orch-dev/orch/internal/loops/loopstest"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
)

func deployment(name string, strategy appsv1.DeploymentStrategyType) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](4), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Strategy: appsv1.DeploymentStrategy{Type: strategy},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox:1"}}}},
		},
	}
}

// images counts the live pods of the deployment by image.
func images(ctx context.Context, c *loopstest.Cluster, app string) (map[string]int, error) {
	pods, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			out[p.Spec.Containers[0].Image]++
		}
	}
	return out, nil
}

// liveImages counts the pods not being deleted by image.
func liveImages(pods map[string]*corev1.Pod) map[string]int {
	out := map[string]int{}
	for _, p := range pods {
		if p.DeletionTimestamp == nil {
			out[p.Spec.Containers[0].Image]++
		}
	}
	return out
}

func setImage(t *testing.T, c *loopstest.Cluster, name, image string, paused *bool) {
	t.Helper()
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		d, err := c.Client.AppsV1().Deployments("default").Get(c.Ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if image != "" {
			d.Spec.Template.Spec.Containers[0].Image = image
		}
		if paused != nil {
			d.Spec.Paused = *paused
		}
		_, err = c.Client.AppsV1().Deployments("default").Update(c.Ctx, d, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

func complete(t *testing.T, c *loopstest.Cluster, name, image string) {
	t.Helper()
	c.Eventually(name+" at 4 pods of "+image, 30*time.Second, func(ctx context.Context) (bool, error) {
		got, err := images(ctx, c, name)
		d, derr := c.Client.AppsV1().Deployments("default").Get(ctx, name, metav1.GetOptions{})
		return err == nil && derr == nil && got[image] == 4 && len(got) == 1 && d.Status.AvailableReplicas == 4 && d.Status.UpdatedReplicas == 4, nil
	})
}

// TestRecreate: every old pod is gone before a new one starts.
func TestRecreate(t *testing.T) {
	c := loopstest.Start(t, map[string]hollow.NodeOptions{"n1": {}}, hollow.Options{LeaseEvery: -1})
	if _, err := c.Client.AppsV1().Deployments("default").Create(c.Ctx, deployment("db", appsv1.RecreateDeploymentStrategyType), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	complete(t, c, "db", "busybox:1")
	pods := c.RecordPods("default", "app=db")
	setImage(t, c, "db", "busybox:2", nil)
	complete(t, c, "db", "busybox:2")
	for _, state := range pods.Stop(t) {
		if got := liveImages(state); got["busybox:1"] > 0 && got["busybox:2"] > 0 {
			t.Fatalf("Recreate ran old and new pods at once: %v", got)
		}
	}
}

// TestPauseAndResume: a paused deployment rolls nothing out until resumed.
func TestPauseAndResume(t *testing.T) {
	c := loopstest.Start(t, map[string]hollow.NodeOptions{"n1": {}}, hollow.Options{LeaseEvery: -1})
	if _, err := c.Client.AppsV1().Deployments("default").Create(c.Ctx, deployment("web", appsv1.RollingUpdateDeploymentStrategyType), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	complete(t, c, "web", "busybox:1")
	setImage(t, c, "web", "", ptr.To(true))
	pods, sets := c.RecordPods("default", "app=web"), c.RecordReplicaSets("default", "app=web")
	setImage(t, c, "web", "busybox:2", nil)
	c.Eventually("the paused condition", 10*time.Second, func(ctx context.Context) (bool, error) {
		d, err := c.Client.AppsV1().Deployments("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, cond := range d.Status.Conditions {
			if cond.Type == appsv1.DeploymentProgressing && cond.Reason == "DeploymentPaused" {
				return d.Status.ObservedGeneration == d.Generation, nil
			}
		}
		return false, nil
	})
	// The controller has seen the new image (the paused condition is for
	// this generation): whatever it did about it is in the records.
	for _, state := range pods.Stop(t) {
		if got := liveImages(state); got["busybox:2"] != 0 {
			t.Fatalf("a paused deployment rolled out: %v", got)
		}
	}
	for _, state := range sets.Stop(t) {
		for _, rs := range state {
			if rs.Spec.Template.Spec.Containers[0].Image == "busybox:2" {
				t.Fatalf("a paused deployment made ReplicaSet %s for the new image", rs.Name)
			}
		}
	}
	setImage(t, c, "web", "", ptr.To(false))
	complete(t, c, "web", "busybox:2")
}

// TestProgressDeadline: a rollout that cannot progress is reported as
// ProgressDeadlineExceeded, which kubectl rollout status turns into an error.
func TestProgressDeadline(t *testing.T) {
	c := loopstest.Start(t, map[string]hollow.NodeOptions{"n1": {}}, hollow.Options{LeaseEvery: -1})
	d := deployment("stuck", appsv1.RollingUpdateDeploymentStrategyType)
	d.Spec.ProgressDeadlineSeconds = ptr.To[int32](1)
	d.Spec.Template.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("64")}
	if _, err := c.Client.AppsV1().Deployments("default").Create(c.Ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("ProgressDeadlineExceeded", 20*time.Second, func(ctx context.Context) (bool, error) {
		got, err := c.Client.AppsV1().Deployments("default").Get(ctx, "stuck", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, cond := range got.Status.Conditions {
			if cond.Type == appsv1.DeploymentProgressing && cond.Status == corev1.ConditionFalse && cond.Reason == "ProgressDeadlineExceeded" {
				return true, nil
			}
		}
		return false, nil
	})
}
