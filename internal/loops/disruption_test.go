package loops_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api/apitest"
	"github.com/orch-dev/orch/internal/loops/hollow"
	"github.com/orch-dev/orch/internal/loops/loopstest"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

func deploymentOf(name string, replicas int32, mut func(*corev1.PodSpec)) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: appsv1.DeploymentSpec{Replicas: &replicas,
		Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox:1.36"}}}}}}
	if mut != nil {
		mut(&d.Spec.Template.Spec)
	}
	return d
}

func budget(name, app string, mut func(*policyv1.PodDisruptionBudgetSpec)) *policyv1.PodDisruptionBudget {
	p := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}}}
	mut(&p.Spec)
	return p
}

// budgetStatus waits for the budget's status to say what the disruption
// loop, as Kubernetes', computes.
func budgetStatus(c *loopstest.Cluster, name string, expected, desired, healthy, allowed int32) {
	c.Eventually(name+" status", 20*time.Second, func(ctx context.Context) (bool, error) {
		p, err := c.Client.PolicyV1().PodDisruptionBudgets("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		s := p.Status
		return s.ObservedGeneration == p.Generation && s.ExpectedPods == expected && s.DesiredHealthy == desired &&
			s.CurrentHealthy == healthy && s.DisruptionsAllowed == allowed, nil
	})
}

func readyPods(ctx context.Context, c *loopstest.Cluster, app string) ([]corev1.Pod, error) {
	list, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && podReady(&p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// TestDisruptionBudgetStatus: the disruption loop's arithmetic on the
// budgets users write, as Kubernetes': an absolute minAvailable expects
// the pods there are; a percentage and maxUnavailable the sum of the
// controllers' scales, which a scale changes.
func TestDisruptionBudgetStatus(t *testing.T) {
	c := loopstest.Start(t, map[string]hollow.NodeOptions{"n1": {}}, hollow.Options{LeaseEvery: -1})
	ctx := c.Ctx
	if _, err := c.Client.AppsV1().Deployments("default").Create(ctx, deploymentOf("web", 3, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*policyv1.PodDisruptionBudget{
		budget("min-two", "web", func(s *policyv1.PodDisruptionBudgetSpec) { s.MinAvailable = ptr.To(intstr.FromInt32(2)) }),
		budget("half-down", "web", func(s *policyv1.PodDisruptionBudgetSpec) { s.MaxUnavailable = ptr.To(intstr.FromString("50%")) }),
		budget("most-up", "web", func(s *policyv1.PodDisruptionBudgetSpec) { s.MinAvailable = ptr.To(intstr.FromString("60%")) }),
		budget("nobody", "none", func(s *policyv1.PodDisruptionBudgetSpec) { s.MinAvailable = ptr.To(intstr.FromInt32(1)) }),
	} {
		if _, err := c.Client.PolicyV1().PodDisruptionBudgets("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	budgetStatus(c, "min-two", 3, 2, 3, 1)
	budgetStatus(c, "half-down", 3, 1, 3, 2) // 50% of 3 rounds up to 2 unavailable
	budgetStatus(c, "most-up", 3, 2, 3, 1)   // 60% of 3 rounds up to 2 available
	budgetStatus(c, "nobody", 0, 1, 0, 0)
	p, err := c.Client.PolicyV1().PodDisruptionBudgets("default").Get(ctx, "min-two", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cond := p.Status.Conditions; len(cond) != 1 || cond[0].Type != policyv1.DisruptionAllowedCondition || cond[0].Status != metav1.ConditionTrue || cond[0].Reason != policyv1.SufficientPodsReason {
		t.Errorf("conditions: %+v", cond)
	}

	if _, err := c.Client.AppsV1().Deployments("default").Patch(ctx, "web", "application/merge-patch+json", []byte(`{"spec":{"replicas":5}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	budgetStatus(c, "half-down", 5, 2, 5, 3)
	budgetStatus(c, "min-two", 5, 2, 5, 3)

	// A spec change is not trusted until the loop has seen it.
	if _, err := c.Client.PolicyV1().PodDisruptionBudgets("default").Patch(ctx, "min-two", "application/merge-patch+json",
		[]byte(`{"spec":{"minAvailable":5}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	budgetStatus(c, "min-two", 5, 5, 5, 0)
	p, _ = c.Client.PolicyV1().PodDisruptionBudgets("default").Get(ctx, "min-two", metav1.GetOptions{})
	if cond := p.Status.Conditions; len(cond) != 1 || cond[0].Status != metav1.ConditionFalse || cond[0].Reason != policyv1.InsufficientPodsReason {
		t.Errorf("conditions with no disruption allowed: %+v", cond)
	}

	// Bad input is Kubernetes' error.
	_, err = c.Client.PolicyV1().PodDisruptionBudgets("default").Create(ctx, budget("both", "web", func(s *policyv1.PodDisruptionBudgetSpec) {
		s.MinAvailable, s.MaxUnavailable = ptr.To(intstr.FromInt32(1)), ptr.To(intstr.FromInt32(1))
	}), metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "minAvailable and maxUnavailable cannot be both set") {
		t.Errorf("a budget with both minAvailable and maxUnavailable: %v", err)
	}
}

// TestEviction: the eviction API's decisions, as Kubernetes': a budget
// that allows a disruption gives it to one eviction (the pod is marked
// DisruptionTarget and deleted), the next is refused with 429 naming the
// budget; a dry run takes nothing; a pod under two budgets is a 500; a
// pod that does not run or is not ready goes whatever the budget.
func TestEviction(t *testing.T) {
	c := loopstest.Start(t, map[string]hollow.NodeOptions{"n1": {}}, hollow.Options{LeaseEvery: -1})
	ctx := c.Ctx
	d := deploymentOf("web", 3, nil)
	if _, err := c.Client.AppsV1().Deployments("default").Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.PolicyV1().PodDisruptionBudgets("default").Create(ctx, budget("web", "web", func(s *policyv1.PodDisruptionBudgetSpec) {
		s.MinAvailable = ptr.To(intstr.FromInt32(2))
	}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	budgetStatus(c, "web", 3, 2, 3, 1)
	pods, err := readyPods(ctx, c, "web")
	if err != nil || len(pods) != 3 {
		t.Fatalf("3 ready pods: %d, %v", len(pods), err)
	}
	evict := func(name string, opts *metav1.DeleteOptions) error {
		return c.Client.PolicyV1().Evictions("default").Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, DeleteOptions: opts})
	}

	// A dry run is answered as the real one would be, and changes nothing.
	if err := evict(pods[0].Name, &metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Fatalf("dry-run eviction: %v", err)
	}
	p, _ := c.Client.PolicyV1().PodDisruptionBudgets("default").Get(ctx, "web", metav1.GetOptions{})
	if p.Status.DisruptionsAllowed != 1 || len(p.Status.DisruptedPods) != 0 {
		t.Errorf("a dry run took from the budget: %+v", p.Status)
	}
	if pod, _ := c.Client.CoreV1().Pods("default").Get(ctx, pods[0].Name, metav1.GetOptions{}); pod.DeletionTimestamp != nil {
		t.Error("a dry run deleted the pod")
	}

	// A finalizer keeps the evicted pod in sight, being deleted (hollow
	// nodes end a pod's grace period at once).
	hold := []byte(`{"metadata":{"finalizers":["test.orch.dev/hold"]}}`)
	if _, err := c.Client.CoreV1().Pods("default").Patch(ctx, pods[0].Name, types.MergePatchType, hold, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = c.Client.CoreV1().Pods("default").Patch(context.Background(), pods[0].Name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	})
	if err := evict(pods[0].Name, nil); err != nil {
		t.Fatalf("eviction the budget allows: %v", err)
	}
	pod, err := c.Client.CoreV1().Pods("default").Get(ctx, pods[0].Name, metav1.GetOptions{})
	if err != nil || pod.DeletionTimestamp == nil {
		t.Fatalf("evicted pod not being deleted: %v", err)
	}
	var marked bool
	for _, cond := range pod.Status.Conditions {
		marked = marked || cond.Type == corev1.DisruptionTarget && cond.Status == corev1.ConditionTrue && cond.Reason == "EvictionByEvictionAPI"
	}
	if !marked {
		t.Errorf("evicted pod's conditions: %+v", pod.Status.Conditions)
	}
	// The eviction took the one disruption (the pod it names is dropped
	// from disruptedPods once the loop sees it being deleted).
	p, _ = c.Client.PolicyV1().PodDisruptionBudgets("default").Get(ctx, "web", metav1.GetOptions{})
	if p.Status.DisruptionsAllowed != 0 {
		t.Errorf("budget after the eviction: %+v", p.Status)
	}
	// A budget that wants all three allows nothing more.
	if _, err := c.Client.PolicyV1().PodDisruptionBudgets("default").Patch(ctx, "web", types.MergePatchType, []byte(`{"spec":{"minAvailable":3}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("the loop sees the new minimum", 20*time.Second, func(ctx context.Context) (bool, error) {
		p, err := c.Client.PolicyV1().PodDisruptionBudgets("default").Get(ctx, "web", metav1.GetOptions{})
		return err == nil && p.Status.ObservedGeneration == p.Generation && p.Status.DesiredHealthy == 3, err
	})
	err = evict(pods[1].Name, nil)
	var status apierrors.APIStatus
	if !apierrors.IsTooManyRequests(err) || !errors.As(err, &status) || status.Status().Details == nil ||
		len(status.Status().Details.Causes) != 1 || status.Status().Details.Causes[0].Type != policyv1.DisruptionBudgetCause ||
		!strings.Contains(status.Status().Details.Causes[0].Message, "The disruption budget web needs 3 healthy pods and has") {
		t.Fatalf("eviction beyond the budget: %v (%+v)", err, status)
	}

	// Two budgets over one pod: Kubernetes' 500.
	if _, err := c.Client.PolicyV1().PodDisruptionBudgets("default").Create(ctx, budget("web-too", "web", func(s *policyv1.PodDisruptionBudgetSpec) {
		s.MaxUnavailable = ptr.To(intstr.FromInt32(3))
	}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = evict(pods[1].Name, nil)
	if !apierrors.IsInternalError(err) && !strings.Contains(err.Error(), "more than one PodDisruptionBudget") {
		t.Errorf("eviction of a pod under two budgets: %v", err)
	}
	if err := c.Client.PolicyV1().PodDisruptionBudgets("default").Delete(ctx, "web-too", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// A pod that is not ready counts for nothing: with the budget met
	// without it, it goes.
	if _, err := c.Client.PolicyV1().PodDisruptionBudgets("default").Patch(ctx, "web", types.MergePatchType, []byte(`{"spec":{"minAvailable":1}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	unready, err := c.Client.CoreV1().Pods("default").Get(ctx, pods[1].Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range unready.Status.Conditions {
		if unready.Status.Conditions[i].Type == corev1.PodReady {
			unready.Status.Conditions[i].Status = corev1.ConditionFalse
		}
	}
	if _, err := c.Client.CoreV1().Pods("default").UpdateStatus(ctx, unready, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("the budget sees the pod unready", 20*time.Second, func(ctx context.Context) (bool, error) {
		p, err := c.Client.PolicyV1().PodDisruptionBudgets("default").Get(ctx, "web", metav1.GetOptions{})
		return err == nil && p.Status.ObservedGeneration == p.Generation && p.Status.DesiredHealthy == 1 && p.Status.CurrentHealthy >= 1, err
	})
	if err := evict(unready.Name, nil); err != nil {
		t.Errorf("eviction of an unready pod with the budget met: %v", err)
	}

	// A pod without budget is evicted; a missing one is 404.
	if _, err := c.Client.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "lone", Labels: map[string]string{"app": "lone"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox:1.36"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := evict("lone", nil); err != nil {
		t.Errorf("eviction of a pod without budget: %v", err)
	}
	if err := evict("nothing-here", nil); !apierrors.IsNotFound(err) {
		t.Errorf("eviction of a missing pod: %v", err)
	}
}

// TestKubectlDrainRespectsBudget: `kubectl drain` of a node that runs both
// replicas of a Deployment under minAvailable 1 evicts one, waits for its
// replacement to be ready on the other node, then evicts the second: at
// no time is the Deployment without a ready pod.
func TestKubectlDrainRespectsBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kubectl")
	}
	c := loopstest.Start(t, map[string]hollow.NodeOptions{"n1": {}, "n2": {}}, hollow.Options{LeaseEvery: -1})
	ctx := c.Ctx
	k := apitest.NewKubectl(t, c.Server.Kubeconfig)
	k.Run("cordon", "n2")
	if _, err := c.Client.AppsV1().Deployments("default").Create(ctx, deploymentOf("web", 2, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	k.Run("rollout", "status", "deployment/web", "--timeout=60s")
	k.Run("uncordon", "n2")
	k.Run("create", "poddisruptionbudget", "web", "--selector=app=web", "--min-available=1")
	budgetStatus(c, "web", 2, 1, 2, 1)

	record := c.RecordPods("default", "app=web")
	out := k.Run("drain", "n1", "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=90s")
	if !strings.Contains(out, "evicted") || !strings.Contains(out, "node/n1 drained") {
		t.Errorf("kubectl drain: %s", out)
	}
	fewest := 2
	for _, state := range record.Stop(t) {
		ready := 0
		for _, p := range state {
			if p.DeletionTimestamp == nil && podReady(p) {
				ready++
			}
		}
		fewest = min(fewest, ready)
	}
	if fewest < 1 {
		t.Errorf("the drain left the Deployment with %d ready pods", fewest)
	}
	pods, err := readyPods(ctx, c, "web")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		if p.Spec.NodeName != "n2" {
			t.Errorf("pod %s still on %s after the drain", p.Name, p.Spec.NodeName)
		}
	}
	if n, _ := c.Client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{}); !n.Spec.Unschedulable {
		t.Error("drained node is schedulable")
	}
}
