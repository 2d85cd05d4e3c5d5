//go:build e2e

package e2e_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent/agenttest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// TestSnapshotAndRestore uses snapshots as an operator does: `orch
// snapshot save` while the server serves, then a change, then the server
// stopped and `orch server --cluster-reset --cluster-reset-restore-path`;
// started again, the server has the snapshot's objects and not the later
// ones, its resourceVersions go on past the old ones, and a watch from the
// old history is told to list again (410). With the server stopped, the
// command copies the store itself; scheduled snapshots keep the newest.
func TestSnapshotAndRestore(t *testing.T) {
	bin := agenttest.BuildOrch(t)
	dir := t.TempDir()
	port := agenttest.FreePort(t)
	kubeconfig := filepath.Join(dir, "admin.yaml")
	start := func(extra ...string) *exec.Cmd {
		args := append([]string{"server", "--data-dir", dir, "--disable-agent", "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
			"--https-listen-port", strconv.Itoa(port), "--write-kubeconfig", kubeconfig}, extra...)
		cmd := exec.Command(bin, args...)
		log, err := os.Create(filepath.Join(t.TempDir(), "orch.log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = log, log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait(); _ = log.Close() })
		return cmd
	}
	stop := func(cmd *exec.Cmd) {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}
	orch := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("orch %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	ctx := context.Background()
	srv := start()
	client := agenttest.WaitServer(t, kubeconfig)
	cms := client.CoreV1().ConfigMaps("default")
	mk := func(name string) *corev1.ConfigMap {
		cm, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return cm
	}
	mk("kept")
	out := orch("snapshot", "save", "--data-dir", dir, "--name", "before-change")
	m := regexp.MustCompile(`Snapshot (\S+) saved at revision (\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("snapshot save said %q", out)
	}
	snapshot := m[1]
	if !strings.HasPrefix(filepath.Base(snapshot), "before-change-") || filepath.Dir(snapshot) != filepath.Join(dir, "server", "db", "snapshots") {
		t.Errorf("snapshot at %s", snapshot)
	}
	later := mk("later")
	stop(srv)

	// With no server running, the command copies the store itself.
	if out := orch("snapshot", "save", "--data-dir", dir, "--name", "offline"); !strings.Contains(out, "/offline-") {
		t.Errorf("offline snapshot said %q", out)
	}
	if out, err := exec.Command(bin, "server", "--data-dir", dir, "--cluster-reset-restore-path", snapshot).CombinedOutput(); err == nil {
		t.Errorf("a restore path without --cluster-reset was accepted: %s", out)
	}
	orch("server", "--data-dir", dir, "--cluster-reset", "--cluster-reset-restore-path", snapshot, "--write-kubeconfig", kubeconfig)

	start()
	client = agenttest.WaitServer(t, kubeconfig)
	cms = client.CoreV1().ConfigMaps("default")
	if _, err := cms.Get(ctx, "kept", metav1.GetOptions{}); err != nil {
		t.Errorf("the snapshot's object: %v", err)
	}
	if _, err := cms.Get(ctx, "later", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("an object made after the snapshot: %v", err)
	}
	w, err := cms.Watch(ctx, metav1.ListOptions{ResourceVersion: later.ResourceVersion})
	if err != nil {
		if !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) {
			t.Errorf("a watch from the replaced history: %v", err)
		}
	} else {
		select {
		case ev := <-w.ResultChan():
			if st, ok := ev.Object.(*metav1.Status); ev.Type != watch.Error || !ok || st.Code != 410 {
				t.Errorf("a watch from the replaced history got %s %v, want 410", ev.Type, ev.Object)
			}
		case <-time.After(10 * time.Second):
			t.Error("a watch from the replaced history got nothing")
		}
		w.Stop()
	}
	fresh := mk("fresh")
	if a, b := mustAtoi(t, fresh.ResourceVersion), mustAtoi(t, later.ResourceVersion); a <= b {
		t.Errorf("resourceVersion %d after the restore, %d before it", a, b)
	}
}

func mustAtoi(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
