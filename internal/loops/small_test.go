package loops_test

import (
	"context"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/loops/hollow"
	"github.com/orch-dev/orch/internal/loops/loopstest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestDefaultServiceAccounts(t *testing.T) {
	c := loopstest.Start(t, nil, hollow.Options{LeaseEvery: -1})
	if _, err := c.Client.CoreV1().Namespaces().Create(c.Ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	has := func(ns string) func(ctx context.Context) (bool, error) {
		return func(ctx context.Context) (bool, error) {
			_, err := c.Client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
			return err == nil, nil
		}
	}
	c.Eventually("default service account in default", 10*time.Second, has("default"))
	c.Eventually("default service account in a new namespace", 10*time.Second, has("team"))
	if err := c.Client.CoreV1().ServiceAccounts("team").Delete(c.Ctx, "default", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("deleted default service account back", 10*time.Second, has("team"))
}

func TestNodePodCIDRs(t *testing.T) {
	c := loopstest.Start(t, map[string]hollow.NodeOptions{"n1": {}}, hollow.Options{LeaseEvery: -1})
	cidr := func(node, want string) {
		t.Helper()
		c.Eventually(node+" gets "+want, 10*time.Second, func(ctx context.Context) (bool, error) {
			n, err := c.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			return err == nil && n.Spec.PodCIDR == want && len(n.Spec.PodCIDRs) == 1 && n.Spec.PodCIDRs[0] == want, nil
		})
	}
	cidr("n1", "10.42.0.0/24")
	c.AddNode("n2", hollow.NodeOptions{})
	cidr("n2", "10.42.1.0/24")
	if err := c.Client.CoreV1().Nodes().Delete(c.Ctx, "n1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("n1 gone", 10*time.Second, func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	time.Sleep(time.Second) // the controller's informer sees the deletion
	c.AddNode("n3", hollow.NodeOptions{})
	cidr("n3", "10.42.0.0/24")
}
