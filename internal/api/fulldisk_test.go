package api_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/roottest"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// smallDisk mounts a tmpfs of size bytes for a test's data dir.
func smallDisk(t *testing.T, size string) string {
	t.Helper()
	roottest.Require(t, "mounting a small disk")
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

// fill writes a file until the disk has no room left, and returns its
// removal.
func fill(t *testing.T, dir string) (free func()) {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil && !errors.Is(err, syscall.ENOSPC) {
		t.Fatal(err)
	}
	if f != nil {
		chunk := make([]byte, 64<<10)
		for {
			if _, err := f.Write(chunk); err != nil {
				break
			}
		}
		_ = f.Close()
	}
	return func() {
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFullDisk: on a full disk, writes fail with 507 and a message that
// says so (as etcd refuses writes under its NOSPACE alarm), reads go on,
// and writes succeed again once space is freed, without a restart; a
// server restarted on a full disk starts, serves reads, and heals the
// same way.
func TestFullDisk(t *testing.T) {
	dir := smallDisk(t, "64m")
	ts := startServer(t, dir)
	ctx := context.Background()
	cms := ts.client.CoreV1().ConfigMaps("default")
	if _, err := cms.Create(ctx, configMap("before", map[string]string{"k": "v"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	free := fill(t, dir)
	// The store's file has some room left in it: write until it needs more.
	big := map[string]string{"k": strings.Repeat("x", 500<<10)}
	var err error
	for i := 0; err == nil && i < 200; i++ {
		_, err = cms.Create(ctx, configMap(fmt.Sprintf("big-%d", i), big), metav1.CreateOptions{})
	}
	refused := func(err error) bool {
		return statusCode(err) == 507 && strings.Contains(err.Error(), "disk is full")
	}
	if !refused(err) {
		t.Fatalf("a write on a full disk: %v (status %d), want 507 saying the disk is full", err, statusCode(err))
	}
	if list, err := cms.List(ctx, metav1.ListOptions{}); err != nil || len(list.Items) < 2 {
		t.Fatalf("a read on a full disk: %v", err)
	}
	if _, err := cms.Get(ctx, "before", metav1.GetOptions{}); err != nil {
		t.Fatalf("a get on a full disk: %v", err)
	}
	free()
	healed := func(ts *testServer, name string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, err := ts.client.CoreV1().ConfigMaps("default").Create(ctx, configMap(name, nil), metav1.CreateOptions{})
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("writes after space was freed: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	healed(ts, "after")

	// A restart on a full disk.
	ts.stop()
	free = fill(t, dir)
	ts = restartOn(t, dir, ts.srv.Addr().String())
	if _, err := ts.client.CoreV1().ConfigMaps("default").Get(ctx, "after", metav1.GetOptions{}); err != nil {
		t.Fatalf("a read after a restart on a full disk: %v", err)
	}
	for i, err := 0, error(nil); err == nil || !refused(err); i++ {
		if i == 200 {
			t.Fatalf("writes on a full disk after a restart: %v", err)
		}
		_, err = ts.client.CoreV1().ConfigMaps("default").Create(ctx, configMap(fmt.Sprintf("again-%d", i), big), metav1.CreateOptions{})
	}
	free()
	healed(ts, "after-restart")
}

func statusCode(err error) int32 {
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		return st.Status().Code
	}
	return 0
}
