package loops_test

import (
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api/apitest"
	"github.com/orch-dev/orch/internal/loops/hollow"
	"github.com/orch-dev/orch/internal/loops/loopstest"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// perNode counts the running pods with the label app=name on each node.
func podReady(p *corev1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

func perNode(ctx context.Context, c *loopstest.Cluster, app string) (map[string]int, int, error) {
	list, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		return nil, 0, err
	}
	out, ready := map[string]int{}, 0
	for _, p := range list.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		out[p.Spec.NodeName]++
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				ready++
			}
		}
	}
	return out, ready, nil
}

// TestKubectlDeploymentLifecycle is the flow of the seed articles with
// stock kubectl: create a deployment, see it spread, scale it, roll a new
// image within maxSurge and maxUnavailable, wait for the rollout, undo it.
func TestKubectlDeploymentLifecycle(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kubectl")
	}
	c := loopstest.Start(t, map[string]hollow.NodeOptions{"n1": {}, "n2": {}, "n3": {}}, hollow.Options{LeaseEvery: -1})
	k := apitest.NewKubectl(t, c.Server.Kubeconfig)

	k.Run("create", "deployment", "web", "--image=busybox:1.36", "--replicas=6")
	if out := k.Run("rollout", "status", "deployment/web", "--timeout=60s"); !strings.Contains(out, `deployment "web" successfully rolled out`) {
		t.Fatalf("rollout status: %s", out)
	}
	spread, ready, err := perNode(c.Ctx, c, "web")
	if err != nil || ready != 6 || spread["n1"] != 2 || spread["n2"] != 2 || spread["n3"] != 2 {
		t.Fatalf("6 replicas on 3 nodes: %v (%d ready), %v", spread, ready, err)
	}
	if out := k.Run("get", "deployment", "web"); !strings.Contains(out, "6/6") {
		t.Errorf("kubectl get deployment: %s", out)
	}

	k.Run("scale", "deployment", "web", "--replicas=9")
	k.Run("rollout", "status", "deployment/web", "--timeout=60s")
	if spread, ready, _ := perNode(c.Ctx, c, "web"); ready != 9 || spread["n1"] != 3 || spread["n2"] != 3 || spread["n3"] != 3 {
		t.Fatalf("scaled to 9: %v (%d ready)", spread, ready)
	}

	// Roll a new image while watching the bounds: 9 replicas, 25% surge
	// (3) and unavailable (2): at most 12 pods, at least 7 ready.
	// Every state the watches see is checked, not a sample of them.
	setRecord, podRecord := c.RecordReplicaSets("default", "app=web"), c.RecordPods("default", "app=web")
	k.Run("set", "image", "deployment/web", "busybox=busybox:1.37")
	out := k.Run("rollout", "status", "deployment/web", "--timeout=60s")
	if !strings.Contains(out, "successfully rolled out") {
		t.Fatalf("rollout status after set image: %s", out)
	}
	most, fewestReady := int32(0), 9
	for _, state := range setRecord.Stop(t) {
		var total int32
		for _, rs := range state {
			total += ptr.Deref(rs.Spec.Replicas, 0)
		}
		most = max(most, total)
	}
	podStates := podRecord.Stop(t)
	for _, state := range podStates {
		ready := 0
		for _, p := range state {
			if p.DeletionTimestamp == nil && podReady(p) {
				ready++
			}
		}
		fewestReady = min(fewestReady, ready)
	}
	t.Logf("during the rollout (%d pod states): up to %d pods wanted, down to %d ready", len(podStates), most, fewestReady)
	if most > 12 || fewestReady < 7 {
		t.Errorf("rolling update went out of bounds: up to %d pods wanted (max 12), down to %d ready (min 7)", most, fewestReady)
	}
	list, _ := c.Client.CoreV1().Pods("default").List(c.Ctx, metav1.ListOptions{LabelSelector: "app=web"})
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && p.Spec.Containers[0].Image != "busybox:1.37" {
			t.Errorf("pod %s still runs %s", p.Name, p.Spec.Containers[0].Image)
		}
	}
	if out := k.Run("rollout", "history", "deployment/web"); !strings.Contains(out, "1 ") || !strings.Contains(out, "2 ") {
		t.Errorf("rollout history: %s", out)
	}

	k.Run("rollout", "undo", "deployment/web")
	k.Run("rollout", "status", "deployment/web", "--timeout=60s")
	d, err := c.Client.AppsV1().Deployments("default").Get(c.Ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if d.Spec.Template.Spec.Containers[0].Image != "busybox:1.36" || d.Annotations["deployment.kubernetes.io/revision"] != "3" {
		t.Fatalf("after undo: image %s revision %s, %v", d.Spec.Template.Spec.Containers[0].Image, d.Annotations["deployment.kubernetes.io/revision"], err)
	}
	sets, err := c.Client.AppsV1().ReplicaSets("default").List(c.Ctx, metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil {
		t.Fatal(err)
	}
	if len(sets.Items) != 2 {
		t.Errorf("undo reuses the first ReplicaSet: %d ReplicaSets", len(sets.Items))
	}

	// kubectl delete takes the ReplicaSets and pods with the deployment.
	k.Run("delete", "deployment", "web")
	c.Eventually("the deployment's ReplicaSets and pods collected", 30*time.Second, func(ctx context.Context) (bool, error) {
		sets, err := c.Client.AppsV1().ReplicaSets("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return false, err
		}
		pods, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		return err == nil && len(sets.Items) == 0 && len(pods.Items) == 0, err
	})
}

// TestKubectlDescribeUnschedulablePod: a pod that fits nowhere says why in
// kubectl describe, in Kubernetes' words.
func TestKubectlDescribeUnschedulablePod(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kubectl")
	}
	c := loopstest.Start(t, map[string]hollow.NodeOptions{"n1": {}, "n2": {}, "n3": {}}, hollow.Options{LeaseEvery: -1})
	k := apitest.NewKubectl(t, c.Server.Kubeconfig)
	hog := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "hog"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("64")}}}}},
	}
	if _, err := c.Client.CoreV1().Pods("default").Create(c.Ctx, hog, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("FailedScheduling in kubectl describe", 20*time.Second, func(ctx context.Context) (bool, error) {
		out, err := k.Try("describe", "pod", "hog")
		return err == nil && strings.Contains(out, "FailedScheduling") && strings.Contains(out, "0/3 nodes are available: 3 Insufficient cpu."), nil
	})
	if out := k.Run("get", "pod", "hog"); !strings.Contains(out, "Pending") {
		t.Errorf("kubectl get pod: %s", out)
	}
}

// TestKubectlDeleteNamespaceEmptiesIt: deleting a namespace removes
// everything in it, then the namespace.
func TestKubectlDeleteNamespaceEmptiesIt(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kubectl")
	}
	c := loopstest.Start(t, map[string]hollow.NodeOptions{"n1": {}}, hollow.Options{LeaseEvery: -1})
	k := apitest.NewKubectl(t, c.Server.Kubeconfig)
	k.Run("create", "namespace", "team")
	k.Run("-n", "team", "create", "deployment", "api", "--image=busybox", "--replicas=3")
	k.Run("-n", "team", "create", "configmap", "settings", "--from-literal=a=b")
	k.Run("-n", "team", "rollout", "status", "deployment/api", "--timeout=60s")
	if out := k.Run("delete", "namespace", "team", "--timeout=60s"); !strings.Contains(out, `namespace "team" deleted`) {
		t.Fatalf("delete namespace: %s", out)
	}
	if out, err := k.Try("get", "namespace", "team"); err == nil || !strings.Contains(out, "NotFound") && !strings.Contains(out, "not found") {
		t.Fatalf("namespace still there: %v %s", err, out)
	}
	pods, err := c.Client.CoreV1().Pods("team").List(c.Ctx, metav1.ListOptions{})
	if err != nil || len(pods.Items) != 0 {
		t.Fatalf("pods left in the deleted namespace: %d %v", len(pods.Items), err)
	}
	// A namespace of the same name starts empty.
	k.Run("create", "namespace", "team")
	if out := k.Run("-n", "team", "get", "all"); strings.Contains(out, "deployment") {
		t.Errorf("a new namespace of the old name sees old objects: %s", out)
	}
}

const daemonSetManifest = `apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: agent
spec:
  selector:
    matchLabels: {app: agent}
  template:
    metadata:
      labels: {app: agent}
    spec:
      containers:
      - name: agent
        image: busybox:1.36
`

// TestKubectlDaemonSet: one pod per node that fits, on new nodes too, a
// rolling image update that kubectl rollout status follows, the rollout
// history and an undo to the first revision.
func TestKubectlDaemonSet(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kubectl")
	}
	gpu := []corev1.Taint{{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}}
	c := loopstest.Start(t, map[string]hollow.NodeOptions{"n1": {}, "n2": {}, "gpu": {Taints: gpu}}, hollow.Options{LeaseEvery: -1})
	k := apitest.NewKubectl(t, c.Server.Kubeconfig)
	manifest := t.TempDir() + "/ds.yaml"
	if err := writeFile(manifest, daemonSetManifest); err != nil {
		t.Fatal(err)
	}
	k.Run("apply", "-f", manifest)
	k.Run("rollout", "status", "daemonset/agent", "--timeout=60s")
	spread, ready, _ := perNode(c.Ctx, c, "agent")
	if ready != 2 || spread["n1"] != 1 || spread["n2"] != 1 || spread["gpu"] != 0 {
		t.Fatalf("daemon pods: %v (%d ready)", spread, ready)
	}
	c.AddNode("n3", hollow.NodeOptions{})
	c.Eventually("a daemon pod on the new node", 30*time.Second, func(ctx context.Context) (bool, error) {
		spread, ready, err := perNode(ctx, c, "agent")
		return err == nil && ready == 3 && spread["n3"] == 1, nil
	})
	k.Run("set", "image", "daemonset/agent", "agent=busybox:1.37")
	k.Run("rollout", "status", "daemonset/agent", "--timeout=60s")
	list, _ := c.Client.CoreV1().Pods("default").List(c.Ctx, metav1.ListOptions{LabelSelector: "app=agent"})
	running := 0
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			running++
			if p.Spec.Containers[0].Image != "busybox:1.37" {
				t.Errorf("pod %s on %s still runs %s", p.Name, p.Spec.NodeName, p.Spec.Containers[0].Image)
			}
		}
	}
	if running != 3 {
		t.Errorf("%d daemon pods after the update, want 3", running)
	}
	if out := k.Run("get", "daemonset", "agent"); !regexp.MustCompile(`(?m)^agent\s+3\s+3\s+3\s+3\s+3\s`).MatchString(out) {
		t.Errorf("kubectl get daemonset:\n%s", out)
	}
	// The history kubectl reads from ControllerRevisions, and undo.
	k.Run("annotate", "daemonset/agent", "kubernetes.io/change-cause=to 1.38")
	k.Run("set", "image", "daemonset/agent", "agent=busybox:1.38")
	k.Run("rollout", "status", "daemonset/agent", "--timeout=60s")
	if out := k.Run("rollout", "history", "daemonset/agent"); !regexp.MustCompile(`(?m)^1\s+<none>\n2\s+<none>\n3\s+to 1.38$`).MatchString(out) {
		t.Errorf("kubectl rollout history:\n%s", out)
	}
	if out := k.Run("rollout", "history", "daemonset/agent", "--revision=2"); !strings.Contains(out, "busybox:1.37") {
		t.Errorf("kubectl rollout history --revision=2:\n%s", out)
	}
	k.Run("rollout", "undo", "daemonset/agent", "--to-revision=1")
	k.Run("rollout", "status", "daemonset/agent", "--timeout=60s")
	if out := k.Run("get", "pods", "-l", "app=agent", "-o", "jsonpath={.items[*].spec.containers[0].image}"); strings.Count(out, "busybox:1.36") != 3 || strings.Contains(out, "1.38") {
		t.Errorf("after undo to revision 1, the pods run: %s", out)
	}
	if out := k.Run("rollout", "history", "daemonset/agent"); !regexp.MustCompile(`(?m)^2\s+<none>\n3\s+to 1.38\n4\s+<none>$`).MatchString(out) {
		t.Errorf("kubectl rollout history after undo (revision 1 is now 4):\n%s", out)
	}
}

func writeFile(path, content string) error { return os.WriteFile(path, []byte(content), 0o644) }
