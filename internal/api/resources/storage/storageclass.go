// Package storage describes the kinds of the storage.k8s.io API group:
// the StorageClasses claims name to get volumes made for them.
package storage

import (
	"github.com/orch-dev/orch/internal/api/resources"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

// Resources describes the storage.k8s.io group's kinds.
func Resources() []*resources.Resource {
	return []*resources.Resource{storageClasses(), csiDrivers(), csiNodes(), csiStorageCapacities(), volumeAttachments(), volumeAttributesClasses()}
}

// DefaultClassAnnotation marks the class a claim naming none gets.
const DefaultClassAnnotation = "storageclass.kubernetes.io/is-default-class"

func storageClasses() *resources.Resource {
	return resources.Described[storagev1.StorageClass, storagev1.StorageClassList](&resources.Resource{
		GroupVersionKind: resources.GVK(storagev1.GroupName, "StorageClass"), Plural: "storageclasses", Singular: "storageclass",
		ShortNames: []string{"sc"}, StorageKey: "storageclasses",
		Default: resources.Typed(defaultStorageClass), Validate: resources.TypedValidate(validateStorageClass),
		ValidateUpdate: resources.TypedValidateUpdate(func(sc, old *storagev1.StorageClass) field.ErrorList {
			var errs field.ErrorList
			// Kubernetes' words for each.
			for _, f := range []struct {
				name      string
				same      bool
				forbidden string
			}{
				{"parameters", equalMaps(sc.Parameters, old.Parameters), "updates to parameters are forbidden."},
				{"provisioner", sc.Provisioner == old.Provisioner, "updates to provisioner are forbidden."},
				{"reclaimPolicy", ptr.Deref(sc.ReclaimPolicy, "") == ptr.Deref(old.ReclaimPolicy, ""), "updates to reclaimPolicy are forbidden."},
			} {
				if !f.same {
					errs = append(errs, field.Forbidden(field.NewPath(f.name), f.forbidden))
				}
			}
			return append(errs, resources.Immutable(sc.VolumeBindingMode, old.VolumeBindingMode, field.NewPath("volumeBindingMode"))...)
		}),
		Columns: storageClassColumns, Row: resources.TypedRow(storageClassRow),
	})
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func defaultStorageClass(sc *storagev1.StorageClass) {
	if sc.ReclaimPolicy == nil {
		sc.ReclaimPolicy = ptr.To(corev1.PersistentVolumeReclaimDelete)
	}
	if sc.VolumeBindingMode == nil {
		sc.VolumeBindingMode = ptr.To(storagev1.VolumeBindingImmediate)
	}
}

// maxParameters and maxParametersSize bound a class's parameters, as
// Kubernetes does.
const (
	maxParameters     = 512
	maxParametersSize = 256 * 1024
)

func validateStorageClass(sc *storagev1.StorageClass) field.ErrorList {
	var errs field.ErrorList
	p := field.NewPath("provisioner")
	switch {
	case sc.Provisioner == "":
		errs = append(errs, field.Required(p, ""))
	case len(sc.Provisioner) > 63:
		errs = append(errs, field.TooLong(p, sc.Provisioner, 63))
	default:
		for _, msg := range validation.IsQualifiedName(sc.Provisioner) {
			errs = append(errs, field.Invalid(p, sc.Provisioner, msg))
		}
	}
	size := 0
	for k, v := range sc.Parameters {
		if k == "" {
			errs = append(errs, field.Invalid(field.NewPath("parameters"), sc.Parameters, "parameter key must not be empty"))
		}
		size += len(k) + len(v)
	}
	if len(sc.Parameters) > maxParameters {
		errs = append(errs, field.TooLong(field.NewPath("parameters"), sc.Parameters, maxParameters))
	}
	if size > maxParametersSize {
		errs = append(errs, field.TooLong(field.NewPath("parameters"), "", maxParametersSize))
	}
	if r := ptr.Deref(sc.ReclaimPolicy, ""); r != corev1.PersistentVolumeReclaimDelete && r != corev1.PersistentVolumeReclaimRetain {
		errs = append(errs, field.NotSupported(field.NewPath("reclaimPolicy"), r,
			[]string{string(corev1.PersistentVolumeReclaimDelete), string(corev1.PersistentVolumeReclaimRetain)}))
	}
	if m := ptr.Deref(sc.VolumeBindingMode, ""); m != storagev1.VolumeBindingImmediate && m != storagev1.VolumeBindingWaitForFirstConsumer {
		errs = append(errs, field.NotSupported(field.NewPath("volumeBindingMode"), m,
			[]string{string(storagev1.VolumeBindingImmediate), string(storagev1.VolumeBindingWaitForFirstConsumer)}))
	}
	return errs
}

var storageClassColumns = []metav1.TableColumnDefinition{
	resources.NameCol,
	resources.Col("Provisioner", "string", 0, storagev1.StorageClass{}.SwaggerDoc()["provisioner"]),
	resources.Col("ReclaimPolicy", "string", 0, storagev1.StorageClass{}.SwaggerDoc()["reclaimPolicy"]),
	resources.Col("VolumeBindingMode", "string", 0, storagev1.StorageClass{}.SwaggerDoc()["volumeBindingMode"]),
	resources.Col("AllowVolumeExpansion", "string", 0, storagev1.StorageClass{}.SwaggerDoc()["allowVolumeExpansion"]),
	resources.AgeCol,
}

func storageClassRow(sc *storagev1.StorageClass) []any {
	name := sc.Name
	if IsDefaultClass(sc) {
		name += " (default)"
	}
	return []any{name, sc.Provisioner, string(ptr.Deref(sc.ReclaimPolicy, corev1.PersistentVolumeReclaimDelete)),
		string(ptr.Deref(sc.VolumeBindingMode, storagev1.VolumeBindingImmediate)), ptr.Deref(sc.AllowVolumeExpansion, false), resources.Age(sc.CreationTimestamp)}
}

// IsDefaultClass says whether the class is marked default (the beta
// annotation counts too, as in Kubernetes).
func IsDefaultClass(sc *storagev1.StorageClass) bool {
	return sc.Annotations[DefaultClassAnnotation] == "true" || sc.Annotations["storageclass.beta.kubernetes.io/is-default-class"] == "true"
}
