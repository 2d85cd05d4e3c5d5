//go:build e2e

package e2e_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orch-dev/orch/internal/agent/agenttest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// kvManifest: a StatefulSet of three whose pods write their own name
// into their volume the first time, under a headless Service, and a
// client pod that resolves names.
const kvManifest = `apiVersion: v1
kind: Service
metadata: {name: kv}
spec: {clusterIP: None, selector: {app: kv}, ports: [{port: 7000}]}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: kv}
spec:
  serviceName: kv
  replicas: 3
  selector: {matchLabels: {app: kv}}
  template:
    metadata: {labels: {app: kv}}
    spec:
      terminationGracePeriodSeconds: 0
      containers:
      - name: kv
        image: busybox:test
        command: [sh, -c, '[ -f /data/who ] || hostname > /data/who; exec sleep 3600']
        volumeMounts: [{name: data, mountPath: /data}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec:
      accessModes: [ReadWriteOnce]
      resources: {requests: {storage: 16Mi}}
---
apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  terminationGracePeriodSeconds: 0
  containers: [{name: main, image: probe:test, command: [sleep, "3600"]}]
`

// TestStatefulSetKeepsItsState: the user's view of a StatefulSet on real
// nodes with the built binary and stock kubectl: three pods, each with a
// volume of the default class (local-path) made on the node its pod went
// to and a name in the cluster DNS (kv-1.kv); a deleted pod comes back
// with the same name, the same data and the same DNS name (at its new
// address); scaling down and up keeps the claims and their data; a claim
// deleted once its pod is gone takes its data off the node.
func TestStatefulSetKeepsItsState(t *testing.T) {
	probe := goBinary(t, "./testdata/dnsprobe")
	c := newCluster(t)
	c.images = map[string]map[string][]byte{"docker.io/library/probe:test": {"/bin/dnsprobe": probe}}
	nodes := map[string]*node{}
	for name, ip := range map[string]string{"node-a": "198.18.0.41", "node-b": "198.18.0.42"} {
		nodes[name] = c.addNode(name, ip)
	}
	ctx := context.Background()
	c.mustKubectl(kvManifest, "apply", "-f", "-")
	c.mustKubectl("", "rollout", "status", "statefulset/kv", "--timeout=180s")
	c.mustKubectl("", "wait", "--for=condition=Ready", "pod/client", "--timeout=120s")
	who := func(pod string) string {
		return strings.TrimSpace(c.mustKubectl("", "exec", pod, "--", "cat", "/data/who"))
	}
	resolve := func(name string) string {
		out, err := c.kubectl("", "exec", "client", "--", "/bin/dnsprobe", "host", name)
		if err != nil {
			t.Errorf("dnsprobe host %s: %v: %s", name, err, out)
		}
		return strings.TrimSpace(out)
	}
	pod := func(name string) *corev1.Pod {
		p, err := c.client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, name := range []string{"kv-0", "kv-1", "kv-2"} {
		if got := who(name); got != name {
			t.Errorf("%s's volume holds %q", name, got)
		}
		if got, want := resolve(name+".kv"), pod(name).Status.PodIP; got != want {
			t.Errorf("%s.kv resolves to %q, want %s", name, got, want)
		}
		claim, err := c.client.CoreV1().PersistentVolumeClaims("default").Get(ctx, "data-"+name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pv, err := c.client.CoreV1().PersistentVolumes().Get(ctx, claim.Spec.VolumeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if terms := pv.Spec.NodeAffinity.Required.NodeSelectorTerms; terms[0].MatchExpressions[0].Values[0] != pod(name).Spec.NodeName {
			t.Errorf("%s runs on %s, its volume is on %v", name, pod(name).Spec.NodeName, terms)
		}
	}

	// kv-1 deleted: it comes back as itself.
	before := pod("kv-1")
	c.mustKubectl("", "delete", "pod", "kv-1")
	agenttest.Eventually(t, "kv-1 back", func() bool {
		p, err := c.client.CoreV1().Pods("default").Get(ctx, "kv-1", metav1.GetOptions{})
		return err == nil && p.UID != before.UID && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != ""
	})
	c.mustKubectl("", "wait", "--for=condition=Ready", "pod/kv-1", "--timeout=120s")
	if got := who("kv-1"); got != "kv-1" {
		t.Errorf("kv-1 came back with %q in its volume", got)
	}
	agenttest.Eventually(t, "kv-1.kv at kv-1's new address", func() bool {
		out, _ := c.kubectl("", "exec", "client", "--", "/bin/dnsprobe", "host", "kv-1.kv")
		return strings.TrimSpace(out) == pod("kv-1").Status.PodIP
	})

	// Down to one and up again: the claims and their data stay.
	c.mustKubectl("", "scale", "statefulset/kv", "--replicas=1")
	agenttest.Eventually(t, "kv-2 and kv-1 gone", func() bool {
		list, err := c.client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=kv"})
		return err == nil && len(list.Items) == 1
	})
	c.mustKubectl("", "scale", "statefulset/kv", "--replicas=3")
	c.mustKubectl("", "rollout", "status", "statefulset/kv", "--timeout=180s")
	if got := who("kv-2"); got != "kv-2" {
		t.Errorf("kv-2 after scaling down and up holds %q", got)
	}

	// A claim deleted after its pod: its data leaves the node.
	claim, err := c.client.CoreV1().PersistentVolumeClaims("default").Get(ctx, "data-kv-2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(c.dataDir, "storage", claim.Spec.VolumeName+"_default_data-kv-2")
	if _, err := os.Stat(filepath.Join(data, "who")); err != nil {
		t.Fatalf("kv-2's data is not where local-path keeps it: %v", err)
	}
	c.mustKubectl("", "scale", "statefulset/kv", "--replicas=2")
	c.mustKubectl("", "delete", "pvc", "data-kv-2", "--timeout=60s")
	agenttest.Eventually(t, "kv-2's volume and data gone", func() bool {
		_, err := c.client.CoreV1().PersistentVolumes().Get(ctx, claim.Spec.VolumeName, metav1.GetOptions{})
		_, statErr := os.Stat(data)
		return err != nil && os.IsNotExist(statErr)
	})
}
