package pods

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/orch-dev/orch/internal/agent/podnet"
)

// admitted is the kubelet's admission of a pod bound to its node: the
// scheduler checked the node had room, but a pod given a nodeName by its
// author never met the scheduler. A pod whose host ports are taken on the
// node, or that does not fit what the node's pods leave of its
// allocatable CPU, memory or pod count, is rejected as a kubelet rejects
// it: Failed, with the reason (NodePorts, OutOfcpu, OutOfmemory,
// OutOfpods) and "Pod was rejected: ...", for its controller to replace.
// It reports "" when the pod fits.
func (m *Manager) admitted(pod *corev1.Pod) (reason, message string) {
	m.mu.Lock()
	var others []*corev1.Pod
	var taken []podnet.PortMapping
	for uid, st := range m.running {
		if uid == pod.UID || st.pod == nil {
			continue
		}
		others = append(others, st.pod)
		taken = append(taken, st.ports...)
	}
	m.mu.Unlock()
	for _, want := range podnet.HostPorts(pod) {
		for _, have := range taken {
			if portsClash(want, have) {
				return "NodePorts", "node(s) didn't have free ports for the requested pod ports"
			}
		}
	}
	alloc := m.cfg.Allocatable
	if len(alloc) == 0 {
		return "", ""
	}
	if max, ok := alloc[corev1.ResourcePods]; ok && int64(len(others)+1) > max.Value() {
		return "OutOfpods", fmt.Sprintf("Node didn't have enough resource: pods, requested: 1, used: %d, capacity: %d", len(others), max.Value())
	}
	if short := m.shortage(pod); short != nil {
		return "OutOf" + string(short.name), short.message()
	}
	return "", ""
}

// shortage is the first of cpu and memory a pod's requests do not fit in
// on the node, with what its other pods request and its allocatable.
type shortage struct {
	name                 corev1.ResourceName
	want, used, capacity resource.Quantity
}

// message is the kubelet's words for a shortage.
func (s *shortage) message() string {
	return fmt.Sprintf("Node didn't have enough resource: %s, requested: %d, used: %d, capacity: %d",
		s.name, quantity(s.name, s.want), quantity(s.name, s.used), quantity(s.name, s.capacity))
}

// infeasible: the pod asks for more than the node has at all.
func (s *shortage) infeasible() bool { return s.want.Cmp(s.capacity) > 0 }

// shortage is nil when the pod fits beside the node's other pods (or
// the node's allocatable is not known).
func (m *Manager) shortage(pod *corev1.Pod) *shortage {
	alloc := m.cfg.Allocatable
	if len(alloc) == 0 {
		return nil
	}
	requested := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	used := m.requestedByOthers(pod)
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		want, capacity := requested[name], alloc[name]
		if want.IsZero() || capacity.IsZero() {
			continue
		}
		total := used[name]
		total.Add(want)
		if total.Cmp(capacity) > 0 {
			return &shortage{name: name, want: want, used: used[name], capacity: capacity}
		}
	}
	return nil
}

// requestedByOthers is what the node's other pods request.
func (m *Manager) requestedByOthers(pod *corev1.Pod) corev1.ResourceList {
	m.mu.Lock()
	var others []*corev1.Pod
	for uid, st := range m.running {
		if uid != pod.UID && st.pod != nil {
			others = append(others, st.pod)
		}
	}
	m.mu.Unlock()
	used := corev1.ResourceList{}
	for _, p := range others {
		for name, q := range resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{UseStatusResources: true}) {
			sum := used[name]
			sum.Add(q)
			used[name] = sum
		}
	}
	return used
}

func quantity(name corev1.ResourceName, q resource.Quantity) int64 {
	if name == corev1.ResourceCPU {
		return q.MilliValue()
	}
	return q.Value()
}

// portsClash: one port of one protocol on the node, on the same address
// or on every address (0.0.0.0) on either side.
func portsClash(a, b podnet.PortMapping) bool {
	any := func(ip string) bool { return ip == "" || ip == "0.0.0.0" || ip == "::" }
	return a.HostPort == b.HostPort && a.Protocol == b.Protocol && (a.HostIP == b.HostIP || any(a.HostIP) || any(b.HostIP))
}

// reject fails a pod the node will not run, as a kubelet rejects one.
func (m *Manager) reject(ctx context.Context, pod *corev1.Pod, reason, message string) error {
	m.event(pod, "", corev1.EventTypeWarning, reason, "%s", message)
	updated := pod.DeepCopy()
	updated.Status = corev1.PodStatus{Phase: corev1.PodFailed, Reason: reason, Message: "Pod was rejected: " + message,
		QOSClass: pod.Status.QOSClass, ObservedGeneration: pod.Generation}
	_, err := m.api.Pods(pod.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		// Forbidden too is tried again: the node authorizer's graph
		// follows the pods' watch, and may not relate a pod just bound
		// here to this node yet; let go, the pod would stay Pending for
		// good. A pod really gone leaves the node's informer, and its
		// retry finds nothing to do.
		return fmt.Errorf("report the pod rejected (%s): %w", reason, err)
	}
	return nil
}
