package core

import (
	"encoding/json"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/orch-dev/orch/internal/api/resources"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

func secrets() *resources.Resource {
	return resources.Described[corev1.Secret, corev1.SecretList](&resources.Resource{
		GroupVersionKind: resources.GVK("", "Secret"), Plural: "secrets", Singular: "secret", Namespaced: true,
		StorageKey: "secrets", Default: resources.Typed(defaultSecret), Validate: resources.TypedValidate(validateSecret),
		ValidateUpdate: resources.TypedValidateUpdate(func(s, old *corev1.Secret) field.ErrorList {
			errs := resources.Immutable(s.Type, old.Type, field.NewPath("type"))
			return append(errs, validateImmutableData(s.Immutable, old.Immutable, s.Data, old.Data)...)
		}),
		Fields:  resources.TypedFields(func(s *corev1.Secret) fields.Set { return fields.Set{"type": string(s.Type)} }),
		Columns: secretColumns, Row: resources.TypedRow(secretRow),
	})
}

func defaultSecret(s *corev1.Secret) {
	if s.Type == "" {
		s.Type = corev1.SecretTypeOpaque
	}
	// stringData is write-only: Kubernetes folds it into data, where it
	// wins over a key of the same name, and never stores or returns it.
	for k, v := range s.StringData {
		if s.Data == nil {
			s.Data = map[string][]byte{}
		}
		s.Data[k] = []byte(v)
	}
	s.StringData = nil
}

func validateSecret(s *corev1.Secret) field.ErrorList {
	errs := validateDataKeys(s.Data, field.NewPath("data"))
	size := 0
	for _, v := range s.Data {
		size += len(v)
	}
	if size > corev1.MaxSecretSize {
		errs = append(errs, field.TooLong(field.NewPath("data"), "", corev1.MaxSecretSize))
	}
	// A service-account token Secret names its account, as Kubernetes
	// requires: the token loop fills it in for that account.
	if s.Type == corev1.SecretTypeServiceAccountToken && s.Annotations[corev1.ServiceAccountNameKey] == "" {
		errs = append(errs, field.Required(field.NewPath("metadata", "annotations").Key(corev1.ServiceAccountNameKey), ""))
	}
	// A registry credential must parse, as Kubernetes checks: a node would
	// otherwise find out only when it pulls.
	for typ, key := range map[corev1.SecretType]string{corev1.SecretTypeDockerConfigJson: corev1.DockerConfigJsonKey, corev1.SecretTypeDockercfg: corev1.DockerConfigKey} {
		if s.Type != typ {
			continue
		}
		data, ok := s.Data[key]
		if !ok {
			errs = append(errs, field.Required(field.NewPath("data").Key(key), ""))
			continue
		}
		var parsed map[string]any
		if err := json.Unmarshal(data, &parsed); err != nil {
			errs = append(errs, field.Invalid(field.NewPath("data").Key(key), "<secret contents redacted>", err.Error()))
		}
	}
	return errs
}

var secretColumns = []metav1.TableColumnDefinition{resources.NameCol, resources.Col("Type", "string", 0, corev1.Secret{}.SwaggerDoc()["type"]),
	resources.Col("Data", "string", 0, corev1.Secret{}.SwaggerDoc()["data"]), resources.AgeCol}

func secretRow(s *corev1.Secret) []any {
	return []any{s.Name, string(s.Type), int64(len(s.Data)), resources.Age(s.CreationTimestamp)}
}
