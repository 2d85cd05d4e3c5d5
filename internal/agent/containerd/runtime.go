package containerd

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/images"
	"github.com/containerd/containerd/mount"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/oci"
	"github.com/containerd/containerd/remotes"
	"github.com/containerd/containerd/snapshots"
	"github.com/moby/sys/mountinfo"
	"github.com/opencontainers/image-spec/identity"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Runtime is what the agent asks of its container runtime, and nothing
// more: images, containers made from them with an OCI spec, and the
// tasks (processes) that run in them. Client is containerd's; Fake is an
// in-memory one for tests that need no root. Missing things are
// errdefs.ErrNotFound, as containerd says it.
type Runtime interface {
	// Image is an image on the node.
	Image(ctx context.Context, ref string) (containerd.Image, error)
	// Pull fetches ref through resolver and unpacks it.
	Pull(ctx context.Context, ref string, resolver remotes.Resolver) (containerd.Image, error)
	// Images are all the node's images.
	Images(ctx context.Context) ([]images.Image, error)
	// RemoveImage deletes an image and, before it returns, the content
	// and snapshots only it used.
	RemoveImage(ctx context.Context, name string) error

	// Create makes container id from img, with a writable snapshot of
	// it, the spec opts give and labels.
	Create(ctx context.Context, id string, img containerd.Image, spec []oci.SpecOpts, labels map[string]string) error
	// Containers are the containers whose labels include all of labels
	// (all of them for none).
	Containers(ctx context.Context, labels map[string]string) ([]Container, error)
	// Container is one container.
	Container(ctx context.Context, id string) (Container, error)
	// Spec is the OCI spec container id runs with.
	Spec(ctx context.Context, id string) (*specs.Spec, error)
	// Remove kills and deletes the container's task, then the container
	// and its snapshot; a container already gone is no error.
	Remove(ctx context.Context, id string) error
	// SnapshotUsage is what the container wrote to its root filesystem.
	SnapshotUsage(ctx context.Context, id string) (snapshots.Usage, error)
	// ViewImage mounts a read-only view of img's filesystem at target
	// (an image volume), kept as snapshot key with labels; a view
	// already mounted there is left as it is.
	ViewImage(ctx context.Context, img containerd.Image, key, target string, labels map[string]string) error
	// RemoveImageViews removes the views whose labels include labels,
	// once unmounted.
	RemoveImageViews(ctx context.Context, labels map[string]string) error
	// Update changes the cgroup limits of container id's running task
	// (in-place resize); what res leaves nil stays as it is.
	Update(ctx context.Context, id string, res *specs.LinuxResources) error

	// NewTask makes container id's process, with its output through io,
	// not yet started.
	NewTask(ctx context.Context, id string, io cio.Creator) (Task, error)
	// Task is container id's process, made earlier (maybe by another run
	// of the agent); attach reopens its output, nil leaves it alone.
	Task(ctx context.Context, id string, attach cio.Attach) (Task, error)
}

// Container is what the agent reads of a container.
type Container struct {
	ID        string
	Image     string
	Labels    map[string]string
	CreatedAt time.Time
}

// Process is a task's process or one exec'd in it.
type Process interface {
	// Wait is the process's exit, to be asked before Start so that no
	// exit is missed. An ExitStatus with an error is a lost wait
	// (containerd went away), not an exit.
	Wait(ctx context.Context) (<-chan containerd.ExitStatus, error)
	Start(ctx context.Context) error
	Status(ctx context.Context) (containerd.Status, error)
	Kill(ctx context.Context, sig syscall.Signal) error
	Resize(ctx context.Context, width, height uint32) error
	// CloseStdin closes the process's input.
	CloseStdin(ctx context.Context) error
	IO() cio.IO
	// Delete removes the process once it has exited.
	Delete(ctx context.Context) error
}

// Task is a container's main process.
type Task interface {
	Process
	// Exec starts nothing: it makes a process spec runs in the task's
	// container, with its output through io, to be started.
	Exec(ctx context.Context, id string, spec *specs.Process, io cio.Creator) (Process, error)
	// Pid is the task's process on the node, 0 for none.
	Pid() uint32
}

// Client is the Runtime over a containerd client, in orch's namespace.
type Client struct{ c *containerd.Client }

// NewClient is the Runtime of c.
func NewClient(c *containerd.Client) *Client { return &Client{c: c} }

var _ Runtime = (*Client)(nil)

func inNamespace(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, Namespace)
}

// Image implements Runtime.
func (r *Client) Image(ctx context.Context, ref string) (containerd.Image, error) {
	return r.c.GetImage(inNamespace(ctx), ref)
}

// Pull implements Runtime.
func (r *Client) Pull(ctx context.Context, ref string, resolver remotes.Resolver) (containerd.Image, error) {
	return r.c.Pull(inNamespace(ctx), ref, containerd.WithPullUnpack, containerd.WithResolver(resolver))
}

// Images implements Runtime.
func (r *Client) Images(ctx context.Context) ([]images.Image, error) {
	return r.c.ImageService().List(inNamespace(ctx))
}

// RemoveImage implements Runtime.
func (r *Client) RemoveImage(ctx context.Context, name string) error {
	return r.c.ImageService().Delete(inNamespace(ctx), name, images.SynchronousDelete())
}

// Create implements Runtime.
//
// containerd's client makes the container's snapshot before the container
// and leaves it behind when the container is refused, after which every
// try fails on the snapshot ("already exists"): a snapshot of this id with
// no container of it is a failed create's, removed before a try and after
// a failed one.
func (r *Client) Create(ctx context.Context, id string, img containerd.Image, spec []oci.SpecOpts, labels map[string]string) error {
	ctx = inNamespace(ctx)
	r.removeOrphanSnapshot(ctx, id)
	_, err := r.c.NewContainer(ctx, id, containerd.WithImage(img), containerd.WithNewSnapshot(id, img),
		containerd.WithNewSpec(spec...), containerd.WithContainerLabels(labels))
	if err != nil {
		r.removeOrphanSnapshot(ctx, id)
	}
	return err
}

// removeOrphanSnapshot removes the snapshot id when no container has it.
func (r *Client) removeOrphanSnapshot(ctx context.Context, id string) {
	if _, err := r.c.LoadContainer(ctx, id); !errdefs.IsNotFound(err) {
		return
	}
	_ = r.c.SnapshotService(Snapshotter).Remove(ctx, id)
}

// Containers implements Runtime.
func (r *Client) Containers(ctx context.Context, labels map[string]string) ([]Container, error) {
	ctx = inNamespace(ctx)
	var filters []string
	for k, v := range labels {
		filters = append(filters, fmt.Sprintf("labels.%q==%s", k, v))
	}
	var filter []string
	if len(filters) > 0 {
		// One filter whose parts are joined by "," must all hold.
		filter = []string{strings.Join(filters, ",")}
	}
	found, err := r.c.Containers(ctx, filter...)
	if err != nil {
		return nil, err
	}
	out := make([]Container, 0, len(found))
	for _, c := range found {
		info, err := c.Info(ctx, containerd.WithoutRefreshedMetadata)
		if errdefs.IsNotFound(err) {
			continue // removed since the list
		} else if err != nil {
			return nil, err
		}
		out = append(out, Container{ID: info.ID, Image: info.Image, Labels: info.Labels, CreatedAt: info.CreatedAt})
	}
	return out, nil
}

// Container implements Runtime.
func (r *Client) Container(ctx context.Context, id string) (Container, error) {
	ctx = inNamespace(ctx)
	c, err := r.c.LoadContainer(ctx, id)
	if err != nil {
		return Container{}, err
	}
	info, err := c.Info(ctx, containerd.WithoutRefreshedMetadata)
	if err != nil {
		return Container{}, err
	}
	return Container{ID: info.ID, Image: info.Image, Labels: info.Labels, CreatedAt: info.CreatedAt}, nil
}

// Spec implements Runtime.
func (r *Client) Spec(ctx context.Context, id string) (*specs.Spec, error) {
	ctx = inNamespace(ctx)
	c, err := r.c.LoadContainer(ctx, id)
	if err != nil {
		return nil, err
	}
	return c.Spec(ctx)
}

// Remove implements Runtime.
func (r *Client) Remove(ctx context.Context, id string) error {
	ctx = inNamespace(ctx)
	c, err := r.c.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	if task, err := c.Task(ctx, nil); err == nil {
		if _, err := task.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
	}
	if err := c.Delete(ctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	return nil
}

// SnapshotUsage implements Runtime.
func (r *Client) SnapshotUsage(ctx context.Context, id string) (snapshots.Usage, error) {
	ctx = inNamespace(ctx)
	c, err := r.c.LoadContainer(ctx, id)
	if err != nil {
		return snapshots.Usage{}, err
	}
	info, err := c.Info(ctx, containerd.WithoutRefreshedMetadata)
	if err != nil {
		return snapshots.Usage{}, err
	}
	if info.SnapshotKey == "" {
		return snapshots.Usage{}, nil
	}
	return r.c.SnapshotService(info.Snapshotter).Usage(ctx, info.SnapshotKey)
}

// NewTask implements Runtime.
func (r *Client) NewTask(ctx context.Context, id string, io cio.Creator) (Task, error) {
	ctx = inNamespace(ctx)
	c, err := r.c.LoadContainer(ctx, id)
	if err != nil {
		return nil, err
	}
	t, err := c.NewTask(ctx, io)
	if err != nil {
		return nil, err
	}
	return task{process{t}, t}, nil
}

// Task implements Runtime.
func (r *Client) Task(ctx context.Context, id string, attach cio.Attach) (Task, error) {
	ctx = inNamespace(ctx)
	c, err := r.c.LoadContainer(ctx, id)
	if err != nil {
		return nil, err
	}
	t, err := c.Task(ctx, attach)
	if err != nil {
		return nil, err
	}
	return task{process{t}, t}, nil
}

// Update implements Runtime.
func (r *Client) Update(ctx context.Context, id string, res *specs.LinuxResources) error {
	ctx = inNamespace(ctx)
	c, err := r.c.LoadContainer(ctx, id)
	if err != nil {
		return err
	}
	t, err := c.Task(ctx, nil)
	if err != nil {
		return err
	}
	if err := t.Update(ctx, containerd.WithResources(res)); err != nil {
		return fmt.Errorf("update %s's resources: %w", id, err)
	}
	return nil
}

// ViewImage implements Runtime. The view is a root of containerd's
// garbage collection, so that it outlives no lease but its pod's.
func (r *Client) ViewImage(ctx context.Context, img containerd.Image, key, target string, labels map[string]string) error {
	if mounted(target) {
		return nil
	}
	ctx = inNamespace(ctx)
	if unpacked, err := img.IsUnpacked(ctx, Snapshotter); err != nil || !unpacked {
		if err := img.Unpack(ctx, Snapshotter); err != nil {
			return fmt.Errorf("unpack %s: %w", img.Name(), err)
		}
	}
	diffIDs, err := img.RootFS(ctx)
	if err != nil {
		return fmt.Errorf("layers of %s: %w", img.Name(), err)
	}
	all := map[string]string{"containerd.io/gc.root": time.Now().UTC().Format(time.RFC3339)}
	for k, v := range labels {
		all[k] = v
	}
	sn := r.c.SnapshotService(Snapshotter)
	mounts, err := sn.View(ctx, key, identity.ChainID(diffIDs).String(), snapshots.WithLabels(all))
	if errdefs.IsAlreadyExists(err) {
		mounts, err = sn.Mounts(ctx, key)
	}
	if err != nil {
		return fmt.Errorf("view of %s: %w", img.Name(), err)
	}
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	if err := mount.All(mounts, target); err != nil {
		return fmt.Errorf("mount the view of %s: %w", img.Name(), err)
	}
	return nil
}

// RemoveImageViews implements Runtime.
func (r *Client) RemoveImageViews(ctx context.Context, labels map[string]string) error {
	ctx = inNamespace(ctx)
	sn := r.c.SnapshotService(Snapshotter)
	var keys []string
	err := sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		for k, v := range labels {
			if info.Labels[k] != v {
				return nil
			}
		}
		keys = append(keys, info.Name)
		return nil
	})
	if err != nil {
		return err
	}
	for _, key := range keys {
		if err := sn.Remove(ctx, key); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("remove image view %s: %w", key, err)
		}
	}
	return nil
}

// mounted says whether path is a mount point.
func mounted(path string) bool {
	m, err := mountinfo.Mounted(path)
	return err == nil && m
}

// process is a containerd process in orch's namespace.
type process struct{ p containerd.Process }

func (p process) Wait(ctx context.Context) (<-chan containerd.ExitStatus, error) {
	return p.p.Wait(inNamespace(ctx))
}
func (p process) Start(ctx context.Context) error { return p.p.Start(inNamespace(ctx)) }
func (p process) Status(ctx context.Context) (containerd.Status, error) {
	return p.p.Status(inNamespace(ctx))
}
func (p process) Kill(ctx context.Context, sig syscall.Signal) error {
	return p.p.Kill(inNamespace(ctx), sig)
}
func (p process) Resize(ctx context.Context, width, height uint32) error {
	return p.p.Resize(inNamespace(ctx), width, height)
}
func (p process) CloseStdin(ctx context.Context) error {
	return p.p.CloseIO(inNamespace(ctx), containerd.WithStdinCloser)
}
func (p process) IO() cio.IO { return p.p.IO() }
func (p process) Delete(ctx context.Context) error {
	_, err := p.p.Delete(inNamespace(ctx))
	return err
}

type task struct {
	process
	t containerd.Task
}

func (t task) Pid() uint32 { return t.t.Pid() }

func (t task) Exec(ctx context.Context, id string, spec *specs.Process, io cio.Creator) (Process, error) {
	p, err := t.t.Exec(inNamespace(ctx), id, spec, io)
	if err != nil {
		return nil, err
	}
	return process{p}, nil
}
