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
			u := used[name]
			return "OutOf" + string(name), fmt.Sprintf("Node didn't have enough resource: %s, requested: %d, used: %d, capacity: %d",
				name, quantity(name, want), quantity(name, u), quantity(name, capacity))
		}
	}
	return "", ""
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
	if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
		return nil
	}
	return err
}
