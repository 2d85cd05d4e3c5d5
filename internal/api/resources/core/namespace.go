package core

import (
	"github.com/orch-dev/orch/internal/api/resources"
	corev1 "k8s.io/api/core/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
)

func namespaces() *resources.Resource {
	return resources.Described[corev1.Namespace, corev1.NamespaceList](&resources.Resource{
		StatusMetadata: resources.StatusMetadataAll, GroupVersionKind: resources.GVK("", "Namespace"), Plural: "namespaces", Singular: "namespace",
		ShortNames: []string{"ns"}, StorageKey: "namespaces", NameRule: apivalidation.NameIsDNSLabel,
		Subresources: []resources.Subresource{resources.Status(),
			// The namespace controller sets spec.finalizers through it once
			// the namespace is empty.
			{Name: "finalize", Serve: resources.ServeAction, Verbs: metav1.Verbs{"update"},
				NewBody: func() runtime.Object { return &corev1.Namespace{} },
				Apply: func(body, current runtime.Object) (runtime.Object, error) {
					want := body.(*corev1.Namespace)
					ns := current.(*corev1.Namespace).DeepCopy()
					ns.Spec.Finalizers = want.Spec.Finalizers
					ns.ResourceVersion = want.ResourceVersion
					return ns, nil
				}},
		},
		Default: resources.Typed(defaultNamespace), Columns: namespaceColumns, Row: resources.TypedRow(namespaceRow),
		Fields:           resources.TypedFields(func(ns *corev1.Namespace) fields.Set { return fields.Set{"status.phase": string(ns.Status.Phase)} }),
		PrepareForCreate: resources.Typed(func(ns *corev1.Namespace) { ns.Status = corev1.NamespaceStatus{Phase: corev1.NamespaceActive} }),
		BeginDelete: func(obj runtime.Object) bool {
			ns := obj.(*corev1.Namespace)
			ns.Status.Phase = corev1.NamespaceTerminating
			return len(ns.Spec.Finalizers) > 0
		},
	})
}

func defaultNamespace(ns *corev1.Namespace) {
	if ns.Labels == nil {
		ns.Labels = map[string]string{}
	}
	ns.Labels[corev1.LabelMetadataName] = ns.Name
	if len(ns.Spec.Finalizers) == 0 && ns.DeletionTimestamp == nil {
		ns.Spec.Finalizers = []corev1.FinalizerName{corev1.FinalizerKubernetes}
	}
	if ns.Status.Phase == "" {
		ns.Status.Phase = corev1.NamespaceActive
	}
}

var namespaceColumns = []metav1.TableColumnDefinition{resources.NameCol, resources.Col("Status", "string", 0, "The status of the namespace"), resources.AgeCol}

func namespaceRow(ns *corev1.Namespace) []any {
	return []any{ns.Name, string(ns.Status.Phase), resources.Age(ns.CreationTimestamp)}
}
