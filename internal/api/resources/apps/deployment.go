package apps

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/orch-dev/orch/internal/api/resources"
	"github.com/orch-dev/orch/internal/api/resources/core"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

func deployments() *resources.Resource {
	return resources.Described[appsv1.Deployment, appsv1.DeploymentList](&resources.Resource{
		StatusMetadata: []string{"annotations", "finalizers", "ownerReferences"}, GroupVersionKind: resources.GVK("apps", "Deployment"), Plural: "deployments", Singular: "deployment", Namespaced: true,
		ShortNames: []string{"deploy"}, Categories: []string{"all"}, StorageKey: "deployments",
		Subresources: []resources.Subresource{resources.Status(), resources.ScaleOf(resources.ScaleAccess{
			Get: func(obj runtime.Object) (*int32, int32, *metav1.LabelSelector) {
				o := obj.(*appsv1.Deployment)
				return o.Spec.Replicas, o.Status.Replicas, o.Spec.Selector
			},
			Set: func(obj runtime.Object, n int32) { obj.(*appsv1.Deployment).Spec.Replicas = &n },
		})},
		HasSpec: true, Default: resources.Typed(defaultDeployment), Validate: resources.TypedValidate(validateDeployment),
		ValidateUpdate: resources.TypedValidateUpdate(func(d, old *appsv1.Deployment) field.ErrorList {
			return resources.Immutable(d.Spec.Selector, old.Spec.Selector, resources.SpecPath.Child("selector"))
		}),
		PrepareForCreate: resources.Typed(func(d *appsv1.Deployment) { d.Status = appsv1.DeploymentStatus{} }),
		Columns:          deploymentColumns, Row: resources.TypedRow(deploymentRow),
	})
}

func defaultDeployment(d *appsv1.Deployment) {
	if d.Spec.Replicas == nil {
		d.Spec.Replicas = ptr.To[int32](1)
	}
	s := &d.Spec.Strategy
	if s.Type == "" {
		s.Type = appsv1.RollingUpdateDeploymentStrategyType
	}
	if s.Type == appsv1.RollingUpdateDeploymentStrategyType {
		if s.RollingUpdate == nil {
			s.RollingUpdate = &appsv1.RollingUpdateDeployment{}
		}
		if s.RollingUpdate.MaxUnavailable == nil {
			s.RollingUpdate.MaxUnavailable = ptr.To(intstr.FromString("25%"))
		}
		if s.RollingUpdate.MaxSurge == nil {
			s.RollingUpdate.MaxSurge = ptr.To(intstr.FromString("25%"))
		}
	}
	if d.Spec.RevisionHistoryLimit == nil {
		d.Spec.RevisionHistoryLimit = ptr.To[int32](10)
	}
	if d.Spec.ProgressDeadlineSeconds == nil {
		d.Spec.ProgressDeadlineSeconds = ptr.To[int32](600)
	}
	core.DefaultPodTemplate(&d.Spec.Template)
}

func validateDeployment(d *appsv1.Deployment) field.ErrorList {
	errs := resources.ValidateReplicas(d.Spec.Replicas, resources.SpecPath.Child("replicas"))
	errs = append(errs, core.ValidatePodTemplate(d.Spec.Selector, &d.Spec.Template, resources.SpecPath)...)
	if d.Spec.Template.Spec.RestartPolicy != corev1.RestartPolicyAlways {
		errs = append(errs, field.NotSupported(resources.SpecPath.Child("template", "spec", "restartPolicy"), d.Spec.Template.Spec.RestartPolicy, []string{string(corev1.RestartPolicyAlways)}))
	}
	switch d.Spec.Strategy.Type {
	case appsv1.RecreateDeploymentStrategyType:
		if d.Spec.Strategy.RollingUpdate != nil {
			errs = append(errs, field.Forbidden(resources.SpecPath.Child("strategy", "rollingUpdate"), "may not be specified when strategy `type` is 'Recreate'"))
		}
	case appsv1.RollingUpdateDeploymentStrategyType:
	default:
		errs = append(errs, field.NotSupported(resources.SpecPath.Child("strategy", "type"), d.Spec.Strategy.Type,
			[]string{string(appsv1.RecreateDeploymentStrategyType), string(appsv1.RollingUpdateDeploymentStrategyType)}))
	}
	return errs
}

var deploymentColumns = []metav1.TableColumnDefinition{
	resources.NameCol,
	resources.Col("Ready", "string", 0, "Number of the pod with ready state"),
	resources.Col("Up-to-date", "string", 0, appsv1.DeploymentStatus{}.SwaggerDoc()["updatedReplicas"]),
	resources.Col("Available", "string", 0, appsv1.DeploymentStatus{}.SwaggerDoc()["availableReplicas"]),
	resources.AgeCol,
	resources.Col("Containers", "string", 1, "Names of each container in the template."),
	resources.Col("Images", "string", 1, "Images referenced by each container in the template."),
	resources.Col("Selector", "string", 1, appsv1.DeploymentSpec{}.SwaggerDoc()["selector"]),
}

func deploymentRow(d *appsv1.Deployment) []any {
	names, images := core.ContainersAndImages(&d.Spec.Template.Spec)
	return []any{d.Name, fmt.Sprintf("%d/%d", d.Status.ReadyReplicas, replicas(d.Spec.Replicas)), int64(d.Status.UpdatedReplicas),
		int64(d.Status.AvailableReplicas), resources.Age(d.CreationTimestamp), names, images, resources.SelectorString(d.Spec.Selector)}
}
