package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	appsv1apply "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1apply "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/utils/ptr"
)

const ssaDeployment = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: ssa
  labels: {app: ssa, tier: web}
spec:
  replicas: 2
  selector:
    matchLabels: {app: ssa}
  template:
    metadata:
      labels: {app: ssa}
    spec:
      containers:
      - name: web
        image: nginx:1.27
        ports:
        - containerPort: 80
`

// managers maps each managedFields entry's manager (and subresource) to
// its operation and the fields it owns, as JSON.
func managers(t *testing.T, m metav1.Object) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, e := range m.GetManagedFields() {
		key := e.Manager
		if e.Subresource != "" {
			key += "/" + e.Subresource
		}
		fields := ""
		if e.FieldsV1 != nil {
			fields = e.FieldsV1.GetRawString()
		}
		out[key] = string(e.Operation) + " " + fields
	}
	return out
}

// TestServerSideApplyWithKubectl drives server-side apply the way users
// and tools do: kubectl apply --server-side, its conflicts and
// --force-conflicts, kubectl diff --server-side, the upgrade from
// client-side apply, and client-go's typed Apply.
func TestServerSideApplyWithKubectl(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kubectl")
	}
	ts := startServer(t, "")
	k := newKubectl(t, ts)
	ctx := context.Background()
	dir := t.TempDir()
	manifest := filepath.Join(dir, "ssa.yaml")
	write(t, manifest, ssaDeployment)
	deployments := ts.client.AppsV1().Deployments("default")

	if out := k.run("apply", "--server-side", "-f", manifest); !strings.Contains(out, "deployment.apps/ssa serverside-applied") {
		t.Fatalf("apply --server-side said %q", out)
	}
	d, err := deployments.Get(ctx, "ssa", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	owned := managers(t, d)
	// kubectl's entry holds what the manifest set, and only that: the
	// server's defaults (strategy, revisionHistoryLimit) are nobody's.
	if e := owned["kubectl"]; !strings.HasPrefix(e, "Apply ") || !strings.Contains(e, `"f:replicas":{}`) ||
		!strings.Contains(e, `"k:{\"name\":\"web\"}"`) || !strings.Contains(e, `"k:{\"containerPort\":80,\"protocol\":\"TCP\"}"`) ||
		strings.Contains(e, "f:strategy") || strings.Contains(e, "f:revisionHistoryLimit") {
		t.Errorf("kubectl's managed fields after the first apply: %q", e)
	}
	if *d.Spec.RevisionHistoryLimit != 10 || d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType {
		t.Errorf("an applied object is defaulted as a created one: %+v", d.Spec)
	}

	t.Run("another manager conflicts", func(t *testing.T) {
		k := k.For(t)
		replicas := func(name string, n int) string {
			path := filepath.Join(dir, name+".yaml")
			write(t, path, fmt.Sprintf("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: ssa\nspec:\n  replicas: %d\n", n))
			return path
		}
		out, err := k.try("apply", "--server-side", "--field-manager=autoscaler", "-f", replicas("autoscaler", 5))
		if err == nil || !strings.Contains(out, `Apply failed with 1 conflict: conflict with "kubectl": .spec.replicas`) {
			t.Fatalf("a conflicting apply: %v %s", err, out)
		}
		if d, _ := deployments.Get(ctx, "ssa", metav1.GetOptions{}); *d.Spec.Replicas != 2 {
			t.Errorf("a refused apply changed replicas to %d", *d.Spec.Replicas)
		}
		// The same value is shared ownership, not a conflict.
		k.run("apply", "--server-side", "--field-manager=observer", "-f", replicas("observer", 2))
		// Forced, the field changes hands from both, as Kubernetes moves it.
		k.run("apply", "--server-side", "--field-manager=autoscaler", "--force-conflicts", "-f", replicas("autoscaler", 5))
		d, _ := deployments.Get(ctx, "ssa", metav1.GetOptions{})
		owned := managers(t, d)
		if *d.Spec.Replicas != 5 || strings.Contains(owned["kubectl"], "f:replicas") || strings.Contains(owned["observer"], "f:replicas") ||
			!strings.Contains(owned["autoscaler"], "f:replicas") {
			t.Errorf("after a forced apply: replicas %d, managers %v", *d.Spec.Replicas, owned)
		}
	})

	t.Run("a field left out is removed", func(t *testing.T) {
		k := k.For(t)
		// kubectl applies again without the tier label and without
		// replicas (the autoscaler's now): the label goes, replicas stay.
		without := strings.Replace(strings.Replace(ssaDeployment, ", tier: web", "", 1), "  replicas: 2\n", "", 1)
		write(t, manifest, without)
		k.run("apply", "--server-side", "-f", manifest)
		d, _ := deployments.Get(ctx, "ssa", metav1.GetOptions{})
		if _, ok := d.Labels["tier"]; ok || *d.Spec.Replicas != 5 {
			t.Errorf("labels %v, replicas %d", d.Labels, *d.Spec.Replicas)
		}
	})

	t.Run("diff --server-side changes nothing", func(t *testing.T) {
		k := k.For(t)
		before, _ := deployments.Get(ctx, "ssa", metav1.GetOptions{})
		changed := filepath.Join(dir, "changed.yaml")
		write(t, changed, strings.Replace(strings.Replace(ssaDeployment, "  replicas: 2\n", "", 1), "nginx:1.27", "nginx:1.28", 1))
		out, err := k.try("diff", "--server-side", "-f", changed)
		if err == nil || !regexp.MustCompile(`(?m)^-\s+- image: nginx:1\.27$`).MatchString(out) || !regexp.MustCompile(`(?m)^\+\s+- image: nginx:1\.28$`).MatchString(out) {
			t.Errorf("diff --server-side: %v %s", err, out)
		}
		after, _ := deployments.Get(ctx, "ssa", metav1.GetOptions{})
		if after.ResourceVersion != before.ResourceVersion {
			t.Errorf("a diff wrote: resourceVersion %s -> %s", before.ResourceVersion, after.ResourceVersion)
		}
	})

	t.Run("updates are recorded", func(t *testing.T) {
		k := k.For(t)
		k.run("label", "deploy", "ssa", "owner=ops")
		d, _ := deployments.Get(ctx, "ssa", metav1.GetOptions{})
		if e := managers(t, d)["kubectl-label"]; !strings.HasPrefix(e, "Update ") || !strings.Contains(e, `"f:owner":{}`) {
			t.Errorf("kubectl label's entry: %q in %v", e, managers(t, d))
		}
		// A write that changes nothing writes nothing, managedFields included.
		k.run("label", "--overwrite", "deploy", "ssa", "owner=ops")
		if again, _ := deployments.Get(ctx, "ssa", metav1.GetOptions{}); again.ResourceVersion != d.ResourceVersion {
			t.Errorf("a no-op label wrote: %s -> %s", d.ResourceVersion, again.ResourceVersion)
		}
	})

	t.Run("client-side apply upgrades to server-side", func(t *testing.T) {
		k := k.For(t)
		cm := filepath.Join(dir, "cm.yaml")
		write(t, cm, "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: upgraded\ndata:\n  keep: \"1\"\n  drop: \"2\"\n")
		k.run("apply", "-f", cm)
		got, _ := ts.client.CoreV1().ConfigMaps("default").Get(ctx, "upgraded", metav1.GetOptions{})
		if e := managers(t, got)["kubectl-client-side-apply"]; !strings.HasPrefix(e, "Update ") {
			t.Fatalf("client-side apply's entry: %v", managers(t, got))
		}
		// As on Kubernetes, the first server-side apply takes over what
		// client-side apply managed, so a key left out is removed.
		write(t, cm, "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: upgraded\ndata:\n  keep: \"1\"\n")
		k.run("apply", "--server-side", "-f", cm)
		got, _ = ts.client.CoreV1().ConfigMaps("default").Get(ctx, "upgraded", metav1.GetOptions{})
		if _, ok := got.Data["drop"]; ok || got.Data["keep"] != "1" {
			t.Errorf("after the upgrade: %v, managers %v", got.Data, managers(t, got))
		}
	})

	t.Run("dry run creates nothing", func(t *testing.T) {
		k := k.For(t)
		cm := filepath.Join(dir, "dry.yaml")
		write(t, cm, "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: dry\ndata:\n  a: b\n")
		if out := k.run("apply", "--server-side", "--dry-run=server", "-f", cm); !strings.Contains(out, "serverside-applied (server dry run)") {
			t.Errorf("dry run said %q", out)
		}
		if _, err := ts.client.CoreV1().ConfigMaps("default").Get(ctx, "dry", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("a dry-run apply created the object: %v", err)
		}
	})

	t.Run("client-go Apply and ApplyStatus", func(t *testing.T) {
		cfg := corev1apply.ConfigMap("typed", "default").WithData(map[string]string{"a": "1"})
		created, err := ts.client.CoreV1().ConfigMaps("default").Apply(ctx, cfg, metav1.ApplyOptions{FieldManager: "controller"})
		if err != nil || created.Data["a"] != "1" || managers(t, created)["controller"] == "" {
			t.Fatalf("Apply: %v %+v", err, created)
		}
		// A controller applying its status owns it there, apart from spec.
		st := appsv1apply.Deployment("ssa", "default").WithStatus(appsv1apply.DeploymentStatus().WithObservedGeneration(1).WithReplicas(3))
		d, err := deployments.ApplyStatus(ctx, st, metav1.ApplyOptions{FieldManager: "controller", Force: true})
		if err != nil {
			t.Fatalf("ApplyStatus: %v", err)
		}
		if d.Status.Replicas != 3 || !strings.Contains(managers(t, d)["controller/status"], `"f:replicas":{}`) {
			t.Errorf("status %+v, managers %v", d.Status, managers(t, d))
		}
		// Applied to the main resource, status is not written.
		spec := appsv1apply.Deployment("ssa", "default").WithStatus(appsv1apply.DeploymentStatus().WithReplicas(9))
		if d, err := deployments.Apply(ctx, spec, metav1.ApplyOptions{FieldManager: "sneaky"}); err != nil || d.Status.Replicas != 3 {
			t.Errorf("status through the main resource: %v %+v", err, d.Status)
		}
	})

	t.Run("conflicts are Kubernetes' Status", func(t *testing.T) {
		patch, _ := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "typed"}, "data": map[string]string{"a": "2"}})
		_, err := ts.client.CoreV1().ConfigMaps("default").Patch(ctx, "typed", types.ApplyPatchType, patch, metav1.PatchOptions{FieldManager: "rival"})
		var st apierrors.APIStatus
		if !apierrors.IsConflict(err) || !errors.As(err, &st) || st.Status().Details == nil || len(st.Status().Details.Causes) != 1 ||
			st.Status().Details.Causes[0].Field != ".data.a" || st.Status().Details.Causes[0].Type != metav1.CauseTypeFieldManagerConflict {
			t.Fatalf("conflict: %v %#v", err, st)
		}
		got, err := ts.client.CoreV1().ConfigMaps("default").Patch(ctx, "typed", types.ApplyPatchType, patch, metav1.PatchOptions{FieldManager: "rival", Force: ptr.To(true)})
		if err != nil || got.Data["a"] != "2" {
			t.Errorf("forced: %v %+v", err, got)
		}
	})

	t.Run("a pod's applied containers merge by name", func(t *testing.T) {
		pod := corev1apply.Pod("merged", "default").WithSpec(corev1apply.PodSpec().WithContainers(
			corev1apply.Container().WithName("a").WithImage("busybox")))
		if _, err := ts.client.CoreV1().Pods("default").Apply(ctx, pod, metav1.ApplyOptions{FieldManager: "one"}); err != nil {
			t.Fatal(err)
		}
		// Another manager adds a label; its apply holds no containers and
		// removes none, since containers are a map keyed by name.
		label := corev1apply.Pod("merged", "default").WithLabels(map[string]string{"by": "two"})
		p, err := ts.client.CoreV1().Pods("default").Apply(ctx, label, metav1.ApplyOptions{FieldManager: "two"})
		if err != nil || len(p.Spec.Containers) != 1 || p.Labels["by"] != "two" {
			t.Errorf("%v %+v", err, p)
		}
	})
}
