package apps

import (
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/orch-dev/orch/internal/api/resources"
	"github.com/orch-dev/orch/internal/api/resources/core"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

func replicaSets() *resources.Resource {
	return resources.Described[appsv1.ReplicaSet, appsv1.ReplicaSetList](&resources.Resource{
		StatusMetadata: resources.StatusMetadataAll, GroupVersionKind: resources.GVK("apps", "ReplicaSet"), Plural: "replicasets", Singular: "replicaset", Namespaced: true,
		ShortNames: []string{"rs"}, Categories: []string{"all"}, StorageKey: "replicasets",
		Subresources: []resources.Subresource{resources.Status(), resources.ScaleOf(resources.ScaleAccess{
			Get: func(obj runtime.Object) (*int32, int32, *metav1.LabelSelector) {
				o := obj.(*appsv1.ReplicaSet)
				return o.Spec.Replicas, o.Status.Replicas, o.Spec.Selector
			},
			Set: func(obj runtime.Object, n int32) { obj.(*appsv1.ReplicaSet).Spec.Replicas = &n },
		})},
		HasSpec: true, Default: resources.Typed(defaultReplicaSet), Validate: resources.TypedValidate(validateReplicaSet),
		ValidateUpdate: resources.TypedValidateUpdate(func(rs, old *appsv1.ReplicaSet) field.ErrorList {
			return resources.Immutable(rs.Spec.Selector, old.Spec.Selector, resources.SpecPath.Child("selector"))
		}),
		PrepareForCreate: resources.Typed(func(rs *appsv1.ReplicaSet) { rs.Status = appsv1.ReplicaSetStatus{} }),
		Fields: resources.TypedFields(func(rs *appsv1.ReplicaSet) fields.Set {
			return fields.Set{"status.replicas": strconv.Itoa(int(rs.Status.Replicas))}
		}),
		Columns: replicaSetColumns, Row: resources.TypedRow(replicaSetRow),
	})
}

func defaultReplicaSet(rs *appsv1.ReplicaSet) {
	if rs.Spec.Replicas == nil {
		rs.Spec.Replicas = ptr.To[int32](1)
	}
	core.DefaultPodTemplate(&rs.Spec.Template)
}

func validateReplicaSet(rs *appsv1.ReplicaSet) field.ErrorList {
	errs := resources.ValidateReplicas(rs.Spec.Replicas, resources.SpecPath.Child("replicas"))
	return append(errs, core.ValidatePodTemplate(rs.Spec.Selector, &rs.Spec.Template, resources.SpecPath)...)
}

var replicaSetColumns = []metav1.TableColumnDefinition{
	resources.NameCol,
	resources.Col("Desired", "integer", 0, appsv1.ReplicaSetSpec{}.SwaggerDoc()["replicas"]),
	resources.Col("Current", "integer", 0, appsv1.ReplicaSetStatus{}.SwaggerDoc()["replicas"]),
	resources.Col("Ready", "integer", 0, appsv1.ReplicaSetStatus{}.SwaggerDoc()["readyReplicas"]),
	resources.AgeCol,
	resources.Col("Containers", "string", 1, "Names of each container in the template."),
	resources.Col("Images", "string", 1, "Images referenced by each container in the template."),
	resources.Col("Selector", "string", 1, appsv1.ReplicaSetSpec{}.SwaggerDoc()["selector"]),
}

func replicaSetRow(rs *appsv1.ReplicaSet) []any {
	names, images := core.ContainersAndImages(&rs.Spec.Template.Spec)
	return []any{rs.Name, int64(replicas(rs.Spec.Replicas)), int64(rs.Status.Replicas), int64(rs.Status.ReadyReplicas),
		resources.Age(rs.CreationTimestamp), names, images, resources.SelectorString(rs.Spec.Selector)}
}
