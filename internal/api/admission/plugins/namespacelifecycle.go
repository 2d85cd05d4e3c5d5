package plugins

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// namespaceLifecycle is Kubernetes' NamespaceLifecycle admission: objects
// go only into namespaces that exist, and new ones not into a namespace
// being deleted.
func (p *Plugins) namespaceLifecycle(gr schema.GroupResource) Func {
	return func(ctx context.Context, obj, old runtime.Object) error {
		m, err := meta.Accessor(obj)
		if err != nil {
			return apierrors.NewBadRequest(err.Error())
		}
		nsObj, err := p.storage("", "namespaces").Get(ctx, "", m.GetNamespace())
		if err != nil {
			return err
		}
		if ns := nsObj.(*corev1.Namespace); old == nil && (ns.DeletionTimestamp != nil || ns.Status.Phase == corev1.NamespaceTerminating) {
			msg := fmt.Sprintf("unable to create new content in namespace %s because it is being terminated", ns.Name)
			err := apierrors.NewForbidden(gr, m.GetName(), errors.New(msg))
			// The cause lets controllers tell this apart, as in Kubernetes.
			err.ErrStatus.Details.Causes = append(err.ErrStatus.Details.Causes, metav1.StatusCause{
				Type: corev1.NamespaceTerminatingCause, Message: msg, Field: "metadata.namespace"})
			return err
		}
		return nil
	}
}
