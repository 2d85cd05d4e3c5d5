package core

import (
	"github.com/orch-dev/orch/internal/api/resources"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// podTemplates are stored pod templates: nothing acts on them, tools and
// older controllers keep templates in them.
func podTemplates() *resources.Resource {
	return resources.Described[corev1.PodTemplate, corev1.PodTemplateList](&resources.Resource{
		GroupVersionKind: resources.GVK("", "PodTemplate"), Plural: "podtemplates", Singular: "podtemplate", Namespaced: true,
		StorageKey: "podtemplates", Default: resources.Typed(func(pt *corev1.PodTemplate) { DefaultPodTemplate(&pt.Template) }),
		Validate: resources.TypedValidate(func(pt *corev1.PodTemplate) field.ErrorList {
			return ValidatePodTemplateSpec(&pt.Template, field.NewPath("template"))
		}),
		Columns: podTemplateColumns, Row: resources.TypedRow(podTemplateRow),
	})
}

var podTemplateColumns = []metav1.TableColumnDefinition{
	resources.NameCol,
	resources.Col("Containers", "string", 0, "Names of each container in the template."),
	resources.Col("Images", "string", 0, "Images referenced by each container in the template."),
	resources.Col("Pod Labels", "string", 0, "The labels for the pod template."),
}

func podTemplateRow(pt *corev1.PodTemplate) []any {
	names, images := ContainersAndImages(&pt.Template.Spec)
	return []any{pt.Name, names, images, resources.OrNone(labels.Set(pt.Template.Labels).String())}
}
