package core

import (
	"strconv"

	"github.com/orch-dev/orch/internal/api/resources"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

// replicationControllers are the ReplicaSets' predecessors, which older
// charts, tools and the conformance suite still use: the ReplicaSet loop
// keeps them too.
func replicationControllers() *resources.Resource {
	return resources.Described[corev1.ReplicationController, corev1.ReplicationControllerList](&resources.Resource{
		StatusMetadata:   resources.StatusMetadataAll,
		GroupVersionKind: resources.GVK("", "ReplicationController"), Plural: "replicationcontrollers", Singular: "replicationcontroller",
		Namespaced: true, ShortNames: []string{"rc"}, Categories: []string{"all"}, StorageKey: "controllers",
		// v1's old default, which Kubernetes keeps (kubectl names a policy).
		OrphanByDefault: true,
		Subresources: []resources.Subresource{resources.Status(), resources.ScaleOf(resources.ScaleAccess{
			Get: func(obj runtime.Object) (*int32, int32, *metav1.LabelSelector) {
				o := obj.(*corev1.ReplicationController)
				return o.Spec.Replicas, o.Status.Replicas, &metav1.LabelSelector{MatchLabels: o.Spec.Selector}
			},
			Set: func(obj runtime.Object, n int32) { obj.(*corev1.ReplicationController).Spec.Replicas = &n },
		})},
		HasSpec: true, Default: resources.Typed(defaultReplicationController), Validate: resources.TypedValidate(validateReplicationController),
		PrepareForCreate: resources.Typed(func(rc *corev1.ReplicationController) { rc.Status = corev1.ReplicationControllerStatus{} }),
		Fields: resources.TypedFields(func(rc *corev1.ReplicationController) fields.Set {
			return fields.Set{"status.replicas": strconv.Itoa(int(rc.Status.Replicas))}
		}),
		Columns: replicationControllerColumns, Row: resources.TypedRow(replicationControllerRow),
	})
}

// defaultReplicationController is Kubernetes' v1 defaulting: the selector
// and the controller's labels default to the template's labels, and one
// replica.
func defaultReplicationController(rc *corev1.ReplicationController) {
	if t := rc.Spec.Template; t != nil {
		if len(rc.Spec.Selector) == 0 {
			rc.Spec.Selector = t.Labels
		}
		if len(rc.Labels) == 0 {
			rc.Labels = t.Labels
		}
		DefaultPodTemplate(t)
	}
	if rc.Spec.Replicas == nil {
		rc.Spec.Replicas = ptr.To[int32](1)
	}
}

func validateReplicationController(rc *corev1.ReplicationController) field.ErrorList {
	spec := resources.SpecPath
	errs := resources.ValidateReplicas(rc.Spec.Replicas, spec.Child("replicas"))
	if rc.Spec.MinReadySeconds < 0 {
		errs = append(errs, field.Invalid(spec.Child("minReadySeconds"), rc.Spec.MinReadySeconds, "must be greater than or equal to 0"))
	}
	if len(rc.Spec.Selector) == 0 {
		errs = append(errs, field.Required(spec.Child("selector"), ""))
	}
	if rc.Spec.Template == nil {
		return append(errs, field.Required(spec.Child("template"), ""))
	}
	if !labels.SelectorFromSet(rc.Spec.Selector).Matches(labels.Set(rc.Spec.Template.Labels)) {
		errs = append(errs, field.Invalid(spec.Child("template", "metadata", "labels"), rc.Spec.Template.Labels, "`selector` does not match template `labels`"))
	}
	if p := rc.Spec.Template.Spec.RestartPolicy; p != corev1.RestartPolicyAlways {
		errs = append(errs, field.NotSupported(spec.Child("template", "spec", "restartPolicy"), p, []string{string(corev1.RestartPolicyAlways)}))
	}
	return append(errs, ValidatePodTemplateSpec(rc.Spec.Template, spec.Child("template"))...)
}

var replicationControllerColumns = []metav1.TableColumnDefinition{
	resources.NameCol,
	resources.Col("Desired", "integer", 0, corev1.ReplicationControllerSpec{}.SwaggerDoc()["replicas"]),
	resources.Col("Current", "integer", 0, corev1.ReplicationControllerStatus{}.SwaggerDoc()["replicas"]),
	resources.Col("Ready", "integer", 0, corev1.ReplicationControllerStatus{}.SwaggerDoc()["readyReplicas"]),
	resources.AgeCol,
	resources.Col("Containers", "string", 1, "Names of each container in the template."),
	resources.Col("Images", "string", 1, "Images referenced by each container in the template."),
	resources.Col("Selector", "string", 1, corev1.ReplicationControllerSpec{}.SwaggerDoc()["selector"]),
}

func replicationControllerRow(rc *corev1.ReplicationController) []any {
	names, images := "", ""
	if rc.Spec.Template != nil {
		names, images = ContainersAndImages(&rc.Spec.Template.Spec)
	}
	return []any{rc.Name, int64(ptr.Deref(rc.Spec.Replicas, 1)), int64(rc.Status.Replicas), int64(rc.Status.ReadyReplicas),
		resources.Age(rc.CreationTimestamp), names, images, resources.OrNone(labels.Set(rc.Spec.Selector).String())}
}
