package core

import (
	"github.com/orch-dev/orch/internal/api/resources"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func serviceAccounts() *resources.Resource {
	return resources.Described[corev1.ServiceAccount, corev1.ServiceAccountList](&resources.Resource{
		GroupVersionKind: resources.GVK("", "ServiceAccount"), Plural: "serviceaccounts", Singular: "serviceaccount",
		Namespaced: true, ShortNames: []string{"sa"}, StorageKey: "serviceaccounts",
		Columns: serviceAccountColumns, Row: resources.TypedRow(serviceAccountRow),
	})
}

var serviceAccountColumns = []metav1.TableColumnDefinition{resources.NameCol, resources.Col("Secrets", "string", 0, corev1.ServiceAccount{}.SwaggerDoc()["secrets"]), resources.AgeCol}

func serviceAccountRow(sa *corev1.ServiceAccount) []any {
	return []any{sa.Name, int64(len(sa.Secrets)), resources.Age(sa.CreationTimestamp)}
}
