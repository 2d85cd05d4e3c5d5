package containerd_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
	orchctr "github.com/orch-dev/orch/internal/agent/containerd"
	"github.com/orch-dev/orch/internal/agent/testimage"
	"github.com/orch-dev/orch/internal/roottest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// needRoot skips where containerd cannot run (not root, not installed);
// CI installs it and runs as root, so there the test always runs.
func needRoot(t *testing.T) {
	t.Helper()
	roottest.Require(t, "containerd")
	if _, err := exec.LookPath("containerd"); err != nil {
		t.Skip("containerd not installed")
	}
}

// TestSupervisedContainerdImportsImages: the agent's own containerd runs
// under its data dir, comes back when killed, and imports a dropped-in
// image tarball, also one that appears later.
func TestSupervisedContainerdImportsImages(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sup, err := orchctr.Start(ctx, filepath.Join(dir, "containerd"), filepath.Join(dir, "run", "containerd"), quiet, nil)
	if err != nil {
		t.Fatal(err)
	}
	images := filepath.Join(dir, "images")
	if err := os.MkdirAll(images, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := testimage.WriteBusybox(filepath.Join(images, "busybox.tar"), "docker.io/library/busybox:test", "sh"); err != nil {
		t.Fatal(err)
	}
	client, err := containerd.New(sup.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = client.Close() }()
	im := orchctr.NewImporter(client, images, quiet)
	names, err := im.Scan(ctx)
	if err != nil || !slices.Equal(names, []string{"docker.io/library/busybox:test"}) {
		t.Fatalf("imported %v, %v", names, err)
	}
	nsCtx := namespaces.WithNamespace(ctx, orchctr.Namespace)
	img, err := client.GetImage(nsCtx, "docker.io/library/busybox:test")
	if err != nil {
		t.Fatal(err)
	}
	if unpacked, err := img.IsUnpacked(nsCtx, orchctr.Snapshotter); err != nil || !unpacked {
		t.Errorf("image not unpacked: %v %v", unpacked, err)
	}
	if again, _ := im.Scan(ctx); len(again) != 0 {
		t.Errorf("a tarball was imported twice: %v", again)
	}
	if err := testimage.WriteBusybox(filepath.Join(images, "later.tar"), "registry.local/tools:1", "sleep", "3600"); err != nil {
		t.Fatal(err)
	}
	if names, err := im.Scan(ctx); err != nil || !slices.Equal(names, []string{"registry.local/tools:1"}) {
		t.Errorf("a later tarball: %v %v", names, err)
	}

	// Killed, it comes back on the same socket.
	pid := sup.Pid()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if p := sup.Pid(); p != 0 && p != pid {
			if c, err := containerd.New(sup.Socket(), containerd.WithTimeout(time.Second)); err == nil {
				ok, _ := c.IsServing(ctx)
				_ = c.Close()
				if ok {
					break
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("containerd was not restarted")
		}
		time.Sleep(100 * time.Millisecond)
	}
	cancel()
	<-sup.Done()
	if sup.Pid() != 0 {
		t.Error("containerd still running after the agent stopped")
	}
}

// TestContainerdWithoutAServiceIsRestarted: a containerd that comes up
// serving its health check but not a service the agent uses (here its
// leases plugin disabled, as a full disk at boot leaves it failed) is
// noticed, reported and restarted until it serves them all.
func TestContainerdWithoutAServiceIsRestarted(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	defer func(every time.Duration) { orchctr.HealthEvery = every }(orchctr.HealthEvery)
	orchctr.HealthEvery = 200 * time.Millisecond
	reasons := make(chan string, 10)
	sup, err := orchctr.Start(ctx, filepath.Join(dir, "containerd"), filepath.Join(dir, "run", "containerd"), quiet, func(r string) {
		select {
		case reasons <- r:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	leases := func() error {
		c, err := containerd.New(sup.Socket(), containerd.WithTimeout(time.Second))
		if err != nil {
			return err
		}
		defer func() { _ = c.Close() }()
		_, err = c.LeasesService().List(namespaces.WithNamespace(ctx, orchctr.Namespace))
		return err
	}
	if err := leases(); err != nil {
		t.Fatalf("a healthy containerd's leases: %v", err)
	}
	// The next start comes up without leases: a broken config, then killed.
	cfgPath := filepath.Join(dir, "containerd", "config.toml")
	good, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	broken := strings.Replace(string(good), `disabled_plugins = ["io.containerd.grpc.v1.cri"]`, `disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.grpc.v1.leases"]`, 1)
	if err := os.WriteFile(cfgPath, []byte(broken), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(sup.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-reasons:
		if !strings.Contains(r, "leases") {
			t.Errorf("reported: %q", r)
		}
	case <-ctx.Done():
		t.Fatal("a containerd without leases was never reported")
	}
	// Whatever broke it heals (the disk has room again): the restart serves.
	if err := os.WriteFile(cfgPath, good, 0o600); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); leases() != nil; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("containerd never served leases again: %v", leases())
		}
	}
	cancel()
	<-sup.Done()
}
