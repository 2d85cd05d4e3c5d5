package pods

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clientretry "k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
)

// Eviction is when the node gives up pods to keep itself alive, as the
// kubelet's hard eviction thresholds do (memory.available<100Mi,
// nodefs.available<10%, nodefs.inodesFree<5%): on a 512 MB board with an
// SD card the alternative is the kernel's OOM killer choosing, the agent
// thrashing, or a full disk failing every write on the node. Pods over
// their own ephemeral-storage limits are evicted whatever the node has
// left.
type Eviction struct {
	// MemoryAvailableMin is the memory threshold (100 MiB).
	MemoryAvailableMin int64
	// MemoryAvailable reads the node's available memory; nil evicts
	// nothing for memory.
	MemoryAvailable func() (int64, error)
	// NodeFSAvailableMin and NodeFSInodesFreeMin are the thresholds of
	// the filesystem holding the data dir, as fractions of its size and
	// inodes (0.10 and 0.05).
	NodeFSAvailableMin, NodeFSInodesFreeMin float64
	// NodeFS reads that filesystem; nil evicts nothing for disk.
	NodeFS func() (Filesystem, error)
	// Every is how often the node is checked (10 s, the kubelet's
	// housekeeping interval).
	Every time.Duration
}

// Filesystem is what a filesystem has and has left, in bytes and inodes.
type Filesystem struct {
	Size, Available, Inodes, InodesFree int64
}

func (e Eviction) withDefaults() Eviction {
	if e.MemoryAvailableMin == 0 {
		e.MemoryAvailableMin = 100 << 20
	}
	if e.NodeFSAvailableMin == 0 {
		e.NodeFSAvailableMin = 0.10
	}
	if e.NodeFSInodesFreeMin == 0 {
		e.NodeFSInodesFreeMin = 0.05
	}
	if e.Every == 0 {
		e.Every = 10 * time.Second
	}
	return e
}

// evictionGrace is how long an evicted pod's containers get: the
// kubelet's for hard thresholds.
const evictionGrace = time.Second

// evictEvery checks the node every Eviction.Every until ctx ends. Like
// the kubelet, it first evicts the pods over their own storage limits;
// otherwise, under a threshold, it reclaims what the node can (unused
// images, for the disk) and evicts one pod per check while still under.
func (m *Manager) evictEvery(ctx context.Context) {
	t := time.NewTicker(m.cfg.Eviction.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := m.evictOnce(ctx); err != nil && ctx.Err() == nil {
			m.log.Warn("eviction", "err", err)
		}
	}
}

func (m *Manager) evictOnce(ctx context.Context) error {
	if m.evictOverStorageLimits(ctx) {
		return nil
	}
	e := m.cfg.Eviction
	if e.MemoryAvailable != nil {
		if available, err := e.MemoryAvailable(); err == nil && available < e.MemoryAvailableMin {
			m.reclaiming(corev1.ResourceMemory)
			m.evictForMemory(available)
			return nil
		}
	}
	if e.NodeFS != nil {
		return m.evictForDisk(ctx)
	}
	return nil
}

// podUsage is a pod's memory working set against its requests.
type podUsage struct {
	st                *podState
	pod               *corev1.Pod
	usage, requests   int64
	priority          int32
	hungriest         string
	hungriestUsage    int64
	hungriestRequests int64
}

// evictForMemory evicts the pod the kubelet would pick first: one using
// more memory than it requested before one that does not, then the lower
// priority, then the one furthest over its requests.
func (m *Manager) evictForMemory(available int64) {
	m.mu.Lock()
	var candidates []podUsage
	for _, st := range m.running {
		if st.pod == nil || st.evicted {
			continue
		}
		u := podUsage{st: st, pod: st.pod, priority: ptr.Deref(st.pod.Spec.Priority, 0)}
		for _, c := range st.pod.Spec.Containers {
			used := workingSet(containerID(st.pod, c.Name))
			requested := c.Resources.Requests.Memory().Value()
			u.usage += used
			u.requests += requested
			if used-requested > u.hungriestUsage-u.hungriestRequests || u.hungriest == "" {
				u.hungriest, u.hungriestUsage, u.hungriestRequests = c.Name, used, requested
			}
		}
		candidates = append(candidates, u)
	}
	m.mu.Unlock()
	if len(candidates) == 0 {
		return
	}
	slices.SortFunc(candidates, func(a, b podUsage) int {
		return evictFirst(rank{a.usage, a.requests, a.priority}, rank{b.usage, b.requests, b.priority})
	})
	m.evict(candidates[0].st, m.evictForMemoryMessage(candidates[0], available), true)
}

// rank is what the kubelet ranks pods by for eviction: their use of the
// resource the node is short of, what they requested of it, their
// priority.
type rank struct {
	use, requests int64
	priority      int32
}

// evictFirst orders a before b when the kubelet evicts it first: one
// using more than it requested before one that is not, then the lower
// priority, then the one further over its requests.
func evictFirst(a, b rank) int {
	if aOver, bOver := a.use > a.requests, b.use > b.requests; aOver != bOver {
		if aOver {
			return -1
		}
		return 1
	}
	if a.priority != b.priority {
		return cmp.Compare(a.priority, b.priority)
	}
	return cmp.Compare(b.use-b.requests, a.use-a.requests)
}

// evictForMemoryMessage is the kubelet's message for a pod evicted for
// the node's memory.
func (m *Manager) evictForMemoryMessage(u podUsage, available int64) string {
	threshold := resource.NewQuantity(m.cfg.Eviction.MemoryAvailableMin, resource.BinarySI)
	return fmt.Sprintf("The node was low on resource: memory. Threshold quantity: %s, available: %dKi. Container %s was using %dKi, request is %s, has larger consumption of memory. ",
		threshold, available>>10, u.hungriest, u.hungriestUsage>>10, resource.NewQuantity(u.hungriestRequests, resource.BinarySI))
}

// evict stops a pod for the node's sake and reports it Failed, reason
// Evicted, with the kubelet's message; its controller replaces it. Under
// node pressure the pod is also marked a DisruptionTarget, as the kubelet
// marks it; a pod over its own storage limits is not.
//
// The pod is stopped by its own sync, through the work queue, so that its
// start or reconcile never runs at the same time and leaves a container
// behind.
func (m *Manager) evict(st *podState, message string, nodePressure bool) {
	m.mu.Lock()
	pod := st.pod
	st.evicted, st.eviction = true, &evictionNotice{message: message, nodePressure: nodePressure}
	m.mu.Unlock()
	m.log.Warn("evicting a pod", "pod", st.key(), "message", message)
	m.event(pod, "", corev1.EventTypeWarning, "Evicted", "%s", message)
	m.queue.Add(st.key())
}

// evictionNotice is why the node evicts a pod.
type evictionNotice struct {
	message      string
	nodePressure bool
}

// carryOutEviction stops a pod the node evicted and reports it.
func (m *Manager) carryOutEviction(ctx context.Context, st *podState) error {
	m.mu.Lock()
	pod, notice := st.pod, *st.eviction
	statuses := append([]corev1.ContainerStatus{}, pod.Status.ContainerStatuses...)
	m.mu.Unlock()
	stopping := pod.DeepCopy()
	stopping.DeletionGracePeriodSeconds = ptr.To(int64(evictionGrace / time.Second))
	if err := m.stop(ctx, st, stopping); err != nil {
		return err
	}
	now := metav1.Now()
	for i := range statuses {
		s := &statuses[i]
		if s.State.Running != nil {
			s.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "Error", StartedAt: s.State.Running.StartedAt, FinishedAt: now}}
		}
		s.Ready, s.Started = false, ptr.To(false)
	}
	report := &evictionReport{evictionNotice: notice, statuses: statuses}
	m.mu.Lock()
	m.evicted[pod.UID] = report
	m.mu.Unlock()
	if m.cfg.Checkpoint != nil {
		// Until the API has it, the report outlives an agent restart, so
		// that the restarted agent does not run the evicted pod again.
		if err := m.cfg.Checkpoint.SavePod(report.apply(pod.DeepCopy())); err != nil {
			m.log.Error("checkpoint", "pod", st.key(), "err", err)
		}
	}
	return m.reportEviction(ctx, pod, report)
}

// apply writes the report into pod's status: Failed, reason Evicted.
func (r *evictionReport) apply(pod *corev1.Pod) *corev1.Pod {
	s := &pod.Status
	s.Phase, s.Reason, s.Message, s.ContainerStatuses = corev1.PodFailed, evictedReason, r.message, r.statuses
	if r.nodePressure {
		s.Conditions = setPodCondition(s.Conditions, corev1.DisruptionTarget, corev1.ConditionTrue, "TerminationByKubelet", r.message)
	}
	for _, t := range []corev1.PodConditionType{corev1.PodReady, corev1.ContainersReady} {
		s.Conditions = setPodCondition(s.Conditions, t, corev1.ConditionFalse, "PodFailed", "")
	}
	return pod
}

// evictedReason is the reason of an evicted pod's status.
const evictedReason = "Evicted"

// reportFrom is the report a checkpointed evicted pod carries, or nil
// for any other pod.
func reportFrom(pod *corev1.Pod) *evictionReport {
	if pod.Status.Phase != corev1.PodFailed || pod.Status.Reason != evictedReason {
		return nil
	}
	return &evictionReport{
		evictionNotice: evictionNotice{message: pod.Status.Message, nodePressure: conditionTrue(pod, corev1.DisruptionTarget)},
		statuses:       pod.Status.ContainerStatuses,
	}
}

// evictionReport is what the API is told of a pod the node evicted and
// stopped. It is kept until the API has the pod ended, so that a report
// the server could not take (it was unreachable) is sent again by the
// pod's next sync, as the kubelet's status manager does.
type evictionReport struct {
	evictionNotice
	statuses []corev1.ContainerStatus
}

// reportEviction writes an evicted pod's status: Failed, reason Evicted.
func (m *Manager) reportEviction(ctx context.Context, pod *corev1.Pod, report *evictionReport) error {
	pods := m.api.Pods(pod.Namespace)
	return clientretry.RetryOnConflict(clientretry.DefaultRetry, func() error {
		latest, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || err == nil && latest.UID != pod.UID {
			return nil
		}
		if err != nil {
			return err
		}
		_, err = pods.UpdateStatus(ctx, report.apply(latest), metav1.UpdateOptions{})
		return err
	})
}

// forgetEviction drops the report of a pod the API has ended or no
// longer has, and its checkpoint.
func (m *Manager) forgetEviction(uid types.UID) {
	m.mu.Lock()
	_, had := m.evicted[uid]
	delete(m.evicted, uid)
	m.mu.Unlock()
	if had && m.cfg.Checkpoint != nil {
		if err := m.cfg.Checkpoint.DeletePod(uid); err != nil {
			m.log.Error("checkpoint", "uid", uid, "err", err)
		}
	}
}

// forgetEvictionsOfGonePods forgets the reports of evicted pods the API
// no longer has (deleted before it took their report).
func (m *Manager) forgetEvictionsOfGonePods() {
	known := map[types.UID]bool{}
	for _, obj := range m.pods.GetIndexer().List() {
		known[obj.(*corev1.Pod).UID] = true
	}
	var gone []types.UID
	m.mu.Lock()
	for uid := range m.evicted {
		if !known[uid] {
			gone = append(gone, uid)
		}
	}
	m.mu.Unlock()
	for _, uid := range gone {
		m.forgetEviction(uid)
	}
}

// readCheckpoint takes back the eviction reports the API had not taken
// when the agent stopped, and returns the other pods checkpointed, for
// running them if the server is unreachable.
func (m *Manager) readCheckpoint() []*corev1.Pod {
	if m.cfg.Checkpoint == nil {
		return nil
	}
	pods, err := m.cfg.Checkpoint.Pods()
	if err != nil {
		m.log.Error("reading the checkpoint", "err", err)
	}
	var run []*corev1.Pod
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range pods {
		if r := reportFrom(p); r != nil {
			m.evicted[p.UID] = r
			continue
		}
		run = append(run, p)
	}
	return run
}

// evicting says whether the pod is being evicted.
func (m *Manager) evicting(st *podState) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return st.evicted
}

// evictionOf is the report of the pod with uid if the node evicted it:
// such a pod is not started again, whatever the API still says of it.
func (m *Manager) evictionOf(uid types.UID) *evictionReport {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.evicted[uid]
}

// workingSet is a container's memory in use less the page cache the
// kernel can drop, as the kubelet measures it, from its cgroup.
func workingSet(id string) int64 {
	read := func(path string) (int64, bool) {
		data, err := os.ReadFile(path)
		if err != nil {
			return 0, false
		}
		v, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
		return v, err == nil
	}
	inactive := func(path, key string) int64 {
		data, _ := os.ReadFile(path)
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, key+" "); ok {
				n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				return n
			}
		}
		return 0
	}
	v2 := filepath.Join("/sys/fs/cgroup", "orch", id)
	if usage, ok := read(filepath.Join(v2, "memory.current")); ok {
		return max(usage-inactive(filepath.Join(v2, "memory.stat"), "inactive_file"), 0)
	}
	v1 := filepath.Join("/sys/fs/cgroup/memory", "orch", id)
	if usage, ok := read(filepath.Join(v1, "memory.usage_in_bytes")); ok {
		return max(usage-inactive(filepath.Join(v1, "memory.stat"), "total_inactive_file"), 0)
	}
	return 0
}
