package agent_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent/agenttest"
	"github.com/orch-dev/orch/internal/agent/testimage"
	"github.com/orch-dev/orch/internal/loops/hollow"
	"github.com/orch-dev/orch/internal/loops/loopstest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestNodeHealsAfterFullDisk: a node whose disk fills reports
// DiskPressure, and a pod created meanwhile cannot get its network (CNI's
// address store cannot be written); once space is freed the node heals by
// itself: the pod runs (before, the namespace its first try left behind
// made every later try fail) and the pressure clears.
func TestNodeHealsAfterFullDisk(t *testing.T) {
	dir := agenttest.NodeDataDir(t)
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=96m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a small disk: %v %s", err, out)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	if err := os.MkdirAll(filepath.Join(dir, "agent", "images"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := testimage.WriteBusybox(filepath.Join(dir, "agent", "images", "busybox.tar"), "docker.io/library/busybox:test", "sh"); err != nil {
		t.Fatal(err)
	}
	n := startNodeIn(t, loopstest.Start(t, nil, hollow.Options{LeaseEvery: -1}), dir, "full-node")
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	for chunk := make([]byte, 64<<10); err == nil; {
		_, err = f.Write(chunk)
	}
	_ = f.Close()
	defer func() {
		if t.Failed() { // what the pod waits on, for a failure seen only under load
			p := n.pod(context.Background(), "during")
			t.Logf("pod phase %s, conditions %+v, containers %+v", p.Status.Phase, p.Status.Conditions, p.Status.ContainerStatuses)
			if evs, err := n.Client.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{}); err == nil {
				for _, e := range evs.Items {
					t.Logf("event %s %s/%s: %s (%d×)", e.Reason, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Message, e.Count)
				}
			}
		}
	}()
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "during"}, Spec: corev1.PodSpec{Containers: []corev1.Container{agenttest.Busybox("main", "sleep 3600")}}})
	diskPressure := func(ctx context.Context) corev1.ConditionStatus {
		node, err := n.Client.CoreV1().Nodes().Get(ctx, "full-node", metav1.GetOptions{})
		if err != nil {
			return ""
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeDiskPressure {
				return c.Status
			}
		}
		return ""
	}
	n.Eventually("DiskPressure on the full disk", time.Minute, func(ctx context.Context) (bool, error) {
		return diskPressure(ctx) == corev1.ConditionTrue, nil
	})
	if p := n.pod(n.Ctx, "during"); p.Status.Phase == corev1.PodRunning {
		t.Fatalf("a pod started on a full disk")
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	n.Eventually("the pod Running once space is freed", time.Minute, func(ctx context.Context) (bool, error) {
		return n.pod(ctx, "during").Status.Phase == corev1.PodRunning, nil
	})
	n.Eventually("DiskPressure cleared", time.Minute, func(ctx context.Context) (bool, error) {
		return diskPressure(ctx) == corev1.ConditionFalse, nil
	})
}
