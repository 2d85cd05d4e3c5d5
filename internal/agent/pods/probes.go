package pods

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	orchctr "github.com/orch-dev/orch/internal/agent/containerd"
	"github.com/orch-dev/orch/internal/agent/probe"

	"github.com/containerd/containerd/cio"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	corev1 "k8s.io/api/core/v1"
)

// startProbes runs a started container's probes until it exits: the
// startup probe first, then liveness and readiness, with Kubernetes'
// timing fields and thresholds.
func (m *Manager) startProbes(ctx context.Context, pod *corev1.Pod, st *podState, cs *containerState, c *corev1.Container) {
	if c.StartupProbe == nil && c.LivenessProbe == nil && c.ReadinessProbe == nil {
		return
	}
	pctx, cancel := context.WithCancel(ctx)
	m.mu.Lock()
	if cs.stopProbes != nil {
		cs.stopProbes()
	}
	cs.stopProbes = cancel
	m.mu.Unlock()
	restart := func(which string) {
		m.log.Info("container failed its "+which+" probe: restarting it", "pod", st.key(), "container", c.Name)
		m.event(pod, c.Name, corev1.EventTypeNormal, "Killing", "Container %s failed %s probe, will be restarted", c.Name, which)
		grace := graceOf(pod)
		for _, p := range []*corev1.Probe{c.StartupProbe, c.LivenessProbe} {
			if p != nil && p.TerminationGracePeriodSeconds != nil {
				grace = time.Duration(*p.TerminationGracePeriodSeconds) * time.Second
			}
		}
		cancel()
		m.kill(ctx, cs, grace)
	}
	m.mu.Lock()
	startupDone := cs.startupDone
	m.mu.Unlock()
	go func() {
		if c.StartupProbe != nil && !startupDone {
			started := make(chan bool, 1)
			m.probeLoop(pctx, pod, st, c, "Startup", c.StartupProbe, func(ok bool) bool {
				started <- ok
				return true
			})
			select {
			case ok := <-started:
				if !ok {
					restart("startup")
					return
				}
			default:
				return // stopped
			}
			m.mu.Lock()
			cs.startupDone = true
			m.mu.Unlock()
			m.queue.Add(st.key())
		}
		if c.ReadinessProbe != nil {
			go m.probeLoop(pctx, pod, st, c, "Readiness", c.ReadinessProbe, func(ok bool) bool {
				m.mu.Lock()
				changed := cs.ready != ok
				cs.ready = ok
				m.mu.Unlock()
				if changed {
					m.queue.Add(st.key())
				}
				return false
			})
		}
		if c.LivenessProbe != nil {
			m.probeLoop(pctx, pod, st, c, "Liveness", c.LivenessProbe, func(ok bool) bool {
				if !ok {
					restart("liveness")
				}
				return !ok
			})
		}
	}()
}

// probeLoop runs probe p (of the kind: Startup, Liveness, Readiness) of
// the container with probe.Loop, recording each failure as an Unhealthy
// event, as the kubelet does.
func (m *Manager) probeLoop(ctx context.Context, pod *corev1.Pod, st *podState, c *corev1.Container, kind string, p *corev1.Probe, result func(ok bool) (done bool)) {
	check := func(ctx context.Context, timeout time.Duration) error {
		return probe.Check(ctx, p.ProbeHandler, m.probeTarget(pod, st, c), timeout)
	}
	failed := func(err error) {
		m.log.Debug("probe failed", "pod", st.key(), "container", c.Name, "err", err)
		m.event(pod, c.Name, corev1.EventTypeWarning, "Unhealthy", "%s probe failed: %v", kind, err)
	}
	probe.Loop(ctx, m.cfg.Clock, p, check, failed, result)
}

// probeTarget is the container as probes and hooks reach it.
func (m *Manager) probeTarget(pod *corev1.Pod, st *podState, c *corev1.Container) probe.Target {
	id := containerID(pod, c.Name)
	return probe.Target{IP: m.podIP(st), Container: c, Exec: func(ctx context.Context, command []string) error {
		return m.execIn(ctx, string(pod.UID), id, command)
	}}
}

// runHandler runs a lifecycle hook (postStart, preStop).
func (m *Manager) runHandler(ctx context.Context, pod *corev1.Pod, st *podState, c *corev1.Container, h *corev1.LifecycleHandler, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	switch {
	case h.Exec != nil || h.HTTPGet != nil:
		return probe.Action(ctx, h.Exec, h.HTTPGet, m.probeTarget(pod, st, c))
	case h.Sleep != nil:
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(h.Sleep.Seconds) * time.Second):
		}
		return nil
	}
	return errors.New("lifecycle hook has no handler")
}

func (m *Manager) podIP(st *podState) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return st.ip
}

// execIn runs command in the container (as its process runs: same user,
// env and working directory) and fails unless it exits 0 before ctx ends.
//
// The command's output is read, as the kubelet reads it (a command that
// writes, `cat /tmp/healthy`, must not fail for want of a stdout), and
// its first kilobytes are the failure's message.
func (m *Manager) execIn(ctx context.Context, uid, id string, command []string) error {
	cctx := m.ctx(ctx)
	task, pspec, err := m.processSpec(cctx, id, command, false)
	if err != nil {
		return err
	}
	out := &limitedBuffer{max: maxProbeOutput}
	code, err := m.execProcess(ctx, task, pspec, cio.NewCreator(cio.WithStreams(nil, out, out), cio.WithFIFODir(m.fifoDirUID(uid))), nil, nil)
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("command %q timed out", strings.Join(command, " "))
	case err != nil:
		return err
	case code != 0:
		if said := strings.TrimSpace(out.String()); said != "" {
			return fmt.Errorf("command %q exited with %d: %s", strings.Join(command, " "), code, said)
		}
		return fmt.Errorf("command %q exited with %d", strings.Join(command, " "), code)
	}
	return nil
}

// maxProbeOutput is how much of an exec probe's or hook's output is kept
// (the kubelet keeps 10 KiB).
const maxProbeOutput = 10 << 10

// limitedBuffer keeps the first max bytes written to it and takes the
// rest without keeping it, so that the writer never blocks.
type limitedBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - len(b.buf); room > 0 {
		b.buf = append(b.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (b *limitedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// processSpec is a process for the running container id as its own
// process runs (user, env, working directory), running command.
func (m *Manager) processSpec(cctx context.Context, id string, command []string, tty bool) (orchctr.Task, *specs.Process, error) {
	spec, err := m.ctr.Spec(cctx, id)
	if err != nil {
		return nil, nil, err
	}
	task, err := m.ctr.Task(cctx, id, nil)
	if err != nil {
		return nil, nil, err
	}
	pspec := *spec.Process
	pspec.Args, pspec.Terminal = command, tty
	return task, &pspec, nil
}

// execID names an exec'd process.
func execID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "exec-" + hex.EncodeToString(b[:])
}
