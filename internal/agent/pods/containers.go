package pods

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	orchctr "github.com/orch-dev/orch/internal/agent/containerd"
	"github.com/orch-dev/orch/internal/agent/volumes"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/orch-dev/orch/internal/agent/logs"
	corev1 "k8s.io/api/core/v1"
)

// reconcile moves a pod with a sandbox on: its next init container, then
// its containers, restarting exited ones as the restart policy says, its
// ephemeral containers whenever they are added, and reports its status.
func (m *Manager) reconcile(ctx context.Context, pod *corev1.Pod, st *podState) error {
	if err := m.refreshVolumes(ctx, pod, st); err != nil {
		var ce *configError
		if errors.As(err, &ce) {
			m.event(pod, "", corev1.EventTypeWarning, "FailedMount", "%s", ce.message)
		}
		return m.reportStatus(ctx, pod, st, err)
	}
	// Ephemeral containers start whatever the others do: debugging a pod
	// stuck in its init containers is what they are for.
	ephemeralErr := m.runEphemeral(ctx, pod, st)
	err := m.runContainers(ctx, pod, st)
	var ce *configError
	if err == nil || errors.As(err, &ce) && ephemeralErr != nil && !errors.As(ephemeralErr, &ce) {
		err = ephemeralErr
	}
	return m.reportStatus(ctx, pod, st, err)
}

// runContainers runs the pod's init containers in turn, then its
// containers, and returns what stopped it, if anything.
func (m *Manager) runContainers(ctx context.Context, pod *corev1.Pod, st *podState) error {
	m.mu.Lock()
	initialized := st.initialized
	m.mu.Unlock()
	if !initialized {
		for i := range pod.Spec.InitContainers {
			c, cs := &pod.Spec.InitContainers[i], st.init[i]
			m.mu.Lock()
			done, running, ex := cs.initDone(c), cs.running, cs.exit
			m.mu.Unlock()
			if done {
				continue
			}
			if running {
				return nil // running, or a sidecar still starting
			}
			if ex != nil && pod.Spec.RestartPolicy == corev1.RestartPolicyNever && !sidecar(c) {
				return nil // the pod has failed
			}
			// Init containers restart on failure whatever the policy
			// (Never aside), as in Kubernetes.
			return m.runContainer(ctx, pod, st, cs, c)
		}
		m.mu.Lock()
		st.initialized = true
		m.mu.Unlock()
	}
	m.resizePod(ctx, pod, st)
	var runErr error
	if err := m.keepSidecars(ctx, pod, st); err != nil {
		runErr = err
	}
	for i := range pod.Spec.Containers {
		c, cs := &pod.Spec.Containers[i], st.app[i]
		m.mu.Lock()
		created, ex, resizing := cs.created, cs.exit, cs.resizeRestart
		m.mu.Unlock()
		if created && (ex == nil || !restarts(pod.Spec.RestartPolicy, ex.code)) && !resizing {
			continue
		}
		if err := m.runContainer(ctx, pod, st, cs, c); err != nil {
			runErr = err
			var ce *configError
			if !errors.As(err, &ce) {
				break
			}
		}
	}
	return runErr
}

// runEphemeral starts the pod's ephemeral containers that have not run,
// once each, as the kubelet does: one that exits, or cannot start, is
// not started again; one still waiting (for its image, or for its
// target to run) is tried again. A pod that has finished starts none.
func (m *Manager) runEphemeral(ctx context.Context, pod *corev1.Pod, st *podState) error {
	if len(pod.Spec.EphemeralContainers) == 0 || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil
	}
	var firstErr error
	for i := range pod.Spec.EphemeralContainers {
		ec := &pod.Spec.EphemeralContainers[i]
		m.mu.Lock()
		cs := st.ephemeralState(pod, ec)
		ran := cs.created || cs.exit != nil
		m.mu.Unlock()
		if ran {
			continue
		}
		if err := m.runContainer(ctx, pod, st, cs, ephemeralSpec(ec)); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return firstErr
}

// keepSidecars restarts the pod's sidecars that exited, whatever the pod's
// restart policy, while its containers run; once they have all ended for
// good (a pod that does not restart them), the sidecars are stopped, as
// the kubelet stops them, so that the pod completes.
func (m *Manager) keepSidecars(ctx context.Context, pod *corev1.Pod, st *podState) error {
	m.mu.Lock()
	appsDone := len(st.app) > 0
	for _, cs := range st.app {
		appsDone = appsDone && cs.created && !cs.running && cs.exit != nil && !restarts(pod.Spec.RestartPolicy, cs.exit.code)
	}
	m.mu.Unlock()
	for i := range pod.Spec.InitContainers {
		c, cs := &pod.Spec.InitContainers[i], st.init[i]
		if !sidecar(c) {
			continue
		}
		m.mu.Lock()
		running, exited, stopping, resizing := cs.running, cs.exit != nil, cs.stopping, cs.resizeRestart
		if appsDone && running {
			cs.stopping = true
		}
		m.mu.Unlock()
		switch {
		case appsDone && running && !stopping:
			go m.kill(ctx, cs, graceOf(pod))
		case !appsDone && !running && (exited || resizing):
			if err := m.runContainer(ctx, pod, st, cs, c); err != nil {
				return err
			}
		}
	}
	if appsDone {
		// The kubelet ends what is left of a finished pod, a debugging
		// session in it too.
		m.mu.Lock()
		var left []*containerState
		for _, cs := range st.ephemeral {
			if cs.running && !cs.stopping {
				cs.stopping = true
				left = append(left, cs)
			}
		}
		m.mu.Unlock()
		for _, cs := range left {
			go m.kill(ctx, cs, graceOf(pod))
		}
	}
	return nil
}

// provisionalRetry is how soon volumes set up offline without their
// service-account token are made again.
const provisionalRetry = 5 * time.Second

// refreshVolumes sets up the pod's volumes the first time and brings the
// API-projected ones up to date once a minute (every few seconds while a
// token is still to come).
func (m *Manager) refreshVolumes(ctx context.Context, pod *corev1.Pod, st *podState) error {
	m.mu.Lock()
	left := apiVolumeResync - time.Since(st.volumesAt)
	due := st.volumes == nil || left <= 0
	m.mu.Unlock()
	if !due {
		// The wake-up asked when they were set up may have been taken
		// over by a sooner one (a failed sync's retry): ask it again, or
		// a token still to come would wait for some other change.
		m.queue.AddAfter(st.key(), left)
		return nil
	}
	src := m.sources(pod.Namespace)
	vols, err := volumes.SetUp(ctx, m.volumesDir(string(pod.UID)), src, downwardAPI{m}, pod)
	if err != nil {
		return fromVolumes(err)
	}
	next := apiVolumeResync
	if src.provisional {
		next = provisionalRetry // its token is still to come
	}
	m.mu.Lock()
	st.volumes, st.volumesAt = vols, time.Now().Add(next-apiVolumeResync)
	m.mu.Unlock()
	m.queue.AddAfter(st.key(), next)
	return nil
}

// runContainer starts a container: the first time, or again after an exit
// once its back-off has passed. A restart is a new container from the
// image, as in Kubernetes: what the last run wrote to its root
// filesystem is gone.
func (m *Manager) runContainer(ctx context.Context, pod *corev1.Pod, st *podState, cs *containerState, c *corev1.Container) (err error) {
	defer func() {
		var ce *configError
		m.mu.Lock()
		if errors.As(err, &ce) {
			cs.waiting = ce
		} else if err == nil {
			cs.waiting = nil
		}
		m.mu.Unlock()
		switch {
		case errors.As(err, &ce) && (ce.reason == "CreateContainerConfigError" || ce.reason == "CreateContainerError"):
			m.event(pod, c.Name, corev1.EventTypeWarning, "Failed", "Error: %s", ce.message)
		case err != nil && ce == nil && ctx.Err() == nil:
			m.event(pod, c.Name, corev1.EventTypeWarning, "Failed", "Error: %v", err)
		}
	}()
	m.mu.Lock()
	ex, created := cs.exit, cs.created
	wait := time.Duration(0)
	if ex != nil && !cs.resizeRestart { // a restart to resize is no crash to back off from
		wait = time.Until(ex.at.Add(restartDelay(cs)))
	}
	cs.resizeRestart = false
	m.mu.Unlock()
	if wait > 0 {
		m.event(pod, c.Name, corev1.EventTypeWarning, "BackOff", "Back-off restarting failed container %s in pod %s_%s(%s)", c.Name, pod.Name, pod.Namespace, pod.UID)
		m.queue.AddAfter(st.key(), wait)
		return nil
	}
	cctx := m.ctx(ctx)
	if created {
		if err := m.removeContainer(ctx, cs); err != nil {
			return err
		}
		m.mu.Lock()
		cs.created = false
		cs.lastState = corev1.ContainerState{Terminated: terminated(ex, cs.startedAt)}
		cs.restarts++
		m.mu.Unlock()
		m.log.Info("container restarting", "pod", st.key(), "container", c.Name, "exitCode", ex.code, "restarts", cs.restarts)
	}
	// The first run uses the image the pod's start resolved (and maybe
	// pulled); a restart asks again, as the pull policy says.
	m.mu.Lock()
	img := st.images[c.Name]
	delete(st.images, c.Name)
	m.mu.Unlock()
	ref, _ := imageRef(c.Image)
	if img == nil {
		var err error
		if img, ref, err = m.image(ctx, pod, *c); err != nil {
			return err
		}
	}
	env, err := m.environment(ctx, m.sources(pod.Namespace), pod, c)
	if err != nil {
		return err
	}
	m.mu.Lock()
	vols := st.volumes
	restart := cs.restarts
	m.mu.Unlock()
	opts, err := m.containerSpec(pod, c, img, m.net.NSPath(string(pod.UID)), env, vols)
	if err != nil {
		return err
	}
	if cs.target != "" && !pod.Spec.HostPID {
		// kubectl debug --target: the ephemeral container sees the
		// target's processes, as containerd's CRI runs it.
		ns, err := m.targetPIDNamespace(cctx, st, cs.target)
		if err != nil {
			return err
		}
		opts = append(opts, oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.PIDNamespace, Path: ns}))
	}
	// Its files first: a failure here leaves no container behind to be
	// taken for one that ran and exited (and counted as a restart at
	// each try).
	logPath, terminationLog := m.logPath(string(pod.UID), c.Name, restart), m.terminationLog(pod, c.Name)
	for _, dir := range []string{filepath.Dir(logPath), filepath.Dir(terminationLog)} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	if err := os.WriteFile(terminationLog, nil, 0o666); err != nil {
		return err
	}
	// Writable by whatever user the container runs as, whatever the
	// agent's umask, as the kubelet makes it.
	if err := os.Chmod(terminationLog, 0o666); err != nil {
		return err
	}
	lw, err := logs.NewWriter(logPath, maxLogSize)
	if err != nil {
		return err
	}
	if err := m.ctr.Create(cctx, cs.id, img, opts, map[string]string{podUIDLabel: string(pod.UID)}); err != nil {
		_ = lw.Close()
		var ce *configError
		if errors.As(err, &ce) {
			return ce
		}
		if ctx.Err() != nil {
			return err
		}
		// As the kubelet: the container waits, saying why, and is tried
		// again.
		return &configError{reason: "CreateContainerError", message: err.Error(), cause: err}
	}
	applied := cpuMemory(c.Resources)
	m.mu.Lock()
	cs.created, cs.image, cs.imageID, cs.spec, cs.applied = true, ref, imageID(ref, img), c, &applied
	m.mu.Unlock()
	task, err := m.ctr.NewTask(cctx, cs.id, newContainerIO(m.fifoDir(pod), lw, streams{stdin: c.Stdin, tty: c.TTY}))
	if err != nil {
		_ = lw.Close()
		if ctx.Err() != nil {
			return fmt.Errorf("container %s task: %w", c.Name, err)
		}
		return m.startFailed(pod, st, cs, c, fmt.Errorf("failed to create containerd task: %w", err))
	}
	m.mu.Lock()
	cs.logs, cs.io = lw, task.IO()
	m.mu.Unlock()
	m.event(pod, c.Name, corev1.EventTypeNormal, "Created", "Created container: %s", c.Name)
	exited, err := task.Wait(cctx)
	if err != nil {
		return err
	}
	if err := task.Start(cctx); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("start container %s: %w", c.Name, err)
		}
		return m.startFailed(pod, st, cs, c, fmt.Errorf("failed to start containerd task: %w", err))
	}
	m.event(pod, c.Name, corev1.EventTypeNormal, "Started", "Started container %s", c.Name)
	m.mu.Lock()
	cs.exit, cs.running, cs.startedAt = nil, true, time.Now()
	cs.ready, cs.startupDone = c.ReadinessProbe == nil, c.StartupProbe == nil
	m.mu.Unlock()
	m.watchExit(ctx, pod, st, cs, c, exited)
	if c.Lifecycle != nil && c.Lifecycle.PostStart != nil {
		if err := m.runHandler(ctx, pod, st, c, c.Lifecycle.PostStart, graceOf(pod)); err != nil {
			m.log.Warn("postStart hook failed: killing the container", "pod", st.key(), "container", c.Name, "err", err)
			m.event(pod, c.Name, corev1.EventTypeWarning, "FailedPostStartHook", "PostStartHook failed: %v", err)
			go m.kill(ctx, cs, graceOf(pod))
			return nil
		}
	}
	m.startProbes(ctx, pod, st, cs, c)
	return nil
}

// targetPIDNamespace is the process namespace of the pod's running
// container named target; a target not running (yet) is a container
// that waits, tried again.
func (m *Manager) targetPIDNamespace(ctx context.Context, st *podState, target string) (string, error) {
	m.mu.Lock()
	id := ""
	for _, cs := range append(st.init[:len(st.init):len(st.init)], st.app...) {
		if cs.name == target && cs.running {
			id = cs.id
		}
	}
	m.mu.Unlock()
	notRunning := &configError{reason: "CreateContainerError", message: fmt.Sprintf("target container %q is not running", target)}
	if id == "" {
		return "", notRunning
	}
	task, err := m.ctr.Task(ctx, id, nil)
	if errdefs.IsNotFound(err) || err == nil && task.Pid() == 0 {
		return "", notRunning
	}
	if err != nil {
		return "", fmt.Errorf("target container %s: %w", target, err)
	}
	return fmt.Sprintf("/proc/%d/ns/pid", task.Pid()), nil
}

// startFailed records a container whose process could not be started (a
// missing binary, an exec format error, a bad mount) as the kubelet does:
// terminated with reason StartError, exit code 128 and runc's message, a
// Warning event; it is restarted as its restart policy says, with the
// crash-loop back-off, so a Job's pod fails and counts against its
// backoffLimit.
func (m *Manager) startFailed(pod *corev1.Pod, st *podState, cs *containerState, c *corev1.Container, err error) error {
	m.log.Warn("container could not start", "pod", st.key(), "container", c.Name, "err", err)
	m.event(pod, c.Name, corev1.EventTypeWarning, "Failed", "Error: %v", err)
	m.mu.Lock()
	cs.exit = &exit{code: startErrorCode, at: time.Now(), reason: "StartError", message: err.Error()}
	cs.running, cs.startedAt = false, time.Time{}
	m.mu.Unlock()
	m.queue.Add(st.key())
	return nil
}

// startErrorCode is the exit code the kubelet reports for StartError.
const startErrorCode = 128

// imageID is the image's repo digest, as the kubelet reports it.
func imageID(ref string, img containerd.Image) string {
	name, _, _ := strings.Cut(ref, "@")
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		name = name[:i]
	}
	return name + "@" + img.Target().Digest.String()
}

// watchExit records the container's exit (and whether the kernel killed
// it for memory, and its termination message) and syncs its pod again.
func (m *Manager) watchExit(ctx context.Context, pod *corev1.Pod, st *podState, cs *containerState, c *corev1.Container, exited <-chan containerd.ExitStatus) {
	terminationLog := m.terminationLog(pod, c.Name)
	fallback := c.TerminationMessagePolicy == corev1.TerminationMessageFallbackToLogsOnError
	m.mu.Lock()
	logPath := m.logPath(string(pod.UID), c.Name, cs.restarts)
	m.mu.Unlock()
	go func() {
		status, ok := m.waitExit(ctx, st, cs, c, exited)
		if !ok {
			return
		}
		m.mu.Lock()
		output := cs.io
		m.mu.Unlock()
		if output != nil {
			// The last output is read before the exit is reported.
			drained := make(chan struct{})
			go func() { output.Wait(); close(drained) }()
			select {
			case <-drained:
			case <-time.After(time.Second):
			}
		}
		ex := &exit{code: int32(status.ExitCode()), at: status.ExitTime(), oomKilled: oomKilled(cs.id)}
		ex.message = terminationMessage(terminationLog, logPath, fallback && ex.code != 0)
		m.mu.Lock()
		cs.exit, cs.running = ex, false
		if cs.stopProbes != nil {
			cs.stopProbes()
			cs.stopProbes = nil
		}
		m.mu.Unlock()
		m.queue.Add(st.key())
	}()
}

// waitExit is the container's exit. A wait cut by containerd going away
// (it is restarted; the container runs on in its shim) is not an exit:
// the wait is taken up again once containerd is back, or the exit the
// container had meanwhile is taken. ok is false when ctx ends first.
func (m *Manager) waitExit(ctx context.Context, st *podState, cs *containerState, c *corev1.Container, exited <-chan containerd.ExitStatus) (containerd.ExitStatus, bool) {
	for {
		var status containerd.ExitStatus
		select {
		case status = <-exited:
		case <-ctx.Done():
			return status, false
		}
		if status.Error() == nil {
			return status, true
		}
		m.log.Warn("lost the wait on a container: waiting again", "pod", st.key(), "container", c.Name, "err", status.Error())
		next, ex := m.rewait(ctx, cs)
		switch {
		case next != nil:
			exited = next
		case ex != nil:
			return *containerd.NewExitStatus(uint32(ex.code), ex.at, nil), true
		default:
			return status, false
		}
	}
}

// rewait re-attaches to a container's task once containerd is back: a new
// wait while the task runs, or the exit it had while containerd was down
// (its shim kept it). Both are nil when ctx ends.
func (m *Manager) rewait(ctx context.Context, cs *containerState) (<-chan containerd.ExitStatus, *exit) {
	backoff := 200 * time.Millisecond
	for {
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
		cctx := m.ctx(ctx)
		task, err := m.ctr.Task(cctx, cs.id, nil)
		if errdefs.IsNotFound(err) { // the container or its task is gone, and its exit with it
			return nil, &exit{code: 255, at: time.Now()}
		} else if err != nil {
			continue
		}
		status, err := task.Status(cctx)
		if err != nil {
			continue
		}
		if status.Status == containerd.Stopped {
			return nil, &exit{code: int32(status.ExitStatus), at: status.ExitTime}
		}
		exited, err := task.Wait(cctx)
		if err != nil {
			continue
		}
		return exited, nil
	}
}

// oomKilled reports whether the kernel's OOM killer ended a process of
// the container, from its cgroup (which lives until the task is deleted);
// containerd puts it at /<namespace>/<id>.
func oomKilled(id string) bool {
	for _, path := range []string{
		filepath.Join("/sys/fs/cgroup", "orch", id, "memory.events"),             // cgroup v2
		filepath.Join("/sys/fs/cgroup/memory", "orch", id, "memory.oom_control"), // cgroup v1
	} {
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
				n, _ := strconv.Atoi(strings.TrimSpace(v))
				return n > 0
			}
		}
	}
	return false
}

// terminationMessage is what the container wrote to its termination log
// (at most 4 KiB), or with FallbackToLogsOnError the tail of its output.
func terminationMessage(terminationLog, logPath string, fallback bool) string {
	data, _ := os.ReadFile(terminationLog)
	if len(data) > 4096 {
		data = data[:4096]
	}
	if len(data) > 0 || !fallback {
		return string(data)
	}
	var out bytes.Buffer
	_ = logs.Read(context.Background(), logPath, logs.Options{Tail: 80}, &out, func() bool { return false })
	msg := bytes.TrimRight(out.Bytes(), "\n")
	if len(msg) > 2048 {
		msg = msg[len(msg)-2048:]
	}
	return string(msg)
}

// crashBackoff is the kubelet's restart delay after a container's
// restarts: none before the first restart, then 10 s doubling to five
// minutes.
func crashBackoff(restarts int32) time.Duration {
	if restarts <= 0 {
		return 0
	}
	return min(10*time.Second<<min(restarts-1, 5), 5*time.Minute)
}

// restartDelay is how long after its exit a container starts again; a run
// that lasted ten minutes resets the back-off, as the kubelet's does (one
// that never started, a StartError, did not run at all). The caller
// holds m.mu.
func restartDelay(cs *containerState) time.Duration {
	if !cs.startedAt.IsZero() && cs.exit.at.Sub(cs.startedAt) >= 10*time.Minute {
		return 0
	}
	return crashBackoff(cs.restarts)
}

// restarts reports whether a container that exited with code starts again.
func restarts(policy corev1.RestartPolicy, code int32) bool {
	return policy == corev1.RestartPolicyAlways || policy == "" || policy == corev1.RestartPolicyOnFailure && code != 0
}

// removeContainer deletes a container, its task and its snapshot, and
// closes its output once drained.
func (m *Manager) removeContainer(ctx context.Context, cs *containerState) error {
	if err := m.ctr.Remove(m.ctx(ctx), cs.id); err != nil {
		return err
	}
	m.mu.Lock()
	output, lw := cs.io, cs.logs
	cs.io, cs.logs = nil, nil
	m.mu.Unlock()
	closeOutput(output, lw)
	return nil
}

// closeOutput waits (briefly) for the copying of a finished container's
// output to end, then closes its FIFOs and log file.
func closeOutput(output cio.IO, lw *logs.Writer) {
	if output != nil {
		drained := make(chan struct{})
		go func() { output.Wait(); close(drained) }()
		select {
		case <-drained:
		case <-time.After(2 * time.Second):
			output.Cancel()
		}
		_ = output.Close()
	}
	if lw != nil {
		_ = lw.Close()
	}
}

// maxLogSize is where a container's log file rotates (the kubelet's
// containerLogMaxSize); one older file is kept.
const maxLogSize = 10 << 20

// fifoDir holds the FIFOs through which the agent reads a pod's output.
func (m *Manager) fifoDir(pod *corev1.Pod) string { return m.fifoDirUID(string(pod.UID)) }

// kill stops a container's process: SIGTERM, then SIGKILL after grace.
func (m *Manager) kill(ctx context.Context, cs *containerState, grace time.Duration) {
	cctx := m.ctx(ctx)
	task, err := m.ctr.Task(cctx, cs.id, nil)
	if err != nil {
		return
	}
	if _, err := signalTask(cctx, task, time.Now().Add(grace)); err != nil {
		m.log.Warn("stopping container", "container", cs.id, "err", err)
	}
}

// stopContainer runs the container's preStop hook, stops its process by
// the deadline and removes it.
func (m *Manager) stopContainer(ctx context.Context, st *podState, cs *containerState, deadline time.Time) error {
	m.mu.Lock()
	running, spec, pod := cs.running, cs.spec, st.pod
	m.mu.Unlock()
	if running {
		m.event(pod, cs.name, corev1.EventTypeNormal, "Killing", "Stopping container %s", cs.name)
	}
	if running && spec != nil && spec.Lifecycle != nil && spec.Lifecycle.PreStop != nil && pod != nil {
		hctx, cancel := context.WithDeadline(ctx, deadline)
		if err := m.runHandler(hctx, pod, st, spec, spec.Lifecycle.PreStop, time.Until(deadline)); err != nil {
			m.log.Warn("preStop hook failed", "pod", st.key(), "container", cs.name, "err", err)
		}
		cancel()
	}
	if task, err := m.ctr.Task(m.ctx(ctx), cs.id, nil); err == nil {
		status, err := signalTask(m.ctx(ctx), task, deadline)
		if err != nil {
			return err
		}
		m.mu.Lock()
		if cs.exit == nil || cs.running {
			// The exit its watch may not have recorded yet: what a node
			// stopping the pod for itself reports.
			cs.exit, cs.running = &exit{code: int32(status.ExitCode()), at: status.ExitTime(), oomKilled: oomKilled(cs.id)}, false
		}
		m.mu.Unlock()
	} else if !errdefs.IsNotFound(err) {
		return err
	}
	return m.removeContainer(ctx, cs)
}

// signalTask sends SIGTERM and, if the process is still there at the
// deadline, SIGKILL; it returns the process's exit once it is gone.
func signalTask(ctx context.Context, task orchctr.Task, deadline time.Time) (containerd.ExitStatus, error) {
	exited, err := task.Wait(ctx)
	if err != nil {
		return containerd.ExitStatus{}, err
	}
	if st, err := task.Status(ctx); err == nil && st.Status == containerd.Stopped {
		return *containerd.NewExitStatus(st.ExitStatus, st.ExitTime, nil), nil
	}
	if err := task.Kill(ctx, syscall.SIGTERM); err != nil && !errdefs.IsNotFound(err) {
		return containerd.ExitStatus{}, err
	}
	select {
	case status := <-exited:
		return status, nil
	case <-time.After(time.Until(deadline)):
		if err := task.Kill(ctx, syscall.SIGKILL); err != nil && !errdefs.IsNotFound(err) {
			return containerd.ExitStatus{}, err
		}
		return <-exited, nil
	}
}

// LogRequest names a container's log and how to read it.
type LogRequest struct {
	Namespace, Pod, Container string
	// Previous reads the run before the current one.
	Previous bool
	logs.Options
}

// ContainerLog writes a container's log to out as kubectl logs shows it.
// Errors a user can act on are *LogError.
func (m *Manager) ContainerLog(ctx context.Context, req LogRequest, out io.Writer) error {
	m.mu.Lock()
	var st *podState
	for _, s := range m.running {
		if s.namespace == req.Namespace && s.name == req.Pod {
			st = s
		}
	}
	if st == nil {
		m.mu.Unlock()
		return m.notStarted(req)
	}
	var cs *containerState
	for _, c := range st.all() {
		if c.name == req.Container {
			cs = c
		}
	}
	if cs == nil {
		m.mu.Unlock()
		return &LogError{fmt.Sprintf("container %s is not valid for pod %s", req.Container, req.Pod)}
	}
	restart := cs.restarts
	if !cs.created && cs.restarts == 0 {
		m.mu.Unlock()
		reason := "ContainerCreating"
		if cs.waiting != nil {
			reason = cs.waiting.reason
		}
		return &LogError{fmt.Sprintf("container %q in pod %q is waiting to start: %s", req.Container, req.Pod, reason)}
	}
	if req.Previous {
		if cs.restarts == 0 {
			m.mu.Unlock()
			return &LogError{fmt.Sprintf("previous terminated container %q in pod %q not found", req.Container, req.Pod)}
		}
		restart--
	}
	m.mu.Unlock()
	running := func() bool {
		if req.Previous {
			return false
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		return cs.running && cs.restarts == restart
	}
	return logs.Read(ctx, m.logPath(string(st.uid), req.Container, restart), req.Options, out, running)
}

// notStarted says why a pod the manager has not started has no logs.
func (m *Manager) notStarted(req LogRequest) error {
	obj, exists, _ := m.pods.GetIndexer().GetByKey(req.Namespace + "/" + req.Pod)
	if !exists {
		return &LogError{fmt.Sprintf("pod %q in namespace %q is not running on this node", req.Pod, req.Namespace)}
	}
	reason := "ContainerCreating"
	for _, s := range obj.(*corev1.Pod).Status.ContainerStatuses {
		if s.Name == req.Container && s.State.Waiting != nil {
			reason = s.State.Waiting.Reason
		}
	}
	return &LogError{fmt.Sprintf("container %q in pod %q is waiting to start: %s", req.Container, req.Pod, reason)}
}

// LogError is a log request that cannot be served as asked.
type LogError struct{ Message string }

func (e *LogError) Error() string { return e.Message }
