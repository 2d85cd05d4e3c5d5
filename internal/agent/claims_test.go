package agent_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent/agenttest"
	"github.com/orch-dev/orch/internal/localpath"
	"github.com/orch-dev/orch/internal/loops"
	"github.com/orch-dev/orch/internal/loops/hollow"
	"github.com/orch-dev/orch/internal/loops/loopstest"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

// TestLocalPathClaim: a claim of the default class (local-path, bound on
// first use) gets a volume on the node its pod is scheduled to, made by
// the node; what one pod writes there another pod of the claim reads; a
// claim deleted while pods use it stays until they are gone, then its
// data and volume go (reclaim Delete), as with k3s's local-path
// provisioner. The node's Summary API says how much the volume holds.
func TestLocalPathClaim(t *testing.T) {
	dir := agenttest.NodeDataDir(t)
	storage := filepath.Join(t.TempDir(), "storage")
	c := loopstest.StartWith(t, nil, hollow.Options{LeaseEvery: -1}, loops.Options{LocalStoragePath: storage})
	n := startNodeIn(t, c, dir, "disk-node")
	claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data"}, Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")}}}}
	if _, err := n.Client.CoreV1().PersistentVolumeClaims("default").Create(n.Ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	withClaim := func(name, script string) *corev1.Pod {
		c := agenttest.Busybox("main", script)
		c.VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{Containers: []corev1.Container{c},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}}}}}
	}
	n.create(t, withClaim("writer", "echo kept > /data/file; dd if=/dev/zero of=/data/blob bs=1024 count=1024; echo written; sleep 3600"))
	n.waitOutput(t, "writer", "main", "written")
	// The kubelet's Summary API, through nodes/proxy as on Kubernetes
	// (kubectl get --raw): the claim's volume and what it holds.
	raw, err := n.Client.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/disk-node/proxy/stats/summary").DoRaw(n.Ctx)
	if err != nil {
		t.Fatalf("stats summary: %v %s", err, raw)
	}
	var summary statsapi.Summary
	if err := json.Unmarshal(raw, &summary); err != nil {
		t.Fatal(err)
	}
	var used uint64
	for _, p := range summary.Pods {
		for _, v := range p.VolumeStats {
			if p.PodRef.Name == "writer" && v.PVCRef != nil && v.PVCRef.Name == "data" && v.UsedBytes != nil && v.CapacityBytes != nil {
				used = *v.UsedBytes
			}
		}
	}
	if summary.Node.NodeName != "disk-node" || summary.Node.Fs == nil || used < 1<<20 {
		t.Errorf("summary: node %q fs %v, the claim's volume uses %d bytes (want ≥ 1 MiB)", summary.Node.NodeName, summary.Node.Fs, used)
	}
	pvc, err := n.Client.CoreV1().PersistentVolumeClaims("default").Get(n.Ctx, "data", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pvc.Status.Phase != corev1.ClaimBound || pvc.Annotations[localpath.SelectedNodeAnnotation] != "disk-node" || *pvc.Spec.StorageClassName != localpath.ClassName {
		t.Fatalf("claim: %s, class %v, annotations %v", pvc.Status.Phase, pvc.Spec.StorageClassName, pvc.Annotations)
	}
	data := localpath.Dir(storage, pvc.Spec.VolumeName, pvc)
	if got, err := os.ReadFile(filepath.Join(data, "file")); err != nil || string(got) != "kept\n" {
		t.Fatalf("the volume's data on the node: %q, %v", got, err)
	}
	// Writable by any user, as rancher's provisioner makes it: a pod need
	// not run as root to use its claim.
	if st, err := os.Stat(data); err != nil || st.Mode().Perm() != 0o777 {
		t.Errorf("the volume's directory: %v %v, want mode 0777", st.Mode(), err)
	}
	n.create(t, withClaim("reader", "cat /data/file; sleep 3600"))
	n.waitOutput(t, "reader", "main", "kept")
	// A claim in use is not deleted under its pods (pvc-protection).
	if err := n.Client.CoreV1().PersistentVolumeClaims("default").Delete(n.Ctx, "data", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if p, err := n.Client.CoreV1().PersistentVolumeClaims("default").Get(n.Ctx, "data", metav1.GetOptions{}); err != nil || p.DeletionTimestamp == nil {
		t.Fatalf("a claim in use: %v %v", p, err)
	}
	if _, err := os.Stat(data); err != nil {
		t.Fatalf("the data of a claim in use went: %v", err)
	}
	for _, p := range []string{"writer", "reader"} {
		if err := n.Client.CoreV1().Pods("default").Delete(n.Ctx, p, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
	}
	n.Eventually("the claim and its volume gone", time.Minute, func(ctx context.Context) (bool, error) {
		_, errClaim := n.Client.CoreV1().PersistentVolumeClaims("default").Get(ctx, "data", metav1.GetOptions{})
		_, errVolume := n.Client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
		return errClaim != nil && errVolume != nil, nil
	})
	if _, err := os.Stat(data); !os.IsNotExist(err) {
		t.Errorf("the deleted volume's data is still on the node: %v", err)
	}
}
