package containerd

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/content"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/images"
	"github.com/containerd/containerd/oci"
	"github.com/containerd/containerd/remotes"
	"github.com/containerd/containerd/snapshots"
	"github.com/containerd/fifo"
	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Fake is an in-memory Runtime for tests that need no root: images are
// names, containers are records, and a task "runs" from Start until it
// is killed or the test ends it with Exit, writing what the test gives
// it to its output FIFOs, which are real, so the agent's output copying
// runs as it does on containerd. Pulls succeed for the refs Pullable
// names and fail as a registry's "not found" for the rest.
type Fake struct {
	// StartError, when set, fails the start of the tasks it returns an
	// error for, as runc fails a missing binary.
	StartError func(id string) error
	// Exec answers the processes exec'd in a container: exit code and
	// output. Nil exits 0 saying nothing.
	Exec func(id string, args []string) (int, string)
	// UpdateError, when set, fails the Updates it returns an error for,
	// as the kernel refuses a memory limit below what is in use.
	UpdateError func(id string, res *specs.LinuxResources) error

	mu         sync.Mutex
	images     map[string]images.Image
	pullable   map[string]bool
	pulls      map[string]int
	containers map[string]*fakeContainer
	// down is while "containerd is away": waits were cut and tasks
	// cannot be reached.
	down bool
	// views are the image views made, by key: their labels.
	views map[string]map[string]string
}

type fakeContainer struct {
	info Container
	task *fakeTask
	// resources are what Update set last.
	resources *specs.LinuxResources
}

// NewFake is a Fake with no images and no containers.
func NewFake() *Fake {
	return &Fake{images: map[string]images.Image{}, pullable: map[string]bool{}, pulls: map[string]int{},
		containers: map[string]*fakeContainer{}}
}

var _ Runtime = (*Fake)(nil)

func fakeDigest(ref string) digest.Digest { return digest.FromString(ref) }

// AddImage puts ref on the node, as an import would.
func (f *Fake) AddImage(ref string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.images[ref] = images.Image{Name: ref, CreatedAt: time.Now(),
		Target: ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: fakeDigest(ref), Size: 1000}}
}

// Pullable lets pulls of ref succeed.
func (f *Fake) Pullable(ref string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pullable[ref] = true
}

// Pulls is how many times ref was pulled.
func (f *Fake) Pulls(ref string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pulls[ref]
}

// Image implements Runtime.
func (f *Fake) Image(ctx context.Context, ref string) (containerd.Image, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	img, ok := f.images[ref]
	if !ok {
		return nil, fmt.Errorf("image %q: %w", ref, errdefs.ErrNotFound)
	}
	return fakeImage{img}, nil
}

// Pull implements Runtime.
func (f *Fake) Pull(ctx context.Context, ref string, _ remotes.Resolver) (containerd.Image, error) {
	f.mu.Lock()
	ok := f.pullable[ref]
	f.pulls[ref]++
	f.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("failed to resolve reference %q: %s: %w", ref, ref, errdefs.ErrNotFound)
	}
	f.AddImage(ref)
	return f.Image(ctx, ref)
}

// Images implements Runtime.
func (f *Fake) Images(context.Context) ([]images.Image, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]images.Image, 0, len(f.images))
	for _, img := range f.images {
		out = append(out, img)
	}
	return out, nil
}

// RemoveImage implements Runtime.
func (f *Fake) RemoveImage(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.images[name]; !ok {
		return fmt.Errorf("image %q: %w", name, errdefs.ErrNotFound)
	}
	delete(f.images, name)
	return nil
}

// Create implements Runtime.
func (f *Fake) Create(_ context.Context, id string, img containerd.Image, spec []oci.SpecOpts, labels map[string]string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.containers[id]; ok {
		return fmt.Errorf("container %q: %w", id, errdefs.ErrAlreadyExists)
	}
	f.containers[id] = &fakeContainer{info: Container{ID: id, Image: img.Name(), Labels: maps.Clone(labels), CreatedAt: time.Now()}}
	return nil
}

// Containers implements Runtime.
func (f *Fake) Containers(_ context.Context, labels map[string]string) ([]Container, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Container
next:
	for _, c := range f.containers {
		for k, v := range labels {
			if c.info.Labels[k] != v {
				continue next
			}
		}
		out = append(out, c.info)
	}
	return out, nil
}

func (f *Fake) container(id string) (*fakeContainer, error) {
	c, ok := f.containers[id]
	if !ok {
		return nil, fmt.Errorf("container %q in namespace %q: %w", id, Namespace, errdefs.ErrNotFound)
	}
	return c, nil
}

// Container implements Runtime.
func (f *Fake) Container(_ context.Context, id string) (Container, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, err := f.container(id)
	if err != nil {
		return Container{}, err
	}
	return c.info, nil
}

// Spec implements Runtime.
func (f *Fake) Spec(_ context.Context, id string) (*specs.Spec, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.container(id); err != nil {
		return nil, err
	}
	return &specs.Spec{Process: &specs.Process{Cwd: "/"}}, nil
}

// Update implements Runtime: the resources are kept for Resources; a
// container without a running task is an error, as containerd's.
func (f *Fake) Update(_ context.Context, id string, res *specs.LinuxResources) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, err := f.container(id)
	if err != nil {
		return err
	}
	if c.task == nil {
		return fmt.Errorf("task %s: %w", id, errdefs.ErrNotFound)
	}
	if f.UpdateError != nil {
		if err := f.UpdateError(id, res); err != nil {
			return err
		}
	}
	c.resources = res
	return nil
}

// Resources are the resources Update last set on container id, nil for
// none.
func (f *Fake) Resources(id string) *specs.LinuxResources {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c, ok := f.containers[id]; ok {
		return c.resources
	}
	return nil
}

// ViewImage implements Runtime: target is made, with a file naming the
// image (a fake image has no files).
func (f *Fake) ViewImage(_ context.Context, img containerd.Image, key, target string, labels map[string]string) error {
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(target, "image"), []byte(img.Name()), 0o644); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.views == nil {
		f.views = map[string]map[string]string{}
	}
	f.views[key] = maps.Clone(labels)
	return nil
}

// RemoveImageViews implements Runtime.
func (f *Fake) RemoveImageViews(_ context.Context, labels map[string]string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for key, have := range f.views {
		match := true
		for k, v := range labels {
			match = match && have[k] == v
		}
		if match {
			delete(f.views, key)
		}
	}
	return nil
}

// Views are the keys of the image views there are.
func (f *Fake) Views() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.views))
}

// Remove implements Runtime.
func (f *Fake) Remove(_ context.Context, id string) error {
	f.mu.Lock()
	var t *fakeTask
	if c, ok := f.containers[id]; ok {
		t = c.task
	}
	delete(f.containers, id)
	f.mu.Unlock()
	if t != nil {
		t.end(137) // WithProcessKill
	}
	return nil
}

// SnapshotUsage implements Runtime.
func (f *Fake) SnapshotUsage(_ context.Context, id string) (snapshots.Usage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.container(id); err != nil {
		return snapshots.Usage{}, err
	}
	return snapshots.Usage{}, nil // a fake container writes nothing
}

// NewTask implements Runtime.
func (f *Fake) NewTask(ctx context.Context, id string, creator cio.Creator) (Task, error) {
	f.mu.Lock()
	c, err := f.container(id)
	if err == nil && c.task != nil {
		err = fmt.Errorf("task %q: %w", id, errdefs.ErrAlreadyExists)
	}
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	t := &fakeTask{fake: f, fakeProcess: newFakeProcess(id)}
	if creator != nil {
		if t.io, err = creator(id); err != nil {
			return nil, err
		}
		t.open() // as the shim opens them when it creates the task
	}
	f.mu.Lock()
	c.task = t
	f.mu.Unlock()
	return t, nil
}

// Task implements Runtime.
func (f *Fake) Task(_ context.Context, id string, attach cio.Attach) (Task, error) {
	f.mu.Lock()
	if f.down {
		f.mu.Unlock()
		return nil, fmt.Errorf("connection error: %w", errdefs.ErrUnavailable)
	}
	c, err := f.container(id)
	if err == nil && c.task == nil {
		err = fmt.Errorf("no running task found: task %s not found: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		f.mu.Unlock()
		return nil, err
	}
	t := c.task
	f.mu.Unlock()
	if attach != nil {
		t.mu.Lock()
		fifos := t.fifos
		t.mu.Unlock()
		o, err := attach(fifos)
		if err != nil {
			return nil, err
		}
		t.mu.Lock()
		t.io = o
		t.mu.Unlock()
	}
	return t, nil
}

// Exit ends container id's running task with code, as the process's own
// exit would.
func (f *Fake) Exit(id string, code int) error {
	t, err := f.taskOf(id)
	if err != nil {
		return err
	}
	t.end(uint32(code))
	return nil
}

// Output writes to container id's running task's standard output.
func (f *Fake) Output(id, text string) error {
	t, err := f.taskOf(id)
	if err != nil {
		return err
	}
	return t.write(text)
}

// Running reports whether container id's task has started and not ended.
func (f *Fake) Running(id string) bool {
	t, err := f.taskOf(id)
	if err != nil {
		return false
	}
	st, _ := t.Status(context.Background())
	return st.Status == containerd.Running
}

func (f *Fake) taskOf(id string) (*fakeTask, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, err := f.container(id)
	if err != nil {
		return nil, err
	}
	if c.task == nil {
		return nil, fmt.Errorf("container %q has no task", id)
	}
	return c.task, nil
}

// Down cuts every wait, as containerd's going away does (its shims keep
// the tasks running); Up brings it back.
func (f *Fake) Down() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = true
	for _, c := range f.containers {
		if c.task != nil {
			c.task.loseWaits()
		}
	}
}

// Close closes the output of every task still running, as shims going
// away would, so that a test's end leaves no FIFO open waiting for a
// reader that has gone.
func (f *Fake) Close() {
	f.mu.Lock()
	var running []*fakeProcess
	for _, c := range f.containers {
		if c.task != nil {
			running = append(running, c.task.fakeProcess)
		}
	}
	f.mu.Unlock()
	for _, p := range running {
		p.mu.Lock()
		outs := []io.WriteCloser{p.out, p.errOut}
		p.out, p.errOut = nil, nil
		p.mu.Unlock()
		for _, o := range outs {
			if o != nil {
				_ = o.Close()
			}
		}
	}
}

// Up ends Down.
func (f *Fake) Up() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = false
}

// fakeProcess runs from Start to its end.
type fakeProcess struct {
	id string

	mu      sync.Mutex
	started bool
	exited  *containerd.ExitStatus
	waits   []chan containerd.ExitStatus
	io      cio.IO
	fifos   *cio.FIFOSet
	// out and errOut are the shim's ends of stdout and stderr.
	out, errOut io.WriteCloser
}

func newFakeProcess(id string) *fakeProcess { return &fakeProcess{id: id} }

func (p *fakeProcess) Wait(context.Context) (<-chan containerd.ExitStatus, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ch := make(chan containerd.ExitStatus, 1)
	if p.exited != nil {
		ch <- *p.exited
		return ch, nil
	}
	p.waits = append(p.waits, ch)
	return ch, nil
}

// open opens the write sides of the process's output FIFOs, as a shim
// does, so the reader's copying sees the process's output and its end.
func (p *fakeProcess) open() {
	if p.io == nil {
		return
	}
	cfg := p.io.Config()
	p.fifos = cio.NewFIFOSet(cfg, nil)
	for i, path := range []string{cfg.Stdout, cfg.Stderr} {
		if path == "" {
			continue
		}
		w, err := fifo.OpenFifo(context.Background(), path, syscall.O_WRONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			continue
		}
		if i == 0 {
			p.out = w
		} else {
			p.errOut = w
		}
	}
}

func (p *fakeProcess) write(text string) error {
	p.mu.Lock()
	out := p.out
	p.mu.Unlock()
	if out == nil {
		return fmt.Errorf("process %s has no output", p.id)
	}
	_, err := io.WriteString(out, text)
	return err
}

func (p *fakeProcess) Status(context.Context) (containerd.Status, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.exited != nil:
		return containerd.Status{Status: containerd.Stopped, ExitStatus: p.exited.ExitCode(), ExitTime: p.exited.ExitTime()}, nil
	case p.started:
		return containerd.Status{Status: containerd.Running}, nil
	}
	return containerd.Status{Status: containerd.Created}, nil
}

// end is the process's exit with code; a second end is none.
func (p *fakeProcess) end(code uint32) {
	p.mu.Lock()
	if p.exited != nil {
		p.mu.Unlock()
		return
	}
	p.exited = containerd.NewExitStatus(code, time.Now(), nil)
	waits, outs := p.waits, []io.WriteCloser{p.out, p.errOut}
	p.waits, p.out, p.errOut = nil, nil, nil
	p.mu.Unlock()
	for _, o := range outs {
		if o != nil {
			_ = o.Close()
		}
	}
	for _, w := range waits {
		w <- *p.exited
	}
}

func (p *fakeProcess) loseWaits() {
	p.mu.Lock()
	waits := p.waits
	p.waits = nil
	p.mu.Unlock()
	for _, w := range waits {
		w <- *containerd.NewExitStatus(containerd.UnknownExitStatus, time.Time{}, errdefs.ErrUnavailable)
	}
}

func (p *fakeProcess) Kill(_ context.Context, sig syscall.Signal) error {
	p.mu.Lock()
	exited, started := p.exited != nil, p.started
	p.mu.Unlock()
	if exited || !started {
		return fmt.Errorf("process %s: %w", p.id, errdefs.ErrNotFound)
	}
	// Processes here die of any signal, as one without handlers does
	// (not a real container's PID 1, to which the kernel gives no
	// default handlers: the agent's SIGKILL after the grace period is
	// what ends those).
	p.end(128 + uint32(sig))
	return nil
}

func (p *fakeProcess) Resize(context.Context, uint32, uint32) error { return nil }
func (p *fakeProcess) CloseStdin(context.Context) error             { return nil }

func (p *fakeProcess) IO() cio.IO {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.io
}

func (p *fakeProcess) Delete(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited == nil && p.started {
		return fmt.Errorf("process %s is running: %w", p.id, errdefs.ErrFailedPrecondition)
	}
	return nil
}

type fakeTask struct {
	*fakeProcess
	fake *Fake
}

func (t *fakeTask) Start(context.Context) error {
	if t.fake.StartError != nil {
		if err := t.fake.StartError(t.id); err != nil {
			t.end(128) // its process is gone, and with it the output's writers
			return err
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.started {
		return fmt.Errorf("task %s: %w", t.id, errdefs.ErrFailedPrecondition)
	}
	t.started = true
	return nil
}

// Pid stands for the task's process, which a fake task does not have:
// this process's own, so that what names its namespaces names real ones.
func (t *fakeTask) Pid() uint32 { return uint32(os.Getpid()) }

func (t *fakeTask) Exec(_ context.Context, id string, spec *specs.Process, creator cio.Creator) (Process, error) {
	p := &fakeExec{fakeProcess: newFakeProcess(id), task: t, args: spec.Args}
	if creator != nil {
		var err error
		if p.io, err = creator(id); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// fakeExec runs Fake.Exec's answer as soon as it starts.
type fakeExec struct {
	*fakeProcess
	task *fakeTask
	args []string
}

func (p *fakeExec) Start(context.Context) error {
	code, out := 0, ""
	if answer := p.task.fake.Exec; answer != nil {
		code, out = answer(p.task.id, p.args)
	}
	p.mu.Lock()
	p.started = true
	p.open()
	p.mu.Unlock()
	if out != "" {
		_ = p.write(out)
	}
	go p.end(uint32(code))
	return nil
}

// fakeImage is an image the Fake has: a name, a digest and a size, and
// an empty config; it has no content to unpack or read.
type fakeImage struct{ meta images.Image }

var _ containerd.Image = fakeImage{}

func (i fakeImage) Name() string                        { return i.meta.Name }
func (i fakeImage) Target() ocispec.Descriptor          { return i.meta.Target }
func (i fakeImage) Labels() map[string]string           { return i.meta.Labels }
func (i fakeImage) Metadata() images.Image              { return i.meta }
func (i fakeImage) Size(context.Context) (int64, error) { return i.meta.Target.Size, nil }
func (i fakeImage) Usage(context.Context, ...containerd.UsageOpt) (int64, error) {
	return i.meta.Target.Size, nil
}
func (i fakeImage) IsUnpacked(context.Context, string) (bool, error)              { return true, nil }
func (i fakeImage) Unpack(context.Context, string, ...containerd.UnpackOpt) error { return nil }
func (i fakeImage) RootFS(context.Context) ([]digest.Digest, error)               { return nil, nil }
func (i fakeImage) Config(context.Context) (ocispec.Descriptor, error) {
	return ocispec.Descriptor{}, errNoContent
}
func (i fakeImage) ContentStore() content.Store                 { return nil }
func (i fakeImage) Platform() platforms.MatchComparer           { return platforms.Default() }
func (i fakeImage) Spec(context.Context) (ocispec.Image, error) { return ocispec.Image{}, nil }

var errNoContent = fmt.Errorf("a fake image has no content: %w", errdefs.ErrNotImplemented)
