package pods

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// configRetry is how soon a pod whose containers could not be created as
// their spec stands (a ConfigMap not there yet) is tried again.
const configRetry = 5 * time.Second

// reportStatus writes the pod's status as its containers are now; an
// unchanged status is not written again. syncErr is what stopped this
// sync: a configError is reported in the waiting containers' state and
// tried again shortly; any other error is returned for the queue's
// back-off once the status is out.
func (m *Manager) reportStatus(ctx context.Context, pod *corev1.Pod, st *podState, syncErr error) error {
	var ce *configError
	if errors.As(syncErr, &ce) {
		m.queue.AddAfter(st.key(), configRetry)
	}
	m.mu.Lock()
	status := podStatus(pod, st, m.cfg.NodeIP, ce)
	m.mu.Unlock()
	if equality.Semantic.DeepEqual(pod.Status, status) {
		return nonConfig(syncErr)
	}
	updated := pod.DeepCopy()
	updated.Status = status
	_, err := m.api.Pods(pod.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil // gone
	}
	if err != nil {
		// Forbidden included, tried again: the node authorizer may not
		// relate a pod just bound here to this node yet (see reject).
		// Both errors: offline, the status cannot go out, and the log
		// should still say why the pod does not run.
		return errors.Join(syncErr, err)
	}
	return nonConfig(syncErr)
}

// reportFinal writes a deleted pod's last status once its containers have
// stopped, before the pod is let go, as a kubelet does: a terminal phase
// is what a Job judges a deleted pod by (a pod failure policy, or
// podReplacementPolicy Failed, waits for it). st is the pod's state on
// the node, nil when it no longer runs here.
func (m *Manager) reportFinal(ctx context.Context, pod *corev1.Pod, st *podState) error {
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil
	}
	status := *pod.Status.DeepCopy()
	if st != nil {
		m.mu.Lock()
		status = podStatus(pod, st, m.cfg.NodeIP, nil)
		m.mu.Unlock()
	}
	updated := pod.DeepCopy()
	updated.Status = finalStatus(status)
	_, err := m.api.Pods(pod.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
		return nil
	}
	return err
}

// deadlineLeft is how long the pod may still run under its
// activeDeadlineSeconds, counted from when the node started it; ok is
// false without a deadline.
func deadlineLeft(pod *corev1.Pod, now time.Time) (time.Duration, bool) {
	d := pod.Spec.ActiveDeadlineSeconds
	if d == nil || pod.Status.StartTime == nil {
		return 0, false
	}
	return pod.Status.StartTime.Add(time.Duration(*d) * time.Second).Sub(now), true
}

// deadlineExceeded ends a pod active longer than its activeDeadlineSeconds,
// as a kubelet does: its containers stopped (st, nil once they are),
// Failed with reason DeadlineExceeded, never restarted.
func (m *Manager) deadlineExceeded(ctx context.Context, st *podState, pod *corev1.Pod) error {
	const message = "Pod was active on the node longer than the specified deadline"
	status := finalStatus(*pod.Status.DeepCopy())
	if st != nil {
		m.event(pod, "", corev1.EventTypeNormal, "DeadlineExceeded", "%s", message)
		if err := m.stop(ctx, st, pod); err != nil {
			return err
		}
		m.mu.Lock()
		status = finalStatus(podStatus(pod, st, m.cfg.NodeIP, nil))
		m.mu.Unlock()
	}
	status.Phase, status.Reason, status.Message = corev1.PodFailed, "DeadlineExceeded", message
	updated := pod.DeepCopy()
	updated.Status = status
	_, err := m.api.Pods(pod.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// finalStatus is s made terminal: every container terminated (one whose
// end is unknown as a kubelet reports it, exit code 137), not ready, and
// the phase Succeeded when every container exited 0, else Failed.
func finalStatus(s corev1.PodStatus) corev1.PodStatus {
	succeeded := len(s.ContainerStatuses) > 0
	for i := range s.ContainerStatuses {
		cs := &s.ContainerStatuses[i]
		if cs.State.Terminated == nil {
			if last := cs.LastTerminationState.Terminated; last != nil && cs.State.Running == nil {
				cs.State = corev1.ContainerState{Terminated: last} // was waiting to restart
			} else {
				cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "ContainerStatusUnknown",
					Message: "The container could not be located when the pod was terminated"}}
			}
		}
		cs.Ready, cs.Started = false, ptr.To(false)
		succeeded = succeeded && cs.State.Terminated.ExitCode == 0
	}
	s.Phase = corev1.PodFailed
	if succeeded {
		s.Phase = corev1.PodSucceeded
	}
	for _, t := range []corev1.PodConditionType{corev1.PodReady, corev1.ContainersReady} {
		s.Conditions = setPodCondition(s.Conditions, t, corev1.ConditionFalse, "PodCompleted", "")
	}
	return s
}

// apiTime is t as the API keeps it, to the second: a status holding
// nanoseconds never equals the one read back, and was written again at
// every sync of every pod (a no-op for the server, a request each).
func apiTime(t time.Time) metav1.Time { return metav1.NewTime(t).Rfc3339Copy() }

// podStatus is the pod's status as what the node runs of it now stands: a
// function of the pod, its state on the node (the caller holds the
// manager's lock), the node's address and the configuration error that
// stopped its sync, if any.
func podStatus(pod *corev1.Pod, st *podState, nodeIP string, podErr *configError) corev1.PodStatus {
	s := pod.Status.DeepCopy()
	// The spec this status answers to, as a kubelet reports it.
	s.ObservedGeneration = pod.Generation
	started := apiTime(st.started)
	s.PodIP, s.PodIPs, s.HostIP, s.StartTime = st.ip, []corev1.PodIP{{IP: st.ip}}, nodeIP, &started
	if nodeIP != "" {
		s.HostIPs = []corev1.HostIP{{IP: nodeIP}}
	}
	policy := pod.Spec.RestartPolicy
	s.InitContainerStatuses = nil
	var incompleteInit []string
	initFailed := false
	var unready []string
	for i, c := range pod.Spec.InitContainers {
		cs := st.init[i]
		status := containerStatus(pod, c, cs, podErr)
		switch {
		case sidecar(&c):
			// A sidecar is ready by its readiness probe, counts in the
			// pod's readiness, and never fails the pod.
			if !cs.initDone(&c) && !st.initialized {
				incompleteInit = append(incompleteInit, c.Name)
				if !cs.created && cs.waiting == nil {
					status.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}}
				}
			}
			if !status.Ready {
				unready = append(unready, c.Name)
			}
		case cs.succeeded():
			status.Ready = true
		case cs.exit != nil && !cs.running && policy == corev1.RestartPolicyNever:
			initFailed = true
			incompleteInit = append(incompleteInit, c.Name)
		default:
			incompleteInit = append(incompleteInit, c.Name)
			if !cs.created && cs.waiting == nil && !st.initialized {
				status.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}}
			}
		}
		s.InitContainerStatuses = append(s.InitContainerStatuses, status)
	}
	if st.initialized {
		incompleteInit = nil
	}
	s.ContainerStatuses = nil
	allCreated, anyRunning, allDone, allSucceeded := true, false, true, true
	for i, c := range pod.Spec.Containers {
		cs := st.app[i]
		status := containerStatus(pod, c, cs, podErr)
		if !st.initialized && !cs.created && cs.waiting == nil {
			status.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}}
		}
		allCreated = allCreated && (cs.created || cs.restarts > 0)
		switch {
		case cs.running:
			anyRunning, allDone, allSucceeded = true, false, false
		case cs.exit != nil && restarts(policy, cs.exit.code):
			anyRunning, allDone, allSucceeded = true, false, false // restarting counts as running
		case cs.exit != nil:
			allSucceeded = allSucceeded && cs.exit.code == 0
		default:
			allDone, allSucceeded = false, false
		}
		if !status.Ready {
			unready = append(unready, c.Name)
		}
		s.ContainerStatuses = append(s.ContainerStatuses, status)
	}
	// Ephemeral containers count in nothing else: never ready, never
	// restarted, no part of the phase.
	s.EphemeralContainerStatuses = nil
	for i := range pod.Spec.EphemeralContainers {
		c := ephemeralSpec(&pod.Spec.EphemeralContainers[i])
		cs := &containerState{name: c.Name, ephemeral: true}
		for _, e := range st.ephemeral {
			if e.name == c.Name {
				cs = e
			}
		}
		status := containerStatus(pod, *c, cs, nil)
		status.Ready = false
		s.EphemeralContainerStatuses = append(s.EphemeralContainerStatuses, status)
	}
	switch {
	case initFailed:
		s.Phase = corev1.PodFailed
	case len(incompleteInit) > 0 || !allCreated:
		s.Phase = corev1.PodPending
	case allDone && allSucceeded:
		s.Phase = corev1.PodSucceeded
	case allDone:
		s.Phase = corev1.PodFailed
	case anyRunning:
		s.Phase = corev1.PodRunning
	default:
		s.Phase = corev1.PodPending
	}
	if s.QOSClass == "" {
		s.QOSClass = corev1.PodQOSBestEffort
	}
	for _, t := range []corev1.PodConditionType{corev1.PodResizePending, corev1.PodResizeInProgress} {
		if r := st.resize; r != nil && r.condition == t {
			s.Conditions = setPodCondition(s.Conditions, t, corev1.ConditionTrue, r.reason, r.message)
		} else {
			s.Conditions = removePodCondition(s.Conditions, t)
		}
	}
	s.Conditions = setPodCondition(s.Conditions, corev1.PodScheduled, corev1.ConditionTrue, "", "")
	s.Conditions = setPodCondition(s.Conditions, corev1.PodReadyToStartContainers, corev1.ConditionTrue, "", "")
	if len(incompleteInit) > 0 {
		s.Conditions = setPodCondition(s.Conditions, corev1.PodInitialized, corev1.ConditionFalse, "ContainersNotInitialized",
			fmt.Sprintf("containers with incomplete status: [%s]", strings.Join(incompleteInit, " ")))
	} else {
		s.Conditions = setPodCondition(s.Conditions, corev1.PodInitialized, corev1.ConditionTrue, "", "")
	}
	containersReady, reason, message := corev1.ConditionTrue, "", ""
	if len(unready) > 0 {
		containersReady, reason, message = corev1.ConditionFalse, "ContainersNotReady", fmt.Sprintf("containers with unready status: [%s]", strings.Join(unready, " "))
	}
	if s.Phase == corev1.PodSucceeded || s.Phase == corev1.PodFailed {
		reason = "PodCompleted"
		if containersReady == corev1.ConditionTrue {
			containersReady, message = corev1.ConditionFalse, ""
		}
	}
	s.Conditions = setPodCondition(s.Conditions, corev1.ContainersReady, containersReady, reason, message)
	ready, rReason, rMessage := containersReady, reason, message
	if ready == corev1.ConditionTrue {
		if gates := unmetReadinessGates(pod); len(gates) > 0 {
			ready, rReason, rMessage = corev1.ConditionFalse, "ReadinessGatesNotReady", fmt.Sprintf("corresponding condition of pod readiness gate %q does not exist.", gates[0])
		}
	}
	s.Conditions = setPodCondition(s.Conditions, corev1.PodReady, ready, rReason, rMessage)
	return *s
}

func nonConfig(err error) error {
	var ce *configError
	if errors.As(err, &ce) {
		return nil
	}
	return err
}

// unmetReadinessGates are the pod's readiness gates whose condition is
// not True.
func unmetReadinessGates(pod *corev1.Pod) []string {
	var out []string
	for _, g := range pod.Spec.ReadinessGates {
		if !conditionTrue(pod, g.ConditionType) {
			out = append(out, string(g.ConditionType))
		}
	}
	return out
}

// containerStatus is one container's status; the caller holds the
// manager's lock.
func containerStatus(pod *corev1.Pod, c corev1.Container, cs *containerState, podErr *configError) corev1.ContainerStatus {
	image := cs.image
	if image == "" {
		image, _ = imageRef(c.Image)
	}
	status := corev1.ContainerStatus{Name: c.Name, Image: image, ImageID: cs.imageID, RestartCount: cs.restarts, LastTerminationState: cs.lastState,
		Started: ptr.To(false)}
	if cs.created || cs.restarts > 0 {
		status.ContainerID = "containerd://" + cs.id
	}
	if !cs.ephemeral {
		// What its cgroup has (a resize not yet applied is not there),
		// or, before it runs, what it will get.
		applied := cpuMemory(c.Resources)
		if cs.created && cs.applied != nil {
			applied = *cs.applied
		}
		status.Resources, status.AllocatedResources = &applied, applied.Requests
	}
	switch {
	case cs.running:
		status.State.Running = &corev1.ContainerStateRunning{StartedAt: apiTime(cs.startedAt)}
		status.Started = ptr.To(cs.startupDone)
		status.Ready = cs.ready && cs.startupDone
	case cs.exit != nil && !cs.ephemeral && (cs.init && cs.exit.code != 0 && pod.Spec.RestartPolicy != corev1.RestartPolicyNever || !cs.init && restarts(pod.Spec.RestartPolicy, cs.exit.code)):
		if cs.waiting != nil {
			status.State.Waiting = &corev1.ContainerStateWaiting{Reason: cs.waiting.reason, Message: cs.waiting.message}
		} else {
			status.State.Waiting = &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff",
				Message: fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)", crashBackoff(max(cs.restarts, 1)), c.Name, pod.Name, pod.Namespace, pod.UID)}
		}
		status.LastTerminationState = corev1.ContainerState{Terminated: terminated(cs.exit, cs.startedAt)}
	case cs.exit != nil:
		status.State.Terminated = terminated(cs.exit, cs.startedAt)
	case cs.waiting != nil:
		status.State.Waiting = &corev1.ContainerStateWaiting{Reason: cs.waiting.reason, Message: cs.waiting.message}
	case podErr != nil:
		status.State.Waiting = &corev1.ContainerStateWaiting{Reason: podErr.reason, Message: podErr.message}
	default:
		status.State.Waiting = &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}
	}
	if status.State.Waiting != nil && status.State.Waiting.Reason == "ContainerCreating" && podErr == nil {
		status.State.Waiting.Message = ""
	}
	return status
}

func terminated(ex *exit, started time.Time) *corev1.ContainerStateTerminated {
	if ex == nil {
		return nil
	}
	reason := "Completed"
	switch {
	case ex.reason != "":
		reason = ex.reason
	case ex.oomKilled:
		reason = "OOMKilled"
	case ex.code != 0:
		reason = "Error"
	}
	return &corev1.ContainerStateTerminated{ExitCode: ex.code, Reason: reason, Message: ex.message,
		StartedAt: apiTime(started), FinishedAt: apiTime(ex.at)}
}

// conditionTrue says whether the pod's condition t is True.
func conditionTrue(pod *corev1.Pod, t corev1.PodConditionType) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == t {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// setPodCondition sets a condition, keeping its transition time when its
// status does not change.
func removePodCondition(conds []corev1.PodCondition, t corev1.PodConditionType) []corev1.PodCondition {
	return slices.DeleteFunc(slices.Clone(conds), func(c corev1.PodCondition) bool { return c.Type == t })
}

func setPodCondition(conds []corev1.PodCondition, t corev1.PodConditionType, status corev1.ConditionStatus, reason, message string) []corev1.PodCondition {
	out := append([]corev1.PodCondition{}, conds...)
	for i := range out {
		if out[i].Type == t {
			if out[i].Status != status {
				out[i].LastTransitionTime = metav1.Now()
			}
			out[i].Status, out[i].Reason, out[i].Message = status, reason, message
			return out
		}
	}
	return append(out, corev1.PodCondition{Type: t, Status: status, Reason: reason, Message: message, LastTransitionTime: metav1.Now()})
}
