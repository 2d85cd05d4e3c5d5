package checkpoint

import (
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// What is saved survives closing and reopening the file; deleting a pod
// forgets it; the node's network comes back with its resources.
func TestCheckpointSurvivesReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checkpoint.db")
	cp, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b"} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "busybox"}}}}
		if err := cp.SavePod(pod); err != nil {
			t.Fatal(err)
		}
	}
	if err := cp.DeletePod("uid-a"); err != nil {
		t.Fatal(err)
	}
	alloc := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("512Mi")}
	if err := cp.SaveNode(Node{PodCIDR: "10.42.3.0/24", Allocatable: alloc}); err != nil {
		t.Fatal(err)
	}
	if err := cp.Close(); err != nil {
		t.Fatal(err)
	}
	if cp, err = Open(path); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cp.Close() }()
	pods, err := cp.Pods()
	if err != nil || len(pods) != 1 || pods[0].Name != "b" || pods[0].Spec.Containers[0].Image != "busybox" {
		t.Fatalf("pods after reopening: %v %v", pods, err)
	}
	n, err := cp.Node()
	if err != nil || n.PodCIDR != "10.42.3.0/24" || !sameResources(n.Allocatable, alloc) {
		t.Fatalf("node after reopening: %+v %v", n, err)
	}
}

// TestConfigMaps: a ConfigMap the node's pods use is kept for starting
// them offline; read again unchanged it costs no write (the SD card), a
// new version replaces it, and one that is gone is forgotten.
func TestConfigMaps(t *testing.T) {
	c, err := Open(filepath.Join(t.TempDir(), "checkpoint.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "kube-root-ca.crt", UID: "u1", ResourceVersion: "7"},
		Data: map[string]string{"ca.crt": "-----BEGIN CERTIFICATE-----"}}
	if got, err := c.ConfigMap("default", "kube-root-ca.crt"); err != nil || got != nil {
		t.Fatalf("before any: %v %v", got, err)
	}
	if err := c.SaveConfigMap(cm); err != nil {
		t.Fatal(err)
	}
	pagesWritten := func() int64 { st := c.db.Stats(); return st.TxStats.GetWrite() }
	writes := pagesWritten()
	if err := c.SaveConfigMap(cm.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	if w := pagesWritten(); w != writes {
		t.Errorf("saving an unchanged ConfigMap wrote %d pages", w-writes)
	}
	changed := cm.DeepCopy()
	changed.ResourceVersion, changed.Data["ca.crt"] = "9", "-----BEGIN CERTIFICATE----- new"
	if err := c.SaveConfigMap(changed); err != nil {
		t.Fatal(err)
	}
	if got, err := c.ConfigMap("default", "kube-root-ca.crt"); err != nil || got.ResourceVersion != "9" || got.Data["ca.crt"] != changed.Data["ca.crt"] {
		t.Fatalf("after a change: %+v %v", got, err)
	}
	if err := c.DeleteConfigMap("default", "kube-root-ca.crt"); err != nil {
		t.Fatal(err)
	}
	if got, err := c.ConfigMap("default", "kube-root-ca.crt"); err != nil || got != nil {
		t.Fatalf("after its deletion: %v %v", got, err)
	}
}
