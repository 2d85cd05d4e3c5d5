package loops_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/loops"
	"github.com/orch-dev/orch/internal/loops/hollow"
	"github.com/orch-dev/orch/internal/loops/loopstest"
	"github.com/orch-dev/orch/internal/upgradeapi"
)

// fakeNodes plays the nodes' side of upgrades, as an agent does (the
// root and e2e tests run the real one): told a version, a node reports
// running it, or, when it is one of failing, that it rolled back. It
// records the order nodes were told in and how many ran at once.
type fakeNodes struct {
	mu        sync.Mutex
	told      []string
	upgrading map[string]bool
	most      int
	failing   map[string]bool
}

func (f *fakeNodes) run(ctx context.Context, c *loopstest.Cluster) {
	w, err := c.Client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		node, ok := ev.Object.(*corev1.Node)
		if !ok || ev.Type == watch.Deleted {
			continue
		}
		target := node.Annotations[upgradeapi.TargetAnnotation]
		f.mu.Lock()
		if target == "" {
			delete(f.upgrading, node.Name)
			f.mu.Unlock()
			continue
		}
		if target == node.Annotations[upgradeapi.VersionAnnotation] || strings.HasPrefix(node.Annotations[upgradeapi.FailedAnnotation], target+":") {
			f.mu.Unlock()
			continue
		}
		if !f.upgrading[node.Name] {
			f.upgrading[node.Name] = true
			f.told = append(f.told, node.Name)
			f.most = max(f.most, len(f.upgrading))
		}
		failing := f.failing[node.Name]
		f.mu.Unlock()
		annotations := map[string]any{upgradeapi.VersionAnnotation: target}
		if failing {
			annotations = map[string]any{upgradeapi.FailedAnnotation: target + ": the node was not Ready on the new binary by the deadline"}
		}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
		go func() {
			time.Sleep(300 * time.Millisecond) // the download, swap and restart
			_, _ = c.Client.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		}()
	}
}

func (f *fakeNodes) order() ([]string, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.told...), f.most
}

// TestUpgradePlans: the upgrade loop moves a server's node, then two
// agents one at a time, each drained through the eviction API with a
// budget respected, and uncordons them; it refuses plans it cannot carry
// out with the reason in their status; a node that rolls back stops the
// plan.
func TestUpgradePlans(t *testing.T) {
	staged := map[string]bool{"v0.9.1": true, "v0.9.2": true, "v0.8.0": true}
	releases := func(_ context.Context, version, platform string) (string, error) {
		if !staged[version] || platform != "linux/amd64" {
			return "", fmt.Errorf("orch %s for %s: not staged (orch upgrade stage)", version, platform)
		}
		return strings.Repeat("a", 64), nil
	}
	// The upgraded server's API server is not ready until the test says.
	var serverReady atomic.Bool
	ready := func(_ context.Context, node *corev1.Node) error {
		if node.Name != "s1" {
			return fmt.Errorf("%s is no server", node.Name)
		}
		if !serverReady.Load() {
			return errors.New("the datastore does not answer")
		}
		return nil
	}
	// A server with no node (--disable-agent) beside s1, until the test
	// takes it away.
	var agentless atomic.Bool
	agentless.Store(true)
	servers := func(context.Context) ([]upgradeapi.Server, error) {
		list := []upgradeapi.Server{{Address: "10.0.0.1", Version: "v0.9.0", Node: "s1"}}
		if agentless.Load() {
			list = append(list, upgradeapi.Server{Address: "10.0.0.2", Version: "v0.9.0"})
		}
		return list, nil
	}
	c := loopstest.StartWith(t, map[string]hollow.NodeOptions{"s1": {}, "a1": {}, "a2": {}}, hollow.Options{},
		loops.Options{Releases: releases, Servers: servers, ServerReady: ready})
	ctx := c.Ctx
	for _, name := range []string{"s1", "a1", "a2"} {
		meta := map[string]any{"annotations": map[string]any{upgradeapi.VersionAnnotation: "v0.9.0", upgradeapi.PlatformAnnotation: "linux/amd64"}}
		if name == "s1" {
			meta["labels"] = map[string]any{upgradeapi.ControlPlaneLabel: "true"}
		}
		patch, _ := json.Marshal(map[string]any{"metadata": meta})
		if _, err := c.Client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	client, err := kube.NewForConfig(c.Server.Admin)
	if err != nil {
		t.Fatal(err)
	}
	nodes := &fakeNodes{upgrading: map[string]bool{}, failing: map[string]bool{}}
	go nodes.run(ctx, c)

	// Two replicas under a budget that lets one go at a time.
	if _, err := c.Client.AppsV1().Deployments("default").Create(ctx, deploymentOf("front", 2, func(s *corev1.PodSpec) { s.TerminationGracePeriodSeconds = ptr.To(int64(0)) }), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.PolicyV1().PodDisruptionBudgets("default").Create(ctx, budget("front", "front", func(s *policyv1.PodDisruptionBudgetSpec) {
		s.MinAvailable = ptr.To(intstr.FromInt32(1))
	}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("two front pods ready", 30*time.Second, func(ctx context.Context) (bool, error) {
		pods, err := readyPods(ctx, c, "front")
		return len(pods) == 2, err
	})

	plan := func(name, version string, mut func(*upgradeapi.UpgradeSpec)) {
		t.Helper()
		u := &upgradeapi.Upgrade{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: upgradeapi.UpgradeSpec{Version: version,
			Drain: upgradeapi.DrainSpec{Timeout: &metav1.Duration{Duration: time.Minute}}}}
		if mut != nil {
			mut(&u.Spec)
		}
		if _, err := client.Upgrades().Create(ctx, u, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	wait := func(name, phase, message string) *upgradeapi.Upgrade {
		t.Helper()
		var got *upgradeapi.Upgrade
		c.Eventually(name+" "+phase, time.Minute, func(ctx context.Context) (bool, error) {
			u, err := client.Upgrades().Get(ctx, name, metav1.GetOptions{})
			got = u
			return err == nil && u.Status.Phase == phase && strings.Contains(u.Status.Message, message), nil
		})
		return got
	}
	// Refused, with the reason: no node selected, a version staged
	// nowhere, a downgrade, agents passing the servers (with a node, and
	// without).
	plan("none", "v0.9.1", func(s *upgradeapi.UpgradeSpec) {
		s.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"no": "such"}}
	})
	wait("none", upgradeapi.PhaseFailed, "selects no node")
	plan("unstaged", "v0.9.3", nil)
	wait("unstaged", upgradeapi.PhaseFailed, "not staged")
	plan("downgrade", "v0.8.0", nil)
	wait("downgrade", upgradeapi.PhaseFailed, "older than the running v0.9.0")
	plan("agents-first", "v0.9.1", func(s *upgradeapi.UpgradeSpec) {
		s.NodeSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: upgradeapi.ControlPlaneLabel, Operator: metav1.LabelSelectorOpDoesNotExist}}}
	})
	wait("agents-first", upgradeapi.PhaseFailed, "agents may not run a newer orch than the servers")
	plan("past-agentless", "v0.9.1", nil)
	wait("past-agentless", upgradeapi.PhaseFailed, "the server at 10.0.0.2 runs v0.9.0 and has no node to upgrade it through")
	agentless.Store(false) // replaced by hand
	if order, _ := nodes.order(); len(order) > 0 {
		t.Fatalf("refused plans told nodes to upgrade: %v", order)
	}

	// One plan at a time: a second, made while the first is paused, is
	// refused by the API server's admission (kubectl apply as well as
	// orch upgrade apply).
	plan("first", "v0.9.1", func(s *upgradeapi.UpgradeSpec) { s.Paused = true })
	wait("first", upgradeapi.PhasePaused, "paused")
	second := &upgradeapi.Upgrade{ObjectMeta: metav1.ObjectMeta{Name: "second"}, Spec: upgradeapi.UpgradeSpec{Version: "v0.9.1"}}
	if _, err := client.Upgrades().Create(ctx, second, metav1.CreateOptions{}); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "the upgrade first is under way") {
		t.Fatalf("a second plan while the first runs: %v, want it refused", err)
	}
	patch := []byte(`{"spec":{"paused":false}}`)
	if _, err := client.Upgrades().Patch(ctx, "first", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// The server runs v0.9.1 but its API server is not ready: no agent
	// starts.
	c.Eventually("the server waited for", 30*time.Second, func(ctx context.Context) (bool, error) {
		u, err := client.Upgrades().Get(ctx, "first", metav1.GetOptions{})
		return err == nil && len(u.Status.Nodes) == 3 && strings.Contains(u.Status.Nodes[2].Message, "its API server is not ready: the datastore does not answer"), err
	})
	time.Sleep(3 * time.Second) // a poll or two
	if order, _ := nodes.order(); len(order) != 1 {
		t.Fatalf("agents started before the upgraded server was ready: %v", order)
	}
	serverReady.Store(true)
	done := wait("first", upgradeapi.PhaseSucceeded, "every node runs v0.9.1")
	order, most := nodes.order()
	if len(order) != 3 || order[0] != "s1" || most != 1 {
		t.Fatalf("nodes told in the order %v, %d at most at once; want the server first, one at a time", order, most)
	}
	if done.Status.Progress != "3/3" {
		t.Errorf("progress %q", done.Status.Progress)
	}
	for _, n := range done.Status.Nodes {
		if n.Phase != upgradeapi.NodeUpgraded || n.From != "v0.9.0" || n.Finished == nil {
			t.Errorf("node %+v", n)
		}
	}
	list, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range list.Items {
		if n.Spec.Unschedulable || n.Annotations[upgradeapi.TargetAnnotation] != "" {
			t.Errorf("node %s left cordoned (%v) or told (%q)", n.Name, n.Spec.Unschedulable, n.Annotations[upgradeapi.TargetAnnotation])
		}
	}
	// The budget held: never fewer than one front pod ready (the
	// Deployment made replacements on the other nodes).
	c.Eventually("two front pods ready again", 30*time.Second, func(ctx context.Context) (bool, error) {
		pods, err := readyPods(ctx, c, "front")
		return len(pods) == 2, err
	})
	pdb, err := c.Client.PolicyV1().PodDisruptionBudgets("default").Get(ctx, "front", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pdb.Status.CurrentHealthy < 1 {
		t.Errorf("budget %+v", pdb.Status)
	}

	// A node that rolls back stops the plan, uncordoned, and the nodes
	// after it are not touched.
	nodes.mu.Lock()
	nodes.failing["a1"] = true
	nodes.mu.Unlock()
	plan("broken", "v0.9.2", nil)
	failed := wait("broken", upgradeapi.PhaseFailed, "node a1: rolled back to v0.9.1")
	for _, n := range failed.Status.Nodes {
		want := map[string]string{"s1": upgradeapi.NodeUpgraded, "a1": upgradeapi.NodeRolledBack, "a2": upgradeapi.NodeWaiting}[n.Name]
		if n.Phase != want {
			t.Errorf("node %s: %s, want %s", n.Name, n.Phase, want)
		}
	}
	a1, err := c.Client.CoreV1().Nodes().Get(ctx, "a1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a1.Spec.Unschedulable {
		t.Error("the rolled back node stays cordoned")
	}

	// A plan deleted while a budget holds its drain lets the node go:
	// uncordoned, not told to upgrade.
	nodes.mu.Lock()
	nodes.failing["a1"] = false
	nodes.mu.Unlock()
	// One replica on a1 under a budget that lets none go.
	pinned := deploymentOf("pinned", 1, func(s *corev1.PodSpec) { s.NodeSelector = map[string]string{"kubernetes.io/hostname": "a1"} })
	if _, err := c.Client.AppsV1().Deployments("default").Create(ctx, pinned, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.PolicyV1().PodDisruptionBudgets("default").Create(ctx, budget("pinned", "pinned", func(s *policyv1.PodDisruptionBudgetSpec) {
		s.MinAvailable = ptr.To(intstr.FromInt32(1))
	}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	budgetStatus(c, "pinned", 1, 1, 1, 0)
	plan("stuck", "v0.9.2", func(s *upgradeapi.UpgradeSpec) {
		s.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/hostname": "a1"}}
	})
	c.Eventually("the drain held by the budget", 30*time.Second, func(ctx context.Context) (bool, error) {
		u, err := client.Upgrades().Get(ctx, "stuck", metav1.GetOptions{})
		return err == nil && len(u.Status.Nodes) == 1 && strings.Contains(u.Status.Nodes[0].Message, "budgets hold"), err
	})
	drained := "a1"
	if err := client.Upgrades().Delete(ctx, "stuck", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("the deleted plan gone, its node let go", 30*time.Second, func(ctx context.Context) (bool, error) {
		if _, err := client.Upgrades().Get(ctx, "stuck", metav1.GetOptions{}); err == nil {
			return false, nil
		}
		n, err := c.Client.CoreV1().Nodes().Get(ctx, drained, metav1.GetOptions{})
		return err == nil && !n.Spec.Unschedulable && n.Annotations[upgradeapi.TargetAnnotation] == "", err
	})
}
