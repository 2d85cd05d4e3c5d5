package pods

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	orchctr "github.com/orch-dev/orch/internal/agent/containerd"

	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/orch-dev/orch/internal/agent/podnet"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cri-streaming/pkg/streaming/remotecommand"
	utilexec "k8s.io/utils/exec"
)

// Pod finds a pod this node runs, by namespace and name, for the kubelet
// API; ok is false when it has none by that name.
func (m *Manager) Pod(namespace, name string) (uid string, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, st := range m.running {
		if st.namespace == namespace && st.name == name {
			return string(st.uid), true
		}
	}
	return "", false
}

// ExecInContainer runs cmd in a running container of the pod with uid,
// wired to the caller's streams (and a terminal when tty), as `kubectl
// exec` asks; a non-zero exit is reported with its code.
func (m *Manager) ExecInContainer(ctx context.Context, name, uid, container string, cmd []string, in io.Reader, out, errOut io.WriteCloser,
	tty bool, resize <-chan remotecommand.TerminalSize, timeout time.Duration) error {
	m.mu.Lock()
	st := m.running[types.UID(uid)]
	var running bool
	id := ""
	if st != nil {
		for _, cs := range st.all() {
			if cs.name == container {
				running, id = cs.running, cs.id
			}
		}
	}
	m.mu.Unlock()
	if st == nil || !running {
		return fmt.Errorf("container %q of pod %q is not running", container, name)
	}
	cctx := m.ctx(ctx)
	task, pspec, err := m.processSpec(cctx, id, cmd, tty)
	if err != nil {
		return err
	}
	// When the caller's stdin ends, the process's must close too: the shim
	// only does that when told.
	var stdinDone chan struct{}
	if in != nil {
		stdinDone = make(chan struct{})
		in = &eofNotifier{r: in, eof: stdinDone}
	}
	opts := []cio.Opt{cio.WithStreams(in, out, errOut), cio.WithFIFODir(m.fifoDirUID(uid))}
	if tty {
		opts = append(opts, cio.WithTerminal)
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	code, err := m.execProcess(ctx, task, pspec, cio.NewCreator(opts...), stdinDone, resize)
	if err != nil {
		return err
	}
	if code != 0 {
		return utilexec.CodeExitError{Err: fmt.Errorf("command terminated with exit code %d", code), Code: int(code)}
	}
	return nil
}

// AttachContainer connects the caller's streams to a running container's
// own, as `kubectl attach` and `kubectl run -i` ask: its output from now
// on (one stream with a terminal), and its stdin when the container has
// one (stdin: true). It returns when the container exits or the caller
// goes away, or, as containerd's CRI attach does, when the caller's input
// ends; except for a stdinOnce container without a terminal, whose stdin
// is then closed for good and whose output is followed to its exit.
func (m *Manager) AttachContainer(ctx context.Context, name, uid, container string, in io.Reader, out, errOut io.WriteCloser,
	tty bool, resize <-chan remotecommand.TerminalSize) error {
	m.mu.Lock()
	var cs *containerState
	if st := m.running[types.UID(uid)]; st != nil {
		for _, c := range st.all() {
			if c.name == container && c.running {
				cs = c
			}
		}
	}
	var o *containerIO
	var spec *corev1.Container
	if cs != nil {
		o, _ = cs.io.(*containerIO)
		spec = cs.spec
	}
	m.mu.Unlock()
	if o == nil || spec == nil {
		return fmt.Errorf("container %q of pod %q is not running", container, name)
	}
	// What the session has no stream for is not sent (kubectl asks for no
	// stderr with a terminal, which has none).
	detach := o.attach(out, errOut)
	defer detach()
	inputEnded := make(chan struct{})
	if in != nil && spec.Stdin {
		closeStdin := spec.StdinOnce && !spec.TTY
		go func() {
			if err := o.input(ctx, in, closeStdin); err != nil && !errors.Is(err, errNoStdin) {
				m.log.Debug("attach input", "container", cs.id, "err", err)
			}
			if !closeStdin {
				close(inputEnded)
			}
		}()
	}
	if resize != nil && tty && spec.TTY {
		bg := m.ctx(context.WithoutCancel(ctx))
		task, err := m.ctr.Task(bg, cs.id, nil)
		if err != nil {
			return err
		}
		go func() {
			for size := range resize {
				if err := task.Resize(bg, uint32(size.Width), uint32(size.Height)); err != nil {
					return
				}
			}
		}()
	}
	exited := make(chan struct{})
	go func() { o.Wait(); close(exited) }()
	select {
	case <-exited:
	case <-inputEnded:
	case <-ctx.Done():
	}
	return nil
}

// execProcess runs pspec in task with the given IO and returns its exit
// code once it and its output are done; when ctx ends first, the process
// is killed and ctx's error returned. A closed stdinDone closes the
// process's stdin; resize resizes its terminal.
func (m *Manager) execProcess(ctx context.Context, task orchctr.Task, pspec *specs.Process, io cio.Creator,
	stdinDone <-chan struct{}, resize <-chan remotecommand.TerminalSize) (uint32, error) {
	proc, err := task.Exec(m.ctx(ctx), execID(), pspec, io)
	if err != nil {
		return 0, err
	}
	// The process is ours to delete: not with ctx, which may be done.
	bg := m.ctx(context.WithoutCancel(ctx))
	defer func() { _ = proc.Delete(bg) }()
	exited, err := proc.Wait(bg)
	if err != nil {
		return 0, err
	}
	if err := proc.Start(m.ctx(ctx)); err != nil {
		return 0, err
	}
	if stdinDone != nil {
		go func() {
			select {
			case <-stdinDone:
				_ = proc.CloseStdin(bg)
			case <-exited:
			}
		}()
	}
	if resize != nil {
		go func() {
			for size := range resize {
				if err := proc.Resize(bg, uint32(size.Width), uint32(size.Height)); err != nil && !errdefs.IsNotFound(err) {
					return
				}
			}
		}()
	}
	select {
	case status := <-exited:
		proc.IO().Wait()
		return status.ExitCode(), nil
	case <-ctx.Done():
		_ = proc.Kill(bg, unix.SIGKILL)
		<-exited
		return 0, ctx.Err()
	}
}

// eofNotifier closes eof when its reader ends.
type eofNotifier struct {
	r    io.Reader
	eof  chan struct{}
	once sync.Once
}

func (e *eofNotifier) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil {
		e.once.Do(func() { close(e.eof) })
	}
	return n, err
}

func (m *Manager) fifoDirUID(uid string) string {
	return filepath.Join(m.runDir(uid), "fifo")
}

// PortForward copies stream to and from port inside the pod's network
// namespace (so that what listens on the pod's localhost is reached too),
// as the CRI runtimes do for `kubectl port-forward`.
func (m *Manager) PortForward(ctx context.Context, name, uid string, port int32, stream io.ReadWriteCloser) error {
	defer func() { _ = stream.Close() }()
	m.mu.Lock()
	st := m.running[types.UID(uid)]
	m.mu.Unlock()
	if st == nil {
		return fmt.Errorf("pod %q is not running on this node", name)
	}
	var conn net.Conn
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port)))
	dial := func() error {
		var err error
		conn, err = (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, "tcp", addr)
		return err
	}
	var err error
	if st.hostNetwork {
		err = dial()
	} else {
		err = podnet.InNetNS(m.net.NSPath(uid), dial)
	}
	if err != nil {
		return fmt.Errorf("port-forward to %s in pod %q: %w", addr, name, err)
	}
	defer func() { _ = conn.Close() }()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(conn, stream); _ = conn.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
	go func() { _, _ = io.Copy(stream, conn); done <- struct{}{} }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	return nil
}

// DialPod connects to port at the address of a pod this node runs, from
// the node, as the pod network reaches it: what the API server uses when
// its own machine is not on the pod network.
func (m *Manager) DialPod(ctx context.Context, name, uid string, port int) (net.Conn, error) {
	m.mu.Lock()
	var ip string
	if st := m.running[types.UID(uid)]; st != nil {
		ip = st.ip
	}
	m.mu.Unlock()
	if ip == "" {
		return nil, fmt.Errorf("pod %q has no address on this node", name)
	}
	return (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, "tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
}
