package nodelifecycle_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/orch-dev/orch/internal/api/apitest"
	"github.com/orch-dev/orch/internal/loops"
	"github.com/orch-dev/orch/internal/loops/hollow"
	"github.com/orch-dev/orch/internal/loops/loopstest"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
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
	// The evicted pods say why, as Kubernetes' taint manager marks them.
	pods, err := c.Client.CoreV1().Pods("default").List(c.Ctx, metav1.ListOptions{LabelSelector: "app=web", FieldSelector: "spec.nodeName=n1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) == 0 {
		t.Error("the silent node's pods are gone: its kubelet cannot have confirmed their end")
	}
	for _, p := range pods.Items {
		marked := false
		for _, cond := range p.Status.Conditions {
			marked = marked || cond.Type == corev1.DisruptionTarget && cond.Status == corev1.ConditionTrue && cond.Reason == "DeletionByTaintManager"
		}
		if !marked {
			t.Errorf("evicted pod %s: %+v", p.Name, p.Status.Conditions)
		}
	}
	// The healthy nodes keep no health taint.
	n2, _ := c.Client.CoreV1().Nodes().Get(c.Ctx, "n2", metav1.GetOptions{})
	if len(n2.Spec.Taints) != 0 {
		t.Errorf("healthy node tainted: %v", n2.Spec.Taints)
	}
}

// TestRestartedControlPlaneGivesNodesAGracePeriod: a node last heard from
// an hour ago, because the control plane itself was down, is not marked
// Unknown the moment the controller starts again; it gets a whole grace
// period to renew its lease, as Kubernetes' controller (which times nodes
// from when it first observes them) gives it. Only if it stays silent is
// it marked Unknown.
func TestRestartedControlPlaneGivesNodesAGracePeriod(t *testing.T) {
	srv := apitest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hourAgo := metav1.NewTime(time.Now().Add(-time.Hour))
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-1"}}
	node, err := srv.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		LastHeartbeatTime: hourAgo, LastTransitionTime: hourAgo}}
	if _, err := srv.Client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "edge-1", Namespace: corev1.NamespaceNodeLease},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("edge-1"), RenewTime: &metav1.MicroTime{Time: hourAgo.Time}}}
	if _, err := srv.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Create(ctx, lease, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	const grace = 2 * time.Second
	// The node was registered longer than a grace period ago, too.
	time.Sleep(grace + grace/4)
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- loops.Run(ctx, srv.Loopback(), loops.Options{NodeMonitorGracePeriod: grace, NodeCheckEvery: 50 * time.Millisecond,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, func() { close(started) })
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("loops: %v", err)
		}
	}()
	<-started
	ready := func() corev1.ConditionStatus {
		n, err := srv.Client.CoreV1().Nodes().Get(ctx, "edge-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status
			}
		}
		return ""
	}
	startedAt := time.Now()
	for time.Since(startedAt) < grace/2 {
		if got := ready(); got != corev1.ConditionTrue {
			t.Fatalf("%s after the controller started, the node is Ready=%s: judged on the control plane's own downtime", time.Since(startedAt), got)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for ready() != corev1.ConditionUnknown {
		if time.Since(startedAt) > 10*grace {
			t.Fatal("a node silent for the whole grace period after the restart was never marked Unknown")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestKubernetesTimingsOnAFakeClock: Kubernetes' own numbers (40 s of
// silence before a node is Unknown, the 300 s every pod tolerates an
// unreachable node by admission's default) on a clock the test steps,
// instead of waiting five minutes or shortening them.
func TestKubernetesTimingsOnAFakeClock(t *testing.T) {
	if testing.Short() {
		t.Skip("lets five minutes pass in steps the nodes keep up with (10 s): not in the unit tier")
	}
	fake := clocktesting.NewFakeClock(time.Now())
	// The fake clock keeps pace with real time, so that back-offs and
	// retries happen; the test moves it further when it has to.
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				fake.Step(10 * time.Millisecond)
			}
		}
	}()
	// advance moves the clock by d in 5 s steps, giving the other nodes'
	// renewals (every 100 ms of real time) the time to keep up.
	advance := func(d time.Duration) {
		for moved := time.Duration(0); moved < d; moved += 5 * time.Second {
			fake.Step(min(5*time.Second, d-moved))
			time.Sleep(150 * time.Millisecond)
		}
	}
	two := map[string]hollow.NodeOptions{"n1": {}, "n2": {}}
	c := loopstest.StartWith(t, two, hollow.Options{LeaseEvery: 100 * time.Millisecond, Clock: fake}, loops.Options{Clock: fake})
	labels := map[string]string{"app": "web"}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](4), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}},
	}
	if _, err := c.Client.AppsV1().Deployments("default").Create(c.Ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	running := func(ctx context.Context) map[string]int {
		pods, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		out := map[string]int{}
		if err != nil {
			return out
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
				out[p.Spec.NodeName]++
			}
		}
		return out
	}
	c.Eventually("4 pods running on both nodes", 30*time.Second, func(ctx context.Context) (bool, error) {
		got := running(ctx)
		return got["n1"] > 0 && got["n1"]+got["n2"] == 4, nil
	})
	onN1 := running(c.Ctx)["n1"]

	c.Nodes.Silence("n1")
	// 35 s, and a second or two more as the clock keeps pace.
	advance(35 * time.Second)
	if n, err := c.Client.CoreV1().Nodes().Get(c.Ctx, "n1", metav1.GetOptions{}); err != nil || len(n.Spec.Taints) > 0 {
		t.Fatalf("n1 tainted before 40 s of silence: %+v %v", n.Spec.Taints, err)
	}
	advance(10 * time.Second)
	c.Eventually("n1 tainted unreachable after 40 s", 20*time.Second, func(ctx context.Context) (bool, error) {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		return err == nil && len(n.Spec.Taints) == 2 && n.Spec.Taints[0].Key == corev1.TaintNodeUnreachable, nil
	})
	// Within the 300 s every pod tolerates, n1's pods stay where they are.
	advance(240 * time.Second)
	if got := running(c.Ctx)["n1"]; got != onN1 {
		t.Fatalf("%d of n1's %d pods left before their 300 s toleration ran out", onN1-got, onN1)
	}
	advance(60 * time.Second)
	c.Eventually("the 4 pods running on n2 once 300 s are up", 30*time.Second, func(ctx context.Context) (bool, error) {
		got := running(ctx)
		return got["n1"] == 0 && got["n2"] == 4, nil
	})
}
