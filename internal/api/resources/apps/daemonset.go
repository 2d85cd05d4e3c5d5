package apps

import (
	"github.com/orch-dev/orch/internal/api/resources"
	"github.com/orch-dev/orch/internal/api/resources/core"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

func daemonSets() *resources.Resource {
	return resources.Described[appsv1.DaemonSet, appsv1.DaemonSetList](&resources.Resource{
		StatusMetadata: resources.StatusMetadataAll, GroupVersionKind: resources.GVK("apps", "DaemonSet"), Plural: "daemonsets", Singular: "daemonset", Namespaced: true,
		ShortNames: []string{"ds"}, Categories: []string{"all"}, Subresources: []resources.Subresource{resources.Status()}, StorageKey: "daemonsets",
		HasSpec: true, Default: resources.Typed(defaultDaemonSet), Validate: resources.TypedValidate(validateDaemonSet),
		ValidateUpdate: resources.TypedValidateUpdate(func(ds, old *appsv1.DaemonSet) field.ErrorList {
			return resources.Immutable(ds.Spec.Selector, old.Spec.Selector, resources.SpecPath.Child("selector"))
		}),
		PrepareForCreate: resources.Typed(func(ds *appsv1.DaemonSet) { ds.Status = appsv1.DaemonSetStatus{} }),
		Columns:          daemonSetColumns, Row: resources.TypedRow(daemonSetRow),
	})
}

func defaultDaemonSet(ds *appsv1.DaemonSet) {
	s := &ds.Spec.UpdateStrategy
	if s.Type == "" {
		s.Type = appsv1.RollingUpdateDaemonSetStrategyType
	}
	if s.Type == appsv1.RollingUpdateDaemonSetStrategyType {
		if s.RollingUpdate == nil {
			s.RollingUpdate = &appsv1.RollingUpdateDaemonSet{}
		}
		if s.RollingUpdate.MaxUnavailable == nil {
			s.RollingUpdate.MaxUnavailable = ptr.To(intstr.FromInt32(1))
		}
		if s.RollingUpdate.MaxSurge == nil {
			s.RollingUpdate.MaxSurge = ptr.To(intstr.FromInt32(0))
		}
	}
	if ds.Spec.RevisionHistoryLimit == nil {
		ds.Spec.RevisionHistoryLimit = ptr.To[int32](10)
	}
	core.DefaultPodTemplate(&ds.Spec.Template)
}

func validateDaemonSet(ds *appsv1.DaemonSet) field.ErrorList {
	return core.ValidatePodTemplate(ds.Spec.Selector, &ds.Spec.Template, resources.SpecPath)
}

var daemonSetColumns = []metav1.TableColumnDefinition{
	resources.NameCol,
	resources.Col("Desired", "integer", 0, appsv1.DaemonSetStatus{}.SwaggerDoc()["desiredNumberScheduled"]),
	resources.Col("Current", "integer", 0, appsv1.DaemonSetStatus{}.SwaggerDoc()["currentNumberScheduled"]),
	resources.Col("Ready", "integer", 0, appsv1.DaemonSetStatus{}.SwaggerDoc()["numberReady"]),
	resources.Col("Up-to-date", "integer", 0, appsv1.DaemonSetStatus{}.SwaggerDoc()["updatedNumberScheduled"]),
	resources.Col("Available", "integer", 0, appsv1.DaemonSetStatus{}.SwaggerDoc()["numberAvailable"]),
	resources.Col("Node Selector", "string", 0, corev1.PodSpec{}.SwaggerDoc()["nodeSelector"]),
	resources.AgeCol,
	resources.Col("Containers", "string", 1, "Names of each container in the template."),
	resources.Col("Images", "string", 1, "Images referenced by each container in the template."),
	resources.Col("Selector", "string", 1, appsv1.DaemonSetSpec{}.SwaggerDoc()["selector"]),
}

func daemonSetRow(ds *appsv1.DaemonSet) []any {
	names, images := core.ContainersAndImages(&ds.Spec.Template.Spec)
	s := ds.Status
	return []any{ds.Name, int64(s.DesiredNumberScheduled), int64(s.CurrentNumberScheduled), int64(s.NumberReady),
		int64(s.UpdatedNumberScheduled), int64(s.NumberAvailable), resources.OrNone(labels.FormatLabels(ds.Spec.Template.Spec.NodeSelector)),
		resources.Age(ds.CreationTimestamp), names, images, resources.SelectorString(ds.Spec.Selector)}
}
