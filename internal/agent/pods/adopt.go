package pods

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	"github.com/orch-dev/orch/internal/agent/logs"
	corev1 "k8s.io/api/core/v1"
)

// adopt takes over a pod whose containers already exist: started by an
// earlier run of the agent, they kept running in their shims. Nothing is
// restarted; a container that exited meanwhile is handled by the restart
// policy like any exit, and what the pod's status says carries over
// (restart counts, last states, finished init containers).
func (m *Manager) adopt(ctx context.Context, pod *corev1.Pod) (bool, error) {
	cctx := m.ctx(ctx)
	found, err := m.ctr.Containers(cctx, map[string]string{podUIDLabel: string(pod.UID)})
	if err != nil || len(found) == 0 {
		return false, err
	}
	if !pod.Spec.HostNetwork && !m.net.Alive(string(pod.UID)) {
		// The node restarted: its containers' processes and the pod's
		// network are gone. The pod starts again from scratch.
		m.log.Info("pod's sandbox is gone (the node restarted): starting it again", "pod", pod.Namespace+"/"+pod.Name)
		for _, c := range found {
			if err := m.removeContainer(ctx, &containerState{id: c.ID}); err != nil {
				return false, err
			}
		}
		return false, nil
	}
	st := newPodState(pod)
	st.ip = pod.Status.PodIP
	if pod.Spec.HostNetwork {
		st.ip = m.cfg.NodeIP
	} else if st.ip == "" {
		st.ip = m.net.CachedIP(string(pod.UID), pod.Namespace, pod.Name, st.ports)
	}
	if pod.Status.StartTime != nil {
		st.started = pod.Status.StartTime.Time
	}
	// Kept through the agent restart; made for pods an older agent ran.
	if err := m.setUpSharedNamespaces(pod); err != nil {
		return false, err
	}
	st.initialized = conditionTrue(pod, corev1.PodInitialized)
	type watch struct {
		cs     *containerState
		c      *corev1.Container
		exited <-chan containerd.ExitStatus
	}
	var watches []watch
	specs := append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...)
	for i := range pod.Spec.EphemeralContainers {
		specs = append(specs, *ephemeralSpec(&pod.Spec.EphemeralContainers[i]))
	}
	for i, cs := range st.all() {
		c := &specs[i]
		statuses := pod.Status.ContainerStatuses
		switch {
		case cs.init:
			statuses = pod.Status.InitContainerStatuses
		case cs.ephemeral:
			statuses = pod.Status.EphemeralContainerStatuses
		}
		var reported *corev1.ContainerStatus
		for j := range statuses {
			if statuses[j].Name == c.Name {
				reported = &statuses[j]
			}
		}
		if reported != nil {
			cs.restarts, cs.lastState, cs.image, cs.imageID = reported.RestartCount, reported.LastTerminationState, reported.Image, reported.ImageID
			cs.startedAt = st.started
			if reported.State.Running != nil {
				cs.startedAt = reported.State.Running.StartedAt.Time
			}
			if t := reported.State.Terminated; t != nil {
				cs.startedAt = t.StartedAt.Time
				cs.exit = &exit{code: t.ExitCode, at: t.FinishedAt.Time, oomKilled: t.Reason == "OOMKilled", message: t.Message}
			}
		}
		// Runs the server never heard of (restarts while it was unreachable,
		// then the agent restarted) are on disk: each run has its own log.
		if n := m.restartsOnDisk(string(pod.UID), c.Name); n > cs.restarts {
			cs.restarts = n
		}
		container, err := m.ctr.Container(cctx, cs.id)
		if errdefs.IsNotFound(err) {
			if cs.init && st.initialized {
				cs.exit = &exit{code: 0, at: time.Now()}
			} else if reported != nil && reported.ContainerID != "" && cs.exit == nil {
				cs.exit = &exit{code: 255, at: time.Now()} // gone: it starts again as the policy says
				cs.created = true
			}
			continue
		}
		if err != nil {
			return false, err
		}
		cs.created, cs.spec = true, c
		// What its cgroup has: what the status last said (an in-place
		// resize since its start), or its spec.
		applied := cpuMemory(c.Resources)
		if reported != nil && reported.Resources != nil {
			applied = cpuMemory(*reported.Resources)
		}
		cs.applied = &applied
		if cs.startedAt.IsZero() {
			cs.startedAt = container.CreatedAt
		}
		task, err := m.ctr.Task(cctx, cs.id, nil)
		if err != nil {
			if cs.exit == nil {
				cs.exit = &exit{code: 255, at: time.Now()}
			}
			continue
		}
		status, err := task.Status(cctx)
		if err != nil {
			return false, err
		}
		if status.Status == containerd.Stopped {
			if cs.exit == nil {
				cs.exit = &exit{code: int32(status.ExitStatus), at: status.ExitTime, oomKilled: oomKilled(cs.id)}
			}
			continue
		}
		// Its output goes on to the same log file, through the FIFOs the
		// shim still holds.
		// (A log directory removed by hand is made again: the container
		// is not lost for want of it.)
		logPath := m.logPath(string(pod.UID), c.Name, cs.restarts)
		if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
			return false, err
		}
		lw, err := logs.NewWriter(logPath, maxLogSize)
		if err != nil {
			return false, err
		}
		if task, err = m.ctr.Task(cctx, cs.id, reattachContainerIO(lw, streams{stdin: c.Stdin, tty: c.TTY})); err != nil {
			_ = lw.Close()
			return false, fmt.Errorf("reattach to %s's output: %w", cs.id, err)
		}
		cs.logs, cs.io = lw, task.IO()
		exited, err := task.Wait(cctx)
		if err != nil {
			return false, err
		}
		cs.exit, cs.running = nil, true
		// Probes start over; until they pass, the container is as its
		// status said.
		cs.ready = c.ReadinessProbe == nil || reported != nil && reported.Ready
		cs.startupDone = c.StartupProbe == nil || reported != nil && reported.Started != nil && *reported.Started
		watches = append(watches, watch{cs, c, exited})
	}
	if !st.initialized {
		st.initialized = true
		for i, cs := range st.init {
			st.initialized = st.initialized && cs.initDone(&pod.Spec.InitContainers[i])
		}
	}
	m.mu.Lock()
	m.running[pod.UID] = st
	m.mu.Unlock()
	for _, w := range watches {
		m.watchExit(ctx, pod, st, w.cs, w.c, w.exited)
		m.startProbes(ctx, pod, st, w.cs, w.c)
	}
	m.log.Info("pod adopted", "pod", st.key())
	m.queue.Add(st.key())
	return true, nil
}
