package scheduler

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// TestRequestsOfAResizedPod: a pod whose resize its node has not applied
// takes the larger of what it asks and what it was given, as Kubernetes'
// scheduler counts it: a smaller request frees nothing until applied.
func TestRequestsOfAResizedPod(t *testing.T) {
	list := func(cpu, mem string) corev1.ResourceList {
		return corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}
	}
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: list("100m", "64Mi")}}}},
		Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "c", AllocatedResources: list("500m", "32Mi"),
			Resources: &corev1.ResourceRequirements{Requests: list("500m", "32Mi")}}}}}
	if r := requestsOf(pod); r.milliCPU != 500 || r.memory != 64<<20 {
		t.Errorf("requests of a pod being resized: %d m cpu, %d bytes", r.milliCPU, r.memory)
	}
}
