package apps

import (
	"fmt"

	"github.com/orch-dev/orch/internal/api/resources"
	"github.com/orch-dev/orch/internal/api/resources/core"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

func statefulSets() *resources.Resource {
	return resources.Described[appsv1.StatefulSet, appsv1.StatefulSetList](&resources.Resource{
		StatusMetadata: resources.StatusMetadataAll, GroupVersionKind: resources.GVK("apps", "StatefulSet"), Plural: "statefulsets", Singular: "statefulset", Namespaced: true,
		ShortNames: []string{"sts"}, Categories: []string{"all"}, StorageKey: "statefulsets",
		Subresources: []resources.Subresource{resources.Status(), resources.ScaleOf(resources.ScaleAccess{
			Get: func(obj runtime.Object) (*int32, int32, *metav1.LabelSelector) {
				o := obj.(*appsv1.StatefulSet)
				return o.Spec.Replicas, o.Status.Replicas, o.Spec.Selector
			},
			Set: func(obj runtime.Object, n int32) { obj.(*appsv1.StatefulSet).Spec.Replicas = &n },
		})},
		HasSpec: true, Default: resources.Typed(defaultStatefulSet), Validate: resources.TypedValidate(validateStatefulSet),
		ValidateUpdate:   resources.TypedValidateUpdate(validateStatefulSetUpdate),
		PrepareForCreate: resources.Typed(func(s *appsv1.StatefulSet) { s.Status = appsv1.StatefulSetStatus{} }),
		Columns:          statefulSetColumns, Row: resources.TypedRow(statefulSetRow),
	})
}

func defaultStatefulSet(s *appsv1.StatefulSet) {
	spec := &s.Spec
	if spec.Replicas == nil {
		spec.Replicas = ptr.To[int32](1)
	}
	if spec.PodManagementPolicy == "" {
		spec.PodManagementPolicy = appsv1.OrderedReadyPodManagement
	}
	if spec.UpdateStrategy.Type == "" {
		spec.UpdateStrategy.Type = appsv1.RollingUpdateStatefulSetStrategyType
	}
	if spec.UpdateStrategy.Type == appsv1.RollingUpdateStatefulSetStrategyType {
		if spec.UpdateStrategy.RollingUpdate == nil {
			spec.UpdateStrategy.RollingUpdate = &appsv1.RollingUpdateStatefulSetStrategy{}
		}
		if spec.UpdateStrategy.RollingUpdate.Partition == nil {
			spec.UpdateStrategy.RollingUpdate.Partition = ptr.To[int32](0)
		}
	}
	if spec.RevisionHistoryLimit == nil {
		spec.RevisionHistoryLimit = ptr.To[int32](10)
	}
	if spec.PersistentVolumeClaimRetentionPolicy == nil {
		spec.PersistentVolumeClaimRetentionPolicy = &appsv1.StatefulSetPersistentVolumeClaimRetentionPolicy{}
	}
	if p := spec.PersistentVolumeClaimRetentionPolicy; p.WhenDeleted == "" {
		p.WhenDeleted = appsv1.RetainPersistentVolumeClaimRetentionPolicyType
	}
	if p := spec.PersistentVolumeClaimRetentionPolicy; p.WhenScaled == "" {
		p.WhenScaled = appsv1.RetainPersistentVolumeClaimRetentionPolicyType
	}
	core.DefaultPodTemplate(&spec.Template)
	for i := range spec.VolumeClaimTemplates {
		if c := &spec.VolumeClaimTemplates[i]; c.Spec.VolumeMode == nil {
			c.Spec.VolumeMode = ptr.To(corev1.PersistentVolumeFilesystem)
		}
	}
}

func validateStatefulSet(s *appsv1.StatefulSet) field.ErrorList {
	spec, p := &s.Spec, resources.SpecPath
	errs := resources.ValidateReplicas(spec.Replicas, p.Child("replicas"))
	// The template's mounts may name the claim templates: each pod gets a
	// volume of that name, as Kubernetes validates it.
	tmpl := spec.Template.DeepCopy()
	for _, c := range spec.VolumeClaimTemplates {
		tmpl.Spec.Volumes = append(tmpl.Spec.Volumes, corev1.Volume{Name: c.Name, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: c.Name}}})
	}
	errs = append(errs, core.ValidatePodTemplate(spec.Selector, tmpl, p)...)
	if spec.Template.Spec.RestartPolicy != corev1.RestartPolicyAlways {
		errs = append(errs, field.NotSupported(p.Child("template", "spec", "restartPolicy"), spec.Template.Spec.RestartPolicy, []string{string(corev1.RestartPolicyAlways)}))
	}
	if spec.ServiceName != "" {
		for _, msg := range validation.IsDNS1123Label(spec.ServiceName) {
			errs = append(errs, field.Invalid(p.Child("serviceName"), spec.ServiceName, msg))
		}
	}
	switch spec.PodManagementPolicy {
	case appsv1.OrderedReadyPodManagement, appsv1.ParallelPodManagement:
	default:
		errs = append(errs, field.NotSupported(p.Child("podManagementPolicy"), spec.PodManagementPolicy,
			[]string{string(appsv1.OrderedReadyPodManagement), string(appsv1.ParallelPodManagement)}))
	}
	strategy := p.Child("updateStrategy")
	switch spec.UpdateStrategy.Type {
	case appsv1.OnDeleteStatefulSetStrategyType:
		if spec.UpdateStrategy.RollingUpdate != nil {
			errs = append(errs, field.Invalid(strategy.Child("rollingUpdate"), spec.UpdateStrategy.RollingUpdate,
				fmt.Sprintf("only allowed for updateStrategy '%s'", appsv1.RollingUpdateStatefulSetStrategyType)))
		}
	case appsv1.RollingUpdateStatefulSetStrategyType:
		if ru := spec.UpdateStrategy.RollingUpdate; ru != nil {
			errs = append(errs, resources.ValidateReplicas(ru.Partition, strategy.Child("rollingUpdate", "partition"))...)
			if ru.MaxUnavailable != nil {
				errs = append(errs, validatePositiveIntOrPercent(*ru.MaxUnavailable, strategy.Child("rollingUpdate", "maxUnavailable"))...)
			}
		}
	default:
		errs = append(errs, field.NotSupported(strategy.Child("type"), spec.UpdateStrategy.Type,
			[]string{string(appsv1.OnDeleteStatefulSetStrategyType), string(appsv1.RollingUpdateStatefulSetStrategyType)}))
	}
	if spec.MinReadySeconds < 0 {
		errs = append(errs, field.Invalid(p.Child("minReadySeconds"), spec.MinReadySeconds, "must be greater than or equal to 0"))
	}
	if o := spec.Ordinals; o != nil && o.Start < 0 {
		errs = append(errs, field.Invalid(p.Child("ordinals", "start"), o.Start, "must be greater than or equal to 0"))
	}
	if r := spec.PersistentVolumeClaimRetentionPolicy; r != nil {
		for name, v := range map[string]appsv1.PersistentVolumeClaimRetentionPolicyType{"whenDeleted": r.WhenDeleted, "whenScaled": r.WhenScaled} {
			if v != appsv1.RetainPersistentVolumeClaimRetentionPolicyType && v != appsv1.DeletePersistentVolumeClaimRetentionPolicyType {
				errs = append(errs, field.NotSupported(p.Child("persistentVolumeClaimRetentionPolicy", name), v,
					[]string{string(appsv1.RetainPersistentVolumeClaimRetentionPolicyType), string(appsv1.DeletePersistentVolumeClaimRetentionPolicyType)}))
			}
		}
	}
	for i := range spec.VolumeClaimTemplates {
		c := &spec.VolumeClaimTemplates[i]
		path := p.Child("volumeClaimTemplates").Index(i)
		for _, msg := range validation.IsDNS1123Label(c.Name) {
			errs = append(errs, field.Invalid(path.Child("metadata", "name"), c.Name, msg))
		}
		errs = append(errs, core.ValidatePersistentVolumeClaimSpec(&c.Spec, path.Child("spec"))...)
	}
	return errs
}

func validatePositiveIntOrPercent(v intstr.IntOrString, path *field.Path) field.ErrorList {
	n, err := intstr.GetScaledValueFromIntOrPercent(&v, 100, true)
	if err != nil {
		return field.ErrorList{field.Invalid(path, v.String(), "a valid percent string must be a numeric string followed by an ending '%'")}
	}
	if n <= 0 {
		return field.ErrorList{field.Invalid(path, v.String(), "must be greater than 0")}
	}
	return nil
}

// validateStatefulSetUpdate: only the fields Kubernetes lets change may
// change, with its message.
func validateStatefulSetUpdate(s, old *appsv1.StatefulSet) field.ErrorList {
	was, now := old.Spec.DeepCopy(), s.Spec.DeepCopy()
	for _, spec := range []*appsv1.StatefulSetSpec{was, now} {
		spec.Replicas, spec.Ordinals, spec.Template, spec.UpdateStrategy = nil, nil, corev1.PodTemplateSpec{}, appsv1.StatefulSetUpdateStrategy{}
		spec.RevisionHistoryLimit, spec.PersistentVolumeClaimRetentionPolicy, spec.MinReadySeconds = nil, nil, 0
	}
	if !apiequality.Semantic.DeepEqual(was, now) {
		return field.ErrorList{field.Forbidden(resources.SpecPath, "updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'revisionHistoryLimit', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden")}
	}
	return nil
}

var statefulSetColumns = []metav1.TableColumnDefinition{
	resources.NameCol,
	resources.Col("Ready", "string", 0, "Number of the pod with ready state"),
	resources.AgeCol,
	resources.Col("Containers", "string", 1, "Names of each container in the template."),
	resources.Col("Images", "string", 1, "Images referenced by each container in the template."),
}

func statefulSetRow(s *appsv1.StatefulSet) []any {
	names, images := core.ContainersAndImages(&s.Spec.Template.Spec)
	return []any{s.Name, fmt.Sprintf("%d/%d", s.Status.ReadyReplicas, replicas(s.Spec.Replicas)), resources.Age(s.CreationTimestamp), names, images}
}
