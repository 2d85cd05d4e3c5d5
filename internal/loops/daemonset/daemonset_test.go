package daemonset_test

import (
	"cmp"
	"context"
	"slices"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/loops/controller"
	"github.com/orch-dev/orch/internal/loops/hollow"
	"github.com/orch-dev/orch/internal/loops/loopstest"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

func daemonSet(name string, strategy appsv1.DaemonSetUpdateStrategyType) *appsv1.DaemonSet {
	labels := map[string]string{"app": name}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels},
			UpdateStrategy: appsv1.DaemonSetUpdateStrategy{Type: strategy},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox:1"}}}}},
	}
	return ds
}

// livePods are the DaemonSet's pods not being deleted, by node, with
// their image.
func livePods(ctx context.Context, c *loopstest.Cluster, app string) map[string]string {
	list, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	out := map[string]string{}
	if err != nil {
		return nil
	}
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			out[p.Spec.NodeName] = p.Spec.Containers[0].Image
		}
	}
	return out
}

func sameNodes(got map[string]string, want ...string) bool {
	if len(got) != len(want) {
		return false
	}
	for _, n := range want {
		if _, ok := got[n]; !ok {
			return false
		}
	}
	return true
}

// TestWhereDaemonsRun: a daemon pod on every node the DaemonSet's node
// selector and tolerations fit, as Kubernetes places them: a node that
// starts fitting gets one, a node that stops fitting loses it, and a
// tainted node gets one only when the DaemonSet tolerates the taint.
func TestWhereDaemonsRun(t *testing.T) {
	gpu := []corev1.Taint{{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}}
	edge := map[string]string{"tier": "edge"}
	c := loopstest.Start(t, map[string]hollow.NodeOptions{"a": {Labels: edge}, "b": {Labels: edge}, "core": {}, "gpu": {Labels: edge, Taints: gpu}},
		hollow.Options{LeaseEvery: -1})
	sets := c.Client.AppsV1().DaemonSets("default")
	ds := daemonSet("edge", appsv1.RollingUpdateDaemonSetStrategyType)
	ds.Spec.Template.Spec.NodeSelector = edge
	if _, err := sets.Create(c.Ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	everywhere := daemonSet("everywhere", appsv1.RollingUpdateDaemonSetStrategyType)
	everywhere.Spec.Template.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}}
	if _, err := sets.Create(c.Ctx, everywhere, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("edge daemons on a and b only", 30*time.Second, func(ctx context.Context) (bool, error) {
		return sameNodes(livePods(ctx, c, "edge"), "a", "b"), nil
	})
	c.Eventually("the tolerating daemon on every node, gpu too", 30*time.Second, func(ctx context.Context) (bool, error) {
		return sameNodes(livePods(ctx, c, "everywhere"), "a", "b", "core", "gpu"), nil
	})
	label := func(node, patch string) {
		if _, err := c.Client.CoreV1().Nodes().Patch(c.Ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	label("core", `{"metadata":{"labels":{"tier":"edge"}}}`)
	label("a", `{"metadata":{"labels":{"tier":null}}}`)
	c.Eventually("edge daemons follow the labels: b and core", 30*time.Second, func(ctx context.Context) (bool, error) {
		return sameNodes(livePods(ctx, c, "edge"), "b", "core"), nil
	})
	d, err := sets.Get(c.Ctx, "edge", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.Eventually("edge's status counts two nodes", 30*time.Second, func(ctx context.Context) (bool, error) {
		d, err = sets.Get(ctx, "edge", metav1.GetOptions{})
		return err == nil && d.Status.DesiredNumberScheduled == 2 && d.Status.NumberReady == 2 && d.Status.CurrentNumberScheduled == 2, nil
	})
}

// TestDaemonSetUpdates: a rolling update replaces the pods node by node,
// never more than maxUnavailable of them down (every state recorded);
// OnDelete changes nothing until a pod is deleted, which comes back new.
func TestDaemonSetUpdates(t *testing.T) {
	nodes := map[string]hollow.NodeOptions{"n1": {}, "n2": {}, "n3": {}, "n4": {}}
	c := loopstest.Start(t, nodes, hollow.Options{LeaseEvery: -1})
	sets := c.Client.AppsV1().DaemonSets("default")
	rolling := daemonSet("rolling", appsv1.RollingUpdateDaemonSetStrategyType)
	rolling.Spec.UpdateStrategy.RollingUpdate = &appsv1.RollingUpdateDaemonSet{MaxUnavailable: ptr.To(intstr.FromInt32(1))}
	onDelete := daemonSet("ondelete", appsv1.OnDeleteDaemonSetStrategyType)
	for _, ds := range []*appsv1.DaemonSet{rolling, onDelete} {
		if _, err := sets.Create(c.Ctx, ds, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, app := range []string{"rolling", "ondelete"} {
		c.Eventually(app+" on all four nodes", 30*time.Second, func(ctx context.Context) (bool, error) {
			return sameNodes(livePods(ctx, c, app), "n1", "n2", "n3", "n4"), nil
		})
	}
	record := c.RecordPods("default", "app=rolling")
	setImage := func(name string) {
		patch := []byte(`{"spec":{"template":{"spec":{"containers":[{"name":"c","image":"busybox:2"}]}}}}`)
		if _, err := sets.Patch(c.Ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setImage("rolling")
	setImage("ondelete")
	c.Eventually("rolling: every node on the new image", time.Minute, func(ctx context.Context) (bool, error) {
		got := livePods(ctx, c, "rolling")
		for _, img := range got {
			if img != "busybox:2" {
				return false, nil
			}
		}
		return len(got) == 4, nil
	})
	fewest := 4
	for _, state := range record.Stop(t) {
		ready := 0
		for _, p := range state {
			for _, cond := range p.Status.Conditions {
				if p.DeletionTimestamp == nil && cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		fewest = min(fewest, ready)
	}
	if fewest < 3 {
		t.Errorf("the rolling update took %d of 4 daemon pods down at once (maxUnavailable 1)", 4-fewest)
	}
	// OnDelete: the old pods stay on the old image...
	for node, img := range livePods(c.Ctx, c, "ondelete") {
		if img != "busybox:1" {
			t.Fatalf("OnDelete replaced the pod on %s (%s) without its deletion", node, img)
		}
	}
	// ... until one is deleted: its replacement runs the new one.
	list, err := c.Client.CoreV1().Pods("default").List(c.Ctx, metav1.ListOptions{LabelSelector: "app=ondelete", FieldSelector: "spec.nodeName=n1"})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("ondelete's pod on n1: %v %v", list, err)
	}
	if err := c.Client.CoreV1().Pods("default").Delete(c.Ctx, list.Items[0].Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("a new-image pod on n1, the old image elsewhere", 30*time.Second, func(ctx context.Context) (bool, error) {
		got := livePods(ctx, c, "ondelete")
		return got["n1"] == "busybox:2" && got["n2"] == "busybox:1" && got["n3"] == "busybox:1" && got["n4"] == "busybox:1", nil
	})
}

// revisions are the "undo" DaemonSet's ControllerRevisions, oldest first.
func revisions(ctx context.Context, c *loopstest.Cluster) []appsv1.ControllerRevision {
	list, err := c.Client.AppsV1().ControllerRevisions("default").List(ctx, metav1.ListOptions{LabelSelector: "app=undo"})
	if err != nil {
		return nil
	}
	slices.SortFunc(list.Items, func(a, b appsv1.ControllerRevision) int { return cmp.Compare(a.Revision, b.Revision) })
	return list.Items
}

// podHashes are the revision hashes the "undo" DaemonSet's live pods
// carry, by pod name.
func podHashes(ctx context.Context, c *loopstest.Cluster) map[string]string {
	list, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=undo"})
	out := map[string]string{}
	if err != nil {
		return out
	}
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out[p.Name] = p.Labels[appsv1.DefaultDaemonSetUniqueLabelKey]
		}
	}
	return out
}

// TestDaemonSetHistory: each template a DaemonSet has had is a
// ControllerRevision, as Kubernetes keeps them: its data is the patch
// kubectl compares byte for byte and applies on undo, its hash label is
// the one its pods carry; going back to a template takes that revision
// back, renumbered, and the pods of it are not replaced; a revision a
// client adds with the same template is merged into the newest; the
// history limit deletes old revisions no pod carries.
func TestDaemonSetHistory(t *testing.T) {
	c := loopstest.Start(t, map[string]hollow.NodeOptions{"n1": {}, "n2": {}}, hollow.Options{LeaseEvery: -1})
	sets, revs := c.Client.AppsV1().DaemonSets("default"), c.Client.AppsV1().ControllerRevisions("default")
	ds := daemonSet("undo", appsv1.OnDeleteDaemonSetStrategyType)
	ds.Annotations = map[string]string{"kubernetes.io/change-cause": "first"}
	if _, err := sets.Create(c.Ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var first appsv1.ControllerRevision
	c.Eventually("revision 1, its hash on both pods", 30*time.Second, func(ctx context.Context) (bool, error) {
		rs, pods := revisions(ctx, c), podHashes(ctx, c)
		if len(rs) != 1 || len(pods) != 2 {
			return false, nil
		}
		first = rs[0]
		for _, h := range pods {
			if h != first.Labels[appsv1.DefaultDaemonSetUniqueLabelKey] {
				return false, nil
			}
		}
		return true, nil
	})
	stored, err := sets.Get(c.Ctx, "undo", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := controller.TemplatePatch(&stored.Spec.Template); first.Revision != 1 || string(first.Data.Raw) != string(want) ||
		first.Annotations["kubernetes.io/change-cause"] != "first" || !metav1.IsControlledBy(&first, stored) || first.Name != "undo-"+first.Labels[appsv1.DefaultDaemonSetUniqueLabelKey] {
		t.Fatalf("revision 1: %+v\nwant data %s", first, want)
	}

	patch := `{"metadata":{"annotations":{"kubernetes.io/change-cause":"second"}},"spec":{"template":{"spec":{"containers":[{"name":"c","image":"busybox:2"}]}}}}`
	if _, err := sets.Patch(c.Ctx, "undo", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("revision 2", 30*time.Second, func(ctx context.Context) (bool, error) {
		rs := revisions(ctx, c)
		return len(rs) == 2 && rs[1].Revision == 2 && rs[1].Annotations["kubernetes.io/change-cause"] == "second", nil
	})
	// OnDelete: n1's pod replaced by hand runs revision 2, n2's stays.
	onN1, err := c.Client.CoreV1().Pods("default").List(c.Ctx, metav1.ListOptions{LabelSelector: "app=undo", FieldSelector: "spec.nodeName=n1"})
	if err != nil || len(onN1.Items) != 1 {
		t.Fatalf("the pod on n1: %v %v", onN1, err)
	}
	if err := c.Client.CoreV1().Pods("default").Delete(c.Ctx, onN1.Items[0].Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("a revision-2 pod on n1", 30*time.Second, func(ctx context.Context) (bool, error) {
		return livePods(ctx, c, "undo")["n1"] == "busybox:2", nil
	})
	before := podHashes(c.Ctx, c)

	// Undo as kubectl does it: revision 1's data as a strategic merge patch.
	if _, err := sets.Patch(c.Ctx, "undo", types.StrategicMergePatchType, first.Data.Raw, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("revision 1 back as revision 3; n2's pod, of it, counted updated and kept", 30*time.Second, func(ctx context.Context) (bool, error) {
		rs := revisions(ctx, c)
		d, err := sets.Get(ctx, "undo", metav1.GetOptions{})
		return err == nil && len(rs) == 2 && rs[1].Name == first.Name && rs[1].Revision == 3 && d.Status.UpdatedNumberScheduled == 1 &&
			d.Status.ObservedGeneration == d.Generation, nil
	})
	for name, h := range podHashes(c.Ctx, c) {
		if before[name] != h {
			t.Errorf("pod %s replaced or relabeled by the undo (%s, was %q)", name, h, before[name])
		}
	}

	// A client's revision with the same template and a higher number
	// (Kubernetes' conformance suite makes one) is the one kept.
	dup := first.DeepCopy()
	dup.ObjectMeta = metav1.ObjectMeta{Name: "undo-dup", Labels: map[string]string{"app": "undo", appsv1.DefaultDaemonSetUniqueLabelKey: "dup"}, OwnerReferences: first.OwnerReferences}
	dup.Revision = 10
	if _, err := revs.Create(c.Ctx, dup, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// No event of a controlled revision starts a sync (nor in Kubernetes):
	// a change of the set does.
	if _, err := sets.Patch(c.Ctx, "undo", types.MergePatchType, []byte(`{"metadata":{"labels":{"touched":"yes"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("the duplicate kept, the pods of revision 3 relabeled to it", 30*time.Second, func(ctx context.Context) (bool, error) {
		rs := revisions(ctx, c)
		if len(rs) != 2 || rs[1].Name != "undo-dup" {
			return false, nil
		}
		dupPods := 0
		for _, h := range podHashes(ctx, c) {
			if h == "dup" {
				dupPods++
			}
		}
		return dupPods == 1, nil
	})

	// History limit 0: revision 2 stays while n1's pod carries it...
	if _, err := sets.Patch(c.Ctx, "undo", types.MergePatchType, []byte(`{"spec":{"revisionHistoryLimit":0}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if rs := revisions(c.Ctx, c); len(rs) != 2 {
		t.Fatalf("a revision a pod runs was deleted: %v", rs)
	}
	// ... and goes once that pod is replaced.
	onN1, err = c.Client.CoreV1().Pods("default").List(c.Ctx, metav1.ListOptions{LabelSelector: "app=undo", FieldSelector: "spec.nodeName=n1"})
	if err != nil || len(onN1.Items) != 1 {
		t.Fatalf("the pod on n1: %v %v", onN1, err)
	}
	if err := c.Client.CoreV1().Pods("default").Delete(c.Ctx, onN1.Items[0].Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("only the current revision left", 30*time.Second, func(ctx context.Context) (bool, error) {
		rs := revisions(ctx, c)
		return len(rs) == 1 && rs[0].Name == "undo-dup" && livePods(ctx, c, "undo")["n1"] == "busybox:1", nil
	})
}

// TestFailedDaemonPodReplaced: a daemon pod that failed is deleted and a
// new one made on its node, as Kubernetes' controller does (and its
// conformance suite checks, failing one through the status).
func TestFailedDaemonPodReplaced(t *testing.T) {
	c := loopstest.Start(t, map[string]hollow.NodeOptions{"n1": {}}, hollow.Options{LeaseEvery: -1})
	if _, err := c.Client.AppsV1().DaemonSets("default").Create(c.Ctx, daemonSet("revive", appsv1.RollingUpdateDaemonSetStrategyType), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	c.Eventually("a daemon pod running", 30*time.Second, func(ctx context.Context) (bool, error) {
		list, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=revive"})
		if err != nil || len(list.Items) != 1 || list.Items[0].Status.Phase != corev1.PodRunning {
			return false, err
		}
		pod = list.Items[0]
		return true, nil
	})
	pod.Status.Phase = corev1.PodFailed
	if _, err := c.Client.CoreV1().Pods("default").UpdateStatus(c.Ctx, &pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("the failed pod gone, another running", 30*time.Second, func(ctx context.Context) (bool, error) {
		list, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=revive"})
		return err == nil && len(list.Items) == 1 && list.Items[0].Name != pod.Name && list.Items[0].Status.Phase == corev1.PodRunning, err
	})
	events, err := c.Client.CoreV1().Events("default").List(c.Ctx, metav1.ListOptions{FieldSelector: "reason=FailedDaemonPod"})
	if err != nil || len(events.Items) == 0 {
		t.Errorf("no FailedDaemonPod event: %v %v", events, err)
	}
}
