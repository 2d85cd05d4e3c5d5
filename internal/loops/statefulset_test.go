package loops_test

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api/apitest"
	"github.com/orch-dev/orch/internal/loops/hollow"
	"github.com/orch-dev/orch/internal/loops/loopstest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const statefulSetManifest = `apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  clusterIP: None
  selector: {app: web}
  ports: [{port: 80}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: web
spec:
  serviceName: web
  replicas: 3
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: busybox:1.36
  volumeClaimTemplates:
  - metadata:
      name: data
    spec:
      accessModes: [ReadWriteOnce]
      resources:
        requests:
          storage: 1Gi
`

// ordinal is the number at the end of a StatefulSet pod's name.
func ordinal(name string) int {
	var n int
	_, _ = fmt.Sscanf(name[strings.LastIndex(name, "-")+1:], "%d", &n)
	return n
}

// TestKubectlStatefulSet drives a StatefulSet as a user does, on hollow
// nodes: pods web-0..2 made one at a time in order, each once the one
// before is Ready (every state a watch saw checked), with their hostnames,
// the governing Service as subdomain and one bound claim each; `kubectl
// scale` down removes the highest first and keeps the claims, and up
// reuses them; `kubectl set image` rolls highest first, never more than
// one pod down; `kubectl rollout history` lists the revisions and `undo`
// goes back; a partition holds the lower ordinals on the old template.
func TestKubectlStatefulSet(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kubectl")
	}
	c := loopstest.Start(t, map[string]hollow.NodeOptions{"n1": {}, "n2": {}}, hollow.Options{LeaseEvery: -1})
	k := apitest.NewKubectl(t, c.Server.Kubeconfig)
	manifest := t.TempDir() + "/sts.yaml"
	if err := writeFile(manifest, statefulSetManifest); err != nil {
		t.Fatal(err)
	}
	rec := c.RecordPods("default", "app=web")
	k.Run("apply", "-f", manifest)
	k.Run("rollout", "status", "statefulset/web", "--timeout=60s")
	states := rec.Stop(t)
	seen := map[string]bool{}
	for _, state := range states {
		for name := range state {
			if seen[name] || ordinal(name) == 0 {
				seen[name] = true
				continue
			}
			seen[name] = true
			before := state[fmt.Sprintf("web-%d", ordinal(name)-1)]
			if before == nil || before.Status.Phase != corev1.PodRunning || !podReady(before) {
				t.Errorf("%s made while web-%d was %v", name, ordinal(name)-1, before)
			}
		}
	}
	pods, err := c.Client.CoreV1().Pods("default").List(c.Ctx, metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil || len(pods.Items) != 3 {
		t.Fatalf("pods: %v %v", pods, err)
	}
	for _, p := range pods.Items {
		var claim *corev1.PersistentVolumeClaimVolumeSource
		for _, v := range p.Spec.Volumes {
			if v.Name == "data" {
				claim = v.PersistentVolumeClaim
			}
		}
		if p.Spec.Hostname != p.Name || p.Spec.Subdomain != "web" || claim == nil || claim.ClaimName != "data-"+p.Name ||
			p.Labels["statefulset.kubernetes.io/pod-name"] != p.Name {
			t.Errorf("pod %s: hostname %q subdomain %q claim %+v labels %v", p.Name, p.Spec.Hostname, p.Spec.Subdomain, claim, p.Labels)
		}
	}
	volumes := map[string]string{}
	c.Eventually("three claims bound", 30*time.Second, func(ctx context.Context) (bool, error) {
		list, err := c.Client.CoreV1().PersistentVolumeClaims("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, pvc := range list.Items {
			if pvc.Status.Phase == corev1.ClaimBound {
				volumes[pvc.Name] = pvc.Spec.VolumeName
			}
		}
		return len(volumes) == 3, nil
	})
	if out := k.Run("get", "statefulset", "web"); !regexp.MustCompile(`(?m)^web\s+3/3\s`).MatchString(out) {
		t.Errorf("kubectl get statefulset:\n%s", out)
	}

	// Scale down: highest first, claims kept; up again: the same claims.
	rec = c.RecordPods("default", "app=web")
	k.Run("scale", "statefulset/web", "--replicas=1")
	c.Eventually("scaled to one", 30*time.Second, func(ctx context.Context) (bool, error) {
		list, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		return err == nil && len(list.Items) == 1 && list.Items[0].Name == "web-0", nil
	})
	var order []string
	for _, state := range rec.Stop(t) {
		for name, p := range state {
			if p.DeletionTimestamp != nil && !slices.Contains(order, name) {
				order = append(order, name)
			}
		}
	}
	if !slices.Equal(order, []string{"web-2", "web-1"}) {
		t.Errorf("scale-down deleted %v, want web-2 then web-1", order)
	}
	k.Run("scale", "statefulset/web", "--replicas=3")
	k.Run("rollout", "status", "statefulset/web", "--timeout=60s")
	for claim, volume := range volumes {
		pvc, err := c.Client.CoreV1().PersistentVolumeClaims("default").Get(c.Ctx, claim, metav1.GetOptions{})
		if err != nil || pvc.Spec.VolumeName != volume {
			t.Errorf("claim %s after scaling down and up: %v %v (was on %s)", claim, pvc, err, volume)
		}
	}

	// Rolling update: highest ordinal first, one pod down at most.
	rec = c.RecordPods("default", "app=web")
	k.Run("set", "image", "statefulset/web", "web=busybox:1.37")
	k.Run("rollout", "status", "statefulset/web", "--timeout=60s")
	order = nil
	for _, state := range rec.Stop(t) {
		down := 0
		for i := range 3 {
			p := state[fmt.Sprintf("web-%d", i)]
			if p == nil || p.DeletionTimestamp != nil || !podReady(p) {
				down++
			}
		}
		if down > 1 {
			t.Errorf("%d pods down at once during the rolling update", down)
		}
		for name, p := range state {
			if p.DeletionTimestamp != nil && !slices.Contains(order, name) {
				order = append(order, name)
			}
		}
	}
	if !slices.Equal(order, []string{"web-2", "web-1", "web-0"}) {
		t.Errorf("rolling update replaced %v, want web-2, web-1, web-0", order)
	}
	if out := k.Run("rollout", "history", "statefulset/web"); !regexp.MustCompile(`(?s)REVISION.*\n1\s.*\n2\s`).MatchString(out) {
		t.Errorf("kubectl rollout history:\n%s", out)
	}
	k.Run("rollout", "undo", "statefulset/web")
	k.Run("rollout", "status", "statefulset/web", "--timeout=60s")
	images := func() []string {
		list, _ := c.Client.CoreV1().Pods("default").List(c.Ctx, metav1.ListOptions{LabelSelector: "app=web"})
		var out []string
		for _, p := range list.Items {
			out = append(out, p.Name+"="+p.Spec.Containers[0].Image)
		}
		slices.Sort(out)
		return out
	}
	if got := images(); !slices.Equal(got, []string{"web-0=busybox:1.36", "web-1=busybox:1.36", "web-2=busybox:1.36"}) {
		t.Errorf("after undo: %v", got)
	}

	// A partition of 2: only web-2 takes the new template.
	k.Run("patch", "statefulset", "web", "-p", `{"spec":{"updateStrategy":{"rollingUpdate":{"partition":2}}}}`)
	k.Run("set", "image", "statefulset/web", "web=busybox:1.38")
	k.Run("rollout", "status", "statefulset/web", "--timeout=60s")
	if got := images(); !slices.Equal(got, []string{"web-0=busybox:1.36", "web-1=busybox:1.36", "web-2=busybox:1.38"}) {
		t.Errorf("with partition 2: %v", got)
	}
}
