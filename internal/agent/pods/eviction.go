package pods

import (
	"context"
	"sync"
	"time"

	"github.com/orch-dev/orch/internal/agent/eviction"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clientretry "k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
)

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

// evictForMemory evicts the pod the kubelet would pick first: one using
// more memory than it requested before one that does not, then the lower
// priority, then the one furthest over its requests.
func (m *Manager) evictForMemory(available int64) {
	m.mu.Lock()
	var pods []*podState
	var candidates []eviction.Candidate
	for _, st := range m.running {
		if st.pod == nil || st.evicted {
			continue
		}
		pod := st.pod
		pods = append(pods, st)
		candidates = append(candidates, eviction.MemoryCandidate(pod, func(container string) int64 {
			return eviction.WorkingSet(containerID(pod, container))
		}))
	}
	m.mu.Unlock()
	if i := eviction.First(candidates); i >= 0 {
		m.evict(pods[i], eviction.MemoryMessage(candidates[i], m.cfg.Eviction.MemoryAvailableMin, available), true)
	}
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
	m.mu.Unlock()
	m.log.Warn("evicting a pod", "pod", st.key(), "message", message)
	m.event(pod, "", corev1.EventTypeWarning, "Evicted", "%s", message)
	m.stopForNode(st, &evictionNotice{reason: evictedReason, message: message, nodePressure: nodePressure, grace: evictionGrace})
}

// stopForNode has the pod's own sync stop it for the node's sake, as
// notice says.
func (m *Manager) stopForNode(st *podState, notice *evictionNotice) {
	m.mu.Lock()
	st.evicted, st.eviction = true, notice
	m.mu.Unlock()
	m.queue.Add(st.key())
}

// evictionNotice is why the node stops a pod, and how.
type evictionNotice struct {
	// reason and message are the status' (Evicted, or Terminated for a
	// node shutdown).
	reason, message string
	// nodePressure marks the pod a DisruptionTarget (TerminationByKubelet).
	nodePressure bool
	// grace is how long its containers get.
	grace time.Duration
	// keepOffline leaves the pod in the checkpoint as it ran until the API
	// has the report: a node that boots with the server away runs it
	// again. A node shutdown's pods are kept so; an evicted pod is not
	// started again.
	keepOffline bool
	// stopped (may be nil) is closed once the pod is stopped and reported,
	// or its report failed.
	stopped chan struct{}
	once    *sync.Once
}

func (n *evictionNotice) done() {
	if n.stopped != nil {
		n.once.Do(func() { close(n.stopped) })
	}
}

// carryOutEviction stops a pod the node evicted (or stops for its
// shutdown) and reports it.
func (m *Manager) carryOutEviction(ctx context.Context, st *podState) error {
	m.mu.Lock()
	pod, notice := st.pod, *st.eviction
	statuses := append([]corev1.ContainerStatus{}, pod.Status.ContainerStatuses...)
	m.mu.Unlock()
	stopping := pod.DeepCopy()
	stopping.DeletionGracePeriodSeconds = ptr.To(int64((notice.grace + time.Second - 1) / time.Second))
	if err := m.stop(ctx, st, stopping); err != nil {
		return err
	}
	now := metav1.Now()
	m.mu.Lock()
	exits := map[string]*exit{}
	for _, cs := range st.all() {
		exits[cs.name] = cs.exit
	}
	m.mu.Unlock()
	for i := range statuses {
		s := &statuses[i]
		if s.State.Running != nil {
			// As the container ended; a kill whose end was not seen is
			// reported as SIGKILL's.
			started := s.State.Running.StartedAt
			s.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "Error", StartedAt: started, FinishedAt: now}}
			if ex := exits[s.Name]; ex != nil {
				s.State.Terminated = terminated(ex, started.Time)
			}
		}
		s.Ready, s.Started = false, ptr.To(false)
	}
	report := &evictionReport{evictionNotice: notice, statuses: statuses}
	m.mu.Lock()
	m.evicted[pod.UID] = report
	m.mu.Unlock()
	if m.cfg.Checkpoint != nil && !notice.keepOffline {
		// Until the API has it, the report outlives an agent restart, so
		// that the restarted agent does not run the evicted pod again.
		if err := m.cfg.Checkpoint.SavePod(report.apply(pod.DeepCopy())); err != nil {
			m.log.Error("checkpoint", "pod", st.key(), "err", err)
		}
	}
	reportCtx := ctx
	if notice.keepOffline {
		// The machine is going down: a server away gets no long wait.
		var cancel context.CancelFunc
		reportCtx, cancel = context.WithTimeout(ctx, shutdownReportTimeout)
		defer cancel()
	}
	err := m.reportEviction(reportCtx, pod, report)
	if err != nil && notice.keepOffline {
		m.checkpoint(pod)
	}
	notice.done()
	return err
}

// apply writes the report into pod's status: Failed, reason Evicted (or
// Terminated).
func (r *evictionReport) apply(pod *corev1.Pod) *corev1.Pod {
	s := &pod.Status
	s.Phase, s.Reason, s.Message, s.ContainerStatuses = corev1.PodFailed, r.reason, r.message, r.statuses
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
		evictionNotice: evictionNotice{reason: evictedReason, message: pod.Status.Message, nodePressure: conditionTrue(pod, corev1.DisruptionTarget)},
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
