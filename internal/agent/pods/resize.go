package pods

import (
	"context"
	"fmt"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
)

// resizeStatus is why a pod's resize is not done: PodResizePending
// (Deferred, Infeasible) or PodResizeInProgress (Error).
type resizeStatus struct {
	condition       corev1.PodConditionType
	reason, message string
}

// cpuMemory is what of a container's resources its cgroup carries, as
// its status reports them: cpu and memory requests and limits.
func cpuMemory(r corev1.ResourceRequirements) corev1.ResourceRequirements {
	pick := func(l corev1.ResourceList) corev1.ResourceList {
		var out corev1.ResourceList
		for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if q, ok := l[name]; ok {
				if out == nil {
					out = corev1.ResourceList{}
				}
				out[name] = q.DeepCopy()
			}
		}
		return out
	}
	return corev1.ResourceRequirements{Requests: pick(r.Requests), Limits: pick(r.Limits)}
}

// resizePod applies an in-place resize (pods/resize) to the pod's
// running containers and sidecars, as the kubelet does: only if the node has room
// for the new requests (otherwise PodResizePending, Deferred while other
// pods take the room, Infeasible when the node never has it); the new
// limits go into each container's cgroup, or, where the container's
// resize policy for a changed resource is RestartContainer, the
// container is stopped to start again (at once) with them. A cgroup the
// kernel will not change (a memory limit below what is in use) is
// PodResizeInProgress with the error, tried again shortly.
func (m *Manager) resizePod(ctx context.Context, pod *corev1.Pod, st *podState) {
	type change struct {
		cs   *containerState
		c    *corev1.Container
		want corev1.ResourceRequirements
	}
	var changes []change
	m.mu.Lock()
	for i := range pod.Spec.InitContainers {
		c, cs := &pod.Spec.InitContainers[i], st.init[i]
		want := cpuMemory(c.Resources)
		if sidecar(c) && cs.running && cs.applied != nil && !apiequality.Semantic.DeepEqual(*cs.applied, want) {
			changes = append(changes, change{cs, c, want})
		}
	}
	for i := range pod.Spec.Containers {
		c, cs := &pod.Spec.Containers[i], st.app[i]
		want := cpuMemory(c.Resources)
		if cs.running && cs.applied != nil && !apiequality.Semantic.DeepEqual(*cs.applied, want) {
			changes = append(changes, change{cs, c, want})
		}
	}
	if len(changes) == 0 {
		st.resize = nil
	}
	m.mu.Unlock()
	if len(changes) == 0 {
		return
	}
	if reason, message := m.resizeFits(pod); reason != "" {
		m.mu.Lock()
		st.resize = &resizeStatus{corev1.PodResizePending, reason, message}
		m.mu.Unlock()
		if reason == corev1.PodReasonDeferred {
			m.queue.AddAfter(st.key(), configRetry) // room may come as other pods go
		}
		return
	}
	for _, ch := range changes {
		m.mu.Lock()
		applied := *ch.cs.applied
		m.mu.Unlock()
		if restartOnResize(ch.c, applied, ch.want) {
			m.log.Info("container restarting to resize", "pod", st.key(), "container", ch.c.Name)
			m.mu.Lock()
			ch.cs.resizeRestart = true
			m.mu.Unlock()
			if err := m.stopContainer(ctx, st, ch.cs, time.Now().Add(graceOf(pod))); err != nil {
				m.failedResize(st, err)
				return
			}
			continue
		}
		if err := m.ctr.Update(m.ctx(ctx), ch.cs.id, linuxResources(ch.want)); err != nil {
			m.failedResize(st, err)
			return
		}
		m.mu.Lock()
		ch.cs.applied = &ch.want
		m.mu.Unlock()
	}
	m.mu.Lock()
	st.resize = nil
	m.mu.Unlock()
	m.event(pod, "", corev1.EventTypeNormal, "ResizeCompleted", "Pod resize completed")
}

func (m *Manager) failedResize(st *podState, err error) {
	m.log.Warn("resize failed", "pod", st.key(), "err", err)
	m.mu.Lock()
	st.resize = &resizeStatus{corev1.PodResizeInProgress, corev1.PodReasonError, err.Error()}
	m.mu.Unlock()
	m.queue.AddAfter(st.key(), configRetry)
}

// restartOnResize: a resource that changed is one c's resize policy
// restarts it for (NotRequired by default).
func restartOnResize(c *corev1.Container, applied, want corev1.ResourceRequirements) bool {
	for _, p := range c.ResizePolicy {
		if p.RestartPolicy != corev1.RestartContainer {
			continue
		}
		name := p.ResourceName
		if !apiequality.Semantic.DeepEqual(applied.Requests[name], want.Requests[name]) ||
			!apiequality.Semantic.DeepEqual(applied.Limits[name], want.Limits[name]) {
			return true
		}
	}
	return false
}

// resizeFits says why the node cannot give the pod its new requests,
// as the kubelet words it: Infeasible beyond the node's allocatable,
// Deferred beyond what its other pods leave.
func (m *Manager) resizeFits(pod *corev1.Pod) (reason, message string) {
	short := m.shortage(pod)
	switch {
	case short == nil:
		return "", ""
	case short.infeasible():
		return corev1.PodReasonInfeasible, fmt.Sprintf("Node didn't have enough capacity: %s, requested: %d, capacity: %d",
			short.name, quantity(short.name, short.want), quantity(short.name, short.capacity))
	}
	return corev1.PodReasonDeferred, short.message()
}

// linuxResources is a container's cgroup settings for its cpu and
// memory, as the kubelet sets them: the memory limit, CFS quota from
// the cpu limit, and cpu shares from the cpu request (2 when none, the
// kernel's minimum; the limit when only that is set).
func linuxResources(r corev1.ResourceRequirements) *specs.LinuxResources {
	res := &specs.LinuxResources{CPU: &specs.LinuxCPU{}}
	if mem, ok := r.Limits[corev1.ResourceMemory]; ok && !mem.IsZero() {
		limit := mem.Value()
		res.Memory = &specs.LinuxMemory{Limit: &limit}
	}
	shares := uint64(2)
	if cpu, ok := r.Requests[corev1.ResourceCPU]; ok {
		shares = max(uint64(cpu.MilliValue())*1024/1000, 2)
	} else if cpu, ok := r.Limits[corev1.ResourceCPU]; ok {
		shares = max(uint64(cpu.MilliValue())*1024/1000, 2)
	}
	res.CPU.Shares = &shares
	if cpu, ok := r.Limits[corev1.ResourceCPU]; ok && !cpu.IsZero() {
		quota, period := max(cpu.MilliValue()*cpuPeriod/1000, 1000), uint64(cpuPeriod)
		res.CPU.Quota, res.CPU.Period = &quota, &period
	}
	return res
}
