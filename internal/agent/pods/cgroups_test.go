package pods

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// TestRemoveOrphanCgroups runs on a real cgroup file system of its own (a
// named cgroup v1 hierarchy, which no container uses): the cgroup of a
// container that no longer exists goes, with its children; one holding a
// process, one of a known container, and one younger than the age asked
// stay.
func TestRemoveOrphanCgroups(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("mounts a cgroup file system: root tier")
	}
	root := t.TempDir()
	hierarchy := filepath.Join(root, "orchtest")
	if err := os.Mkdir(hierarchy, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("cgroup", hierarchy, "cgroup", 0, "none,name=orchtest"); err != nil {
		t.Skipf("this kernel mounts no named cgroup hierarchy: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(hierarchy, syscall.MNT_DETACH) })
	saved := cgroupRoot
	cgroupRoot = root
	t.Cleanup(func() { cgroupRoot = saved })

	parent := filepath.Join(hierarchy, "orch")
	for _, dir := range []string{"orphan/child", "busy", "known"} {
		if err := os.MkdirAll(filepath.Join(parent, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, dir := range []string{"orphan/child", "orphan", "busy", "known", ""} {
			_ = syscall.Rmdir(filepath.Join(parent, dir))
		}
	})
	sleep := exec.Command("sleep", "600")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = sleep.Process.Kill()
		_ = sleep.Wait()
	})
	if err := os.WriteFile(filepath.Join(parent, "busy", "cgroup.procs"), []byte(strconv.Itoa(sleep.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}

	// Younger than the age asked: nothing goes.
	if n, err := removeOrphanCgroups(map[string]bool{"known": true}, time.Hour); err != nil || n != 0 {
		t.Fatalf("with every cgroup young: removed %d, %v; want none", n, err)
	}
	n, err := removeOrphanCgroups(map[string]bool{"known": true}, 0)
	if err != nil || n != 1 {
		t.Fatalf("removed %d, %v; want the orphan alone", n, err)
	}
	for dir, want := range map[string]bool{"orphan": false, "busy": true, "known": true} {
		_, err := os.Stat(filepath.Join(parent, dir))
		if exists := err == nil; exists != want {
			t.Errorf("cgroup %s exists: %v, want %v", dir, exists, want)
		}
	}
}
