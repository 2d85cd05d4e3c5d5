package pods

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

// EventRecorder is where the kubelet's events about pods go (what
// `kubectl describe pod` lists): internal/kube's recorder.
type EventRecorder interface {
	Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any)
}

// event records an event about a pod's container (or the pod itself when
// container is ""), worded as the kubelet words it.
func (m *Manager) event(pod *corev1.Pod, container, eventtype, reason, note string, args ...any) {
	if m.cfg.Events == nil || pod == nil {
		return
	}
	ref := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion}
	if container != "" {
		ref.FieldPath = containerFieldPath(pod, container)
	}
	m.cfg.Events.Eventf(ref, nil, eventtype, reason, reason, note, args...)
}

// NodeRef is a node as the kubelet's events name it (its UID is its name,
// as the kubelet sets it).
func NodeRef(name string) *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: name, UID: types.UID(name)}
}

// reclaiming records on the node, as the kubelet's eviction manager does
// at each check that finds a threshold met, what it is about to reclaim.
func (m *Manager) reclaiming(res corev1.ResourceName) {
	if m.cfg.Events == nil {
		return
	}
	m.cfg.Events.Eventf(NodeRef(m.cfg.Node), nil, corev1.EventTypeWarning, "EvictionThresholdMet", "EvictionThresholdMet", "Attempting to reclaim %s", res)
}

// containerFieldPath names a container in a pod, as event references do:
// spec.containers{name} or spec.initContainers{name}.
func containerFieldPath(pod *corev1.Pod, name string) string {
	for _, c := range pod.Spec.InitContainers {
		if c.Name == name {
			return fmt.Sprintf("spec.initContainers{%s}", name)
		}
	}
	for _, c := range pod.Spec.EphemeralContainers {
		if c.Name == name {
			return fmt.Sprintf("spec.ephemeralContainers{%s}", name)
		}
	}
	return fmt.Sprintf("spec.containers{%s}", name)
}
