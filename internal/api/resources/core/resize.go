package core

import (
	"slices"

	"github.com/orch-dev/orch/internal/api/resources"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// podResize is pods/resize, in-place resizing of a pod's containers: a
// write of the pod of which only its containers' (and sidecars') cpu
// and memory requests and limits and their resize policies are taken;
// the pod's node then applies them to the running containers.
func podResize() resources.Subresource {
	return resources.Subresource{Name: "resize", Serve: resources.ServeStatus, Verbs: metav1.Verbs{"get", "patch", "update"},
		Field:            []string{"spec"},
		PrepareForUpdate: func(obj, old runtime.Object) { prepareResize(obj.(*corev1.Pod), old.(*corev1.Pod)) },
		ValidateUpdate:   resources.TypedValidateUpdate(validateResize),
	}
}

// prepareResize keeps of what was sent only the containers' resources
// and resize policies, as Kubernetes' resize strategy does; containers
// added, removed or renamed are left for validation to refuse.
func prepareResize(pod, old *corev1.Pod) {
	if !sameNames(pod.Spec.Containers, old.Spec.Containers) || !sameNames(pod.Spec.InitContainers, old.Spec.InitContainers) {
		return
	}
	spec := old.Spec.DeepCopy()
	for _, list := range []struct{ to, from []corev1.Container }{{spec.Containers, pod.Spec.Containers}, {spec.InitContainers, pod.Spec.InitContainers}} {
		for i := range list.to {
			list.to[i].Resources, list.to[i].ResizePolicy = list.from[i].Resources, list.from[i].ResizePolicy
			requestsFromLimits(&list.to[i].Resources) // Kubernetes' defaults, applied to every pod it decodes
		}
	}
	pod.Spec = *spec
}

func sameNames(a, b []corev1.Container) bool {
	return slices.EqualFunc(a, b, func(x, y corev1.Container) bool { return x.Name == y.Name })
}

// validateResize is Kubernetes' ValidatePodResize for what orch serves
// (no pod-level resources, no resizing of non-sidecar init containers):
// the same containers, the same QoS class, no request or limit removed,
// only cpu and memory changed.
func validateResize(pod, old *corev1.Pod) field.ErrorList {
	if _, mirror := old.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
		return field.ErrorList{field.Forbidden(field.NewPath(""), "static pods cannot be resized")}
	}
	spec := resources.SpecPath
	var errs field.ErrorList
	if qosClass(&old.Spec) != qosClass(&pod.Spec) {
		errs = append(errs, field.Invalid(spec, pod.Status.QOSClass, "Pod QOS Class may not change as a result of resizing"))
	}
	if len(pod.Spec.Containers) != len(old.Spec.Containers) {
		return append(errs, field.Forbidden(spec.Child("containers"), "containers may not be added or removed on resize"))
	}
	if len(pod.Spec.InitContainers) != len(old.Spec.InitContainers) {
		return append(errs, field.Forbidden(spec.Child("initContainers"), "initContainers may not be added or removed on resize"))
	}
	for i := range old.Spec.Containers {
		if pod.Spec.Containers[i].Name != old.Spec.Containers[i].Name {
			errs = append(errs, field.Forbidden(spec.Child("containers").Index(i).Child("name"), "containers may not be renamed or reordered on resize"))
		}
	}
	for i := range old.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name != old.Spec.InitContainers[i].Name {
			errs = append(errs, field.Forbidden(spec.Child("initContainers").Index(i).Child("name"), "initContainers may not be renamed or reordered on resize"))
		}
	}
	if len(errs) > 0 {
		return errs
	}
	for i := range old.Spec.Containers {
		c, was := pod.Spec.Containers[i], old.Spec.Containers[i]
		errs = append(errs, validateContainerResize(&c.Resources, &was.Resources, spec.Child("containers").Index(i).Child("resources"))...)
		if !onlyCPUMemoryChanged(c, was) {
			errs = append(errs, field.Forbidden(spec, "only cpu and memory resources are mutable"))
		}
	}
	for i := range old.Spec.InitContainers {
		c, was := pod.Spec.InitContainers[i], old.Spec.InitContainers[i]
		switch {
		case sidecar(&was):
			errs = append(errs, validateContainerResize(&c.Resources, &was.Resources, spec.Child("initContainers").Index(i).Child("resources"))...)
			if !onlyCPUMemoryChanged(c, was) {
				errs = append(errs, field.Forbidden(spec.Child("initContainers").Index(i), "only cpu and memory resources for init or sidecar containers are mutable"))
			}
		case !apiequality.Semantic.DeepEqual(c, was):
			errs = append(errs, field.Forbidden(spec, "resources for non-sidecar init containers are immutable"))
		}
	}
	return errs
}

func sidecar(c *corev1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
}

// validateContainerResize: a resize may not remove a request or a limit.
func validateContainerResize(r, old *corev1.ResourceRequirements, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if removed(r.Requests, old.Requests) {
		errs = append(errs, field.Forbidden(path.Child("requests"), "resource requests cannot be removed"))
	}
	if removed(r.Limits, old.Limits) {
		errs = append(errs, field.Forbidden(path.Child("limits"), "resource limits cannot be removed"))
	}
	return errs
}

func removed(list, old corev1.ResourceList) bool {
	for name := range old {
		if _, ok := list[name]; !ok {
			return true
		}
	}
	return false
}

// onlyCPUMemoryChanged: c is was but for its cpu and memory requests and
// limits and its resize policy.
func onlyCPUMemoryChanged(c, was corev1.Container) bool {
	keep := func(list, old corev1.ResourceList) corev1.ResourceList {
		out := corev1.ResourceList{}
		for name, q := range list {
			if name != corev1.ResourceCPU && name != corev1.ResourceMemory {
				out[name] = q
			}
		}
		for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if q, ok := old[name]; ok {
				out[name] = q
			}
		}
		if len(out) == 0 && old == nil {
			return nil
		}
		return out
	}
	c.Resources.Requests, c.Resources.Limits = keep(c.Resources.Requests, was.Resources.Requests), keep(c.Resources.Limits, was.Resources.Limits)
	c.ResizePolicy = was.ResizePolicy
	return apiequality.Semantic.DeepEqual(c, was)
}

// validateResizePolicy is Kubernetes' check of a container's resize
// policy: cpu or memory, each once, NotRequired or RestartContainer
// (NotRequired only in a pod that never restarts).
func validateResizePolicy(policies []corev1.ContainerResizePolicy, path *field.Path, podRestart corev1.RestartPolicy) field.ErrorList {
	var errs field.ErrorList
	seen := map[corev1.ResourceName]bool{}
	for i, p := range policies {
		if seen[p.ResourceName] {
			errs = append(errs, field.Duplicate(path.Index(i), p.ResourceName))
		}
		seen[p.ResourceName] = true
		switch p.ResourceName {
		case corev1.ResourceCPU, corev1.ResourceMemory:
		case "":
			errs = append(errs, field.Required(path, ""))
		default:
			errs = append(errs, field.NotSupported(path, p.ResourceName, []string{string(corev1.ResourceCPU), string(corev1.ResourceMemory)}))
		}
		switch p.RestartPolicy {
		case corev1.NotRequired, corev1.RestartContainer:
		case "":
			errs = append(errs, field.Required(path, ""))
		default:
			errs = append(errs, field.NotSupported(path, p.RestartPolicy, []string{string(corev1.NotRequired), string(corev1.RestartContainer)}))
		}
		if podRestart == corev1.RestartPolicyNever && p.RestartPolicy != corev1.NotRequired {
			errs = append(errs, field.Invalid(path, p.RestartPolicy, "must be 'NotRequired' when pod `restartPolicy` is 'Never'"))
		}
	}
	return errs
}
