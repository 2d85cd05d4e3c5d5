package core

import (
	"github.com/orch-dev/orch/internal/api/resources"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

func persistentVolumeClaims() *resources.Resource {
	return resources.Described[corev1.PersistentVolumeClaim, corev1.PersistentVolumeClaimList](&resources.Resource{
		StatusMetadata: resources.StatusMetadataAll, GroupVersionKind: resources.GVK("", "PersistentVolumeClaim"), Plural: "persistentvolumeclaims", Singular: "persistentvolumeclaim", Namespaced: true,
		ShortNames: []string{"pvc"}, Subresources: []resources.Subresource{resources.Status()}, StorageKey: "persistentvolumeclaims",
		HasSpec: true, Default: resources.Typed(defaultPersistentVolumeClaim), Validate: resources.TypedValidate(validatePersistentVolumeClaim),
		ValidateUpdate: resources.TypedValidateUpdate(validatePersistentVolumeClaimUpdate),
		PrepareForCreate: resources.Typed(func(pvc *corev1.PersistentVolumeClaim) {
			pvc.Status = corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimPending}
			addFinalizer(&pvc.ObjectMeta, PVCProtectionFinalizer)
		}),
		Columns: persistentVolumeClaimColumns, Row: resources.TypedRow(persistentVolumeClaimRow),
	})
}

func defaultPersistentVolumeClaim(pvc *corev1.PersistentVolumeClaim) {
	if pvc.Spec.VolumeMode == nil {
		mode := corev1.PersistentVolumeFilesystem
		pvc.Spec.VolumeMode = &mode
	}
}

func validatePersistentVolumeClaim(pvc *corev1.PersistentVolumeClaim) field.ErrorList {
	return ValidatePersistentVolumeClaimSpec(&pvc.Spec, resources.SpecPath)
}

// ValidatePersistentVolumeClaimSpec checks a claim's spec at path (a
// claim's own, or a StatefulSet's volumeClaimTemplates').
func ValidatePersistentVolumeClaimSpec(spec *corev1.PersistentVolumeClaimSpec, p *field.Path) field.ErrorList {
	errs := validateAccessModes(spec.AccessModes, p.Child("accessModes"))
	if spec.Selector != nil {
		errs = append(errs, metav1validation.ValidateLabelSelector(spec.Selector, metav1validation.LabelSelectorValidationOptions{}, p.Child("selector"))...)
	}
	storage := p.Child("resources").Key(string(corev1.ResourceStorage))
	if q, ok := spec.Resources.Requests[corev1.ResourceStorage]; !ok {
		errs = append(errs, field.Required(storage, ""))
	} else {
		errs = append(errs, validatePositiveStorage(q, storage)...)
	}
	if spec.StorageClassName != nil {
		errs = append(errs, validateStorageClassName(*spec.StorageClassName, p.Child("storageClassName"))...)
	}
	return append(errs, validateVolumeMode(spec.VolumeMode, p.Child("volumeMode"))...)
}

// validatePersistentVolumeClaimUpdate: the spec is fixed once made, but
// for what binding fills in once (volumeName, and a class a claim without
// one gets).
func validatePersistentVolumeClaimUpdate(pvc, old *corev1.PersistentVolumeClaim) field.ErrorList {
	was := old.Spec.DeepCopy()
	if was.VolumeName == "" {
		was.VolumeName = pvc.Spec.VolumeName
	}
	if was.StorageClassName == nil {
		was.StorageClassName = pvc.Spec.StorageClassName
	}
	if apiequality.Semantic.DeepEqual(*was, pvc.Spec) {
		return nil
	}
	return field.ErrorList{field.Forbidden(resources.SpecPath, "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims")}
}

var persistentVolumeClaimColumns = []metav1.TableColumnDefinition{
	resources.NameCol,
	resources.Col("Status", "string", 0, corev1.PersistentVolumeClaimStatus{}.SwaggerDoc()["phase"]),
	resources.Col("Volume", "string", 0, corev1.PersistentVolumeClaimSpec{}.SwaggerDoc()["volumeName"]),
	resources.Col("Capacity", "string", 0, corev1.PersistentVolumeClaimStatus{}.SwaggerDoc()["capacity"]),
	resources.Col("Access Modes", "string", 0, corev1.PersistentVolumeClaimStatus{}.SwaggerDoc()["accessModes"]),
	resources.Col("StorageClass", "string", 0, "StorageClass of the pvc"),
	resources.Col("VolumeAttributesClass", "string", 0, "VolumeAttributesClass of the pvc"),
	resources.AgeCol,
	resources.Col("VolumeMode", "string", 1, corev1.PersistentVolumeClaimSpec{}.SwaggerDoc()["volumeMode"]),
}

func persistentVolumeClaimRow(pvc *corev1.PersistentVolumeClaim) []any {
	phase := string(pvc.Status.Phase)
	if pvc.DeletionTimestamp != nil {
		phase = "Terminating"
	}
	capacity, modes := "", ""
	if pvc.Spec.VolumeName != "" {
		if q, ok := pvc.Status.Capacity[corev1.ResourceStorage]; ok {
			capacity = q.String()
		}
		modes = AccessModesString(pvc.Status.AccessModes)
	}
	class := ""
	if pvc.Spec.StorageClassName != nil {
		class = *pvc.Spec.StorageClassName
	}
	mode, vac := "<unset>", "<unset>"
	if pvc.Spec.VolumeMode != nil {
		mode = string(*pvc.Spec.VolumeMode)
	}
	if pvc.Spec.VolumeAttributesClassName != nil {
		vac = *pvc.Spec.VolumeAttributesClassName
	}
	return []any{pvc.Name, phase, pvc.Spec.VolumeName, capacity, modes, class, vac, resources.Age(pvc.CreationTimestamp), mode}
}
