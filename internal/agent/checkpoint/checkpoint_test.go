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
