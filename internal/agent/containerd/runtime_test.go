package containerd_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/images"
	"github.com/containerd/containerd/oci"
	orchctr "github.com/orch-dev/orch/internal/agent/containerd"
	"github.com/orch-dev/orch/internal/agent/testimage"
)

const contractImage = "docker.io/library/busybox:test"

// TestRuntimeContract: the fake runtime answers as containerd does, so
// that what the pod manager's tests learn on the fake holds on the node.
// The same steps run on both; the real one needs root.
func TestRuntimeContract(t *testing.T) {
	t.Run("fake", func(t *testing.T) {
		rt := orchctr.NewFake()
		rt.AddImage(contractImage)
		testRuntime(t, rt, nil)
	})
	t.Run("containerd", func(t *testing.T) {
		needRoot(t)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		dir := t.TempDir()
		sup, err := orchctr.Start(ctx, filepath.Join(dir, "containerd"), filepath.Join(dir, "run", "containerd"), quiet, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { cancel(); <-sup.Done() }()
		images := filepath.Join(dir, "images")
		if err := os.MkdirAll(images, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := testimage.WriteBusybox(filepath.Join(images, "busybox.tar"), contractImage, "sleep", "3600"); err != nil {
			t.Fatal(err)
		}
		client, err := containerd.New(sup.Socket())
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = client.Close() }()
		if _, err := orchctr.NewImporter(client, images, quiet).Scan(ctx); err != nil {
			t.Fatal(err)
		}
		testRuntime(t, orchctr.NewClient(client), func(img containerd.Image) []oci.SpecOpts {
			return []oci.SpecOpts{oci.WithImageConfig(img)}
		})
	})
}

func testRuntime(t *testing.T, rt orchctr.Runtime, spec func(containerd.Image) []oci.SpecOpts) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := rt.Image(ctx, "docker.io/library/absent:1"); !errdefs.IsNotFound(err) {
		t.Errorf("a missing image: %v, want not found", err)
	}
	img, err := rt.Image(ctx, contractImage)
	if err != nil {
		t.Fatal(err)
	}
	if img.Name() != contractImage || img.Target().Digest == "" {
		t.Errorf("image %q digest %q", img.Name(), img.Target().Digest)
	}
	all, err := rt.Images(ctx)
	if err != nil || !slices.ContainsFunc(all, func(i images.Image) bool { return i.Name == contractImage }) {
		t.Errorf("images %v, %v: want %s among them", all, err, contractImage)
	}
	var opts []oci.SpecOpts
	if spec != nil {
		opts = spec(img)
	}
	const id = "contract-1"
	labels := map[string]string{"io.kubernetes.pod.uid": "u1", "other": "x"}
	if err := rt.Create(ctx, id, img, opts, labels); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rt.Remove(context.WithoutCancel(ctx), id) }()
	if err := rt.Create(ctx, id, img, opts, labels); !errdefs.IsAlreadyExists(err) {
		t.Errorf("a second create of %s: %v, want already exists", id, err)
	}
	for _, tc := range []struct {
		labels map[string]string
		want   bool
	}{
		{nil, true},
		{map[string]string{"io.kubernetes.pod.uid": "u1"}, true},
		{map[string]string{"io.kubernetes.pod.uid": "u1", "other": "x"}, true},
		{map[string]string{"io.kubernetes.pod.uid": "u2"}, false},
		{map[string]string{"io.kubernetes.pod.uid": "u1", "other": "y"}, false},
	} {
		found, err := rt.Containers(ctx, tc.labels)
		if err != nil {
			t.Fatal(err)
		}
		has := slices.ContainsFunc(found, func(c orchctr.Container) bool { return c.ID == id })
		if has != tc.want {
			t.Errorf("containers with labels %v: %v, want it there: %v", tc.labels, found, tc.want)
		}
	}
	c, err := rt.Container(ctx, id)
	if err != nil || c.Image != contractImage || c.Labels["other"] != "x" || c.CreatedAt.IsZero() {
		t.Errorf("container %+v, %v", c, err)
	}
	if s, err := rt.Spec(ctx, id); err != nil || s.Process == nil {
		t.Errorf("spec %+v, %v: want one with a process", s, err)
	}

	if _, err := rt.Task(ctx, id, nil); !errdefs.IsNotFound(err) {
		t.Errorf("the task of a container that has none: %v, want not found", err)
	}
	task, err := rt.NewTask(ctx, id, cio.NullIO)
	if err != nil {
		t.Fatal(err)
	}
	exited, err := task.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := task.Status(ctx); err != nil || st.Status != containerd.Created {
		t.Errorf("a new task's status %+v, %v, want created", st, err)
	}
	if err := task.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := task.Status(ctx); err != nil || st.Status != containerd.Running {
		t.Errorf("a started task's status %+v, %v, want running", st, err)
	}
	again, err := rt.Task(ctx, id, nil)
	if err != nil {
		t.Fatal(err)
	}
	// SIGKILL: sleep as its container's PID 1 has no handler, and the
	// kernel gives such a PID 1 none of the default ones.
	if err := again.Kill(ctx, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case st := <-exited:
		if st.Error() != nil || st.ExitCode() != 128+uint32(syscall.SIGKILL) {
			t.Errorf("exit %d, %v: want 137 (killed by SIGKILL)", st.ExitCode(), st.Error())
		}
	case <-ctx.Done():
		t.Fatal("no exit after SIGKILL")
	}
	if st, err := task.Status(ctx); err != nil || st.Status != containerd.Stopped || st.ExitStatus != 137 {
		t.Errorf("an ended task's status %+v, %v, want stopped with 137", st, err)
	}
	if err := task.Kill(ctx, syscall.SIGKILL); !errdefs.IsNotFound(err) {
		t.Errorf("killing an ended process: %v, want not found", err)
	}

	if err := rt.Remove(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Container(ctx, id); !errdefs.IsNotFound(err) {
		t.Errorf("a removed container: %v, want not found", err)
	}
	if _, err := rt.Task(ctx, id, nil); !errdefs.IsNotFound(err) {
		t.Errorf("a removed container's task: %v, want not found", err)
	}
	if err := rt.Remove(ctx, id); err != nil {
		t.Errorf("removing a removed container: %v, want no error", err)
	}
	if _, err := rt.NewTask(ctx, id, cio.NullIO); !errdefs.IsNotFound(err) && !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a task for a removed container: %v, want not found", err)
	}
}
