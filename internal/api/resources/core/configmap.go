package core

import (
	"github.com/orch-dev/orch/internal/api/resources"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

func configMaps() *resources.Resource {
	return resources.Described[corev1.ConfigMap, corev1.ConfigMapList](&resources.Resource{
		GroupVersionKind: resources.GVK("", "ConfigMap"), Plural: "configmaps", Singular: "configmap", Namespaced: true,
		ShortNames: []string{"cm"}, StorageKey: "configmaps", Validate: resources.TypedValidate(validateConfigMap),
		ValidateUpdate: resources.TypedValidateUpdate(func(cm, old *corev1.ConfigMap) field.ErrorList {
			errs := validateImmutableData(cm.Immutable, old.Immutable, cm.Data, old.Data)
			return append(errs, validateImmutableData(cm.Immutable, old.Immutable, cm.BinaryData, old.BinaryData)...)
		}),
		Columns: configMapColumns, Row: resources.TypedRow(configMapRow),
	})
}

func validateConfigMap(cm *corev1.ConfigMap) field.ErrorList {
	errs := validateDataKeys(cm.Data, field.NewPath("data"))
	errs = append(errs, validateDataKeys(cm.BinaryData, field.NewPath("binaryData"))...)
	size := 0
	for k, v := range cm.Data {
		size += len(v)
		if _, ok := cm.BinaryData[k]; ok {
			errs = append(errs, field.Invalid(field.NewPath("data").Key(k), k, "duplicate of key present in binaryData"))
		}
	}
	for _, v := range cm.BinaryData {
		size += len(v)
	}
	if size > corev1.MaxSecretSize {
		// The whole object's path, as Kubernetes reports it.
		errs = append(errs, field.TooLong(field.NewPath(""), "", corev1.MaxSecretSize))
	}
	return errs
}

func validateDataKeys[V any](data map[string]V, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for k := range data {
		for _, msg := range validation.IsConfigMapKey(k) {
			errs = append(errs, field.Invalid(path.Key(k), k, msg))
		}
	}
	return errs
}

// validateImmutableData enforces `immutable: true` on ConfigMaps and Secrets.
func validateImmutableData(isImmutable, wasImmutable *bool, data, oldData any) field.ErrorList {
	if wasImmutable == nil || !*wasImmutable {
		return nil
	}
	var errs field.ErrorList
	if isImmutable == nil || !*isImmutable {
		errs = append(errs, field.Forbidden(field.NewPath("immutable"), "field is immutable when `immutable` is set"))
	}
	if !apiequality.Semantic.DeepEqual(data, oldData) {
		errs = append(errs, field.Forbidden(field.NewPath("data"), "field is immutable when `immutable` is set"))
	}
	return errs
}

var configMapColumns = []metav1.TableColumnDefinition{resources.NameCol, resources.Col("Data", "integer", 0, corev1.ConfigMap{}.SwaggerDoc()["data"]), resources.AgeCol}

func configMapRow(cm *corev1.ConfigMap) []any {
	return []any{cm.Name, int64(len(cm.Data) + len(cm.BinaryData)), resources.Age(cm.CreationTimestamp)}
}
