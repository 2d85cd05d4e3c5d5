package core

import (
	"fmt"
	"reflect"
	"unicode"
	"unicode/utf8"

	"github.com/orch-dev/orch/internal/api/resources"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// ephemeralContainers is pods/ephemeralcontainers, the one way to add a
// container to a running pod (`kubectl debug`): a write of the pod of
// which only spec.ephemeralContainers is taken, each one added for good.
func ephemeralContainers() resources.Subresource {
	return resources.Subresource{Name: "ephemeralcontainers", Serve: resources.ServeStatus, Verbs: metav1.Verbs{"get", "patch", "update"},
		Field:            []string{"spec", "ephemeralContainers"},
		PrepareForUpdate: func(obj, _ runtime.Object) { defaultEphemeralContainers(&obj.(*corev1.Pod).Spec) },
		ValidateUpdate:   resources.TypedValidateUpdate(validateEphemeralContainersUpdate),
	}
}

func defaultEphemeralContainers(spec *corev1.PodSpec) {
	for i := range spec.EphemeralContainers {
		defaultContainer((*corev1.Container)(&spec.EphemeralContainers[i].EphemeralContainerCommon))
	}
}

// validateEphemeralContainersUpdate is Kubernetes' rule for a write of
// pods/ephemeralcontainers: none of a static pod's; those there stay,
// unchanged (in any order: a patch does not keep it).
func validateEphemeralContainersUpdate(pod, old *corev1.Pod) field.ErrorList {
	if _, mirror := old.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
		return field.ErrorList{field.Forbidden(field.NewPath(""), "static pods do not support ephemeral containers")}
	}
	var errs field.ErrorList
	path := resources.SpecPath.Child("ephemeralContainers")
	sent := map[string]*corev1.EphemeralContainer{}
	for i := range pod.Spec.EphemeralContainers {
		sent[pod.Spec.EphemeralContainers[i].Name] = &pod.Spec.EphemeralContainers[i]
	}
	for _, was := range old.Spec.EphemeralContainers {
		now, ok := sent[was.Name]
		switch {
		case !ok:
			errs = append(errs, field.Forbidden(path, fmt.Sprintf("existing ephemeral containers %q may not be removed", was.Name)))
		case !apiequality.Semantic.DeepEqual(was, *now):
			errs = append(errs, field.Forbidden(path, fmt.Sprintf("existing ephemeral containers %q may not be changed", was.Name)))
		}
	}
	return errs
}

// ephemeralAllowed are the container fields an ephemeral container may
// set, as Kubernetes lists them: whatever a pod relies on (ports,
// probes, lifecycle hooks, resources, restarts) is not for a container
// that comes and goes for debugging.
var ephemeralAllowed = sets.New("Name", "Image", "Command", "Args", "WorkingDir", "EnvFrom", "Env", "VolumeMounts", "VolumeDevices",
	"TerminationMessagePath", "TerminationMessagePolicy", "ImagePullPolicy", "SecurityContext", "Stdin", "StdinOnce", "TTY")

// validateEphemeralContainers checks a pod's ephemeral containers as
// Kubernetes does: as containers (names unique among all the pod's), a
// target that is one of its other containers, only the allowed fields,
// no subPath mounts. names holds the pod's other containers' names.
func validateEphemeralContainers(spec *corev1.PodSpec, path *field.Path, names sets.Set[string], volumes sets.Set[string]) field.ErrorList {
	if len(spec.EphemeralContainers) == 0 {
		return nil
	}
	others := names.Clone()
	common := make([]corev1.Container, len(spec.EphemeralContainers))
	for i := range spec.EphemeralContainers {
		common[i] = corev1.Container(spec.EphemeralContainers[i].EphemeralContainerCommon)
	}
	errs := validateContainers(common, path, names)
	for i, ec := range spec.EphemeralContainers {
		p := path.Index(i)
		if t := ec.TargetContainerName; t != "" && !others.Has(t) {
			errs = append(errs, field.NotFound(p.Child("targetContainerName"), t))
		}
		v := reflect.ValueOf(ec.EphemeralContainerCommon)
		for j := range v.NumField() {
			f := v.Type().Field(j)
			if ephemeralAllowed.Has(f.Name) || v.Field(j).IsZero() {
				continue
			}
			r, n := utf8.DecodeRuneInString(f.Name)
			errs = append(errs, field.Forbidden(p.Child(string(unicode.ToLower(r))+f.Name[n:]), "cannot be set for an Ephemeral Container"))
		}
		for j, m := range ec.VolumeMounts {
			mp := p.Child("volumeMounts").Index(j)
			if !volumes.Has(m.Name) {
				errs = append(errs, field.NotFound(mp.Child("name"), m.Name))
			}
			if m.SubPath != "" {
				errs = append(errs, field.Forbidden(mp.Child("subPath"), "cannot be set for an Ephemeral Container"))
			}
			if m.SubPathExpr != "" {
				errs = append(errs, field.Forbidden(mp.Child("subPathExpr"), "cannot be set for an Ephemeral Container"))
			}
		}
	}
	return errs
}
