package plugins

import (
	"context"

	"github.com/orch-dev/orch/internal/ingressclass"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// admitDefaultIngressClass is Kubernetes' DefaultIngressClass admission:
// a new Ingress that names no class (neither spec.ingressClassName nor
// the older kubernetes.io/ingress.class annotation) gets the class marked
// default, the newest when several are.
func (p *Plugins) admitDefaultIngressClass(ctx context.Context, obj, old runtime.Object) error {
	in := obj.(*networkingv1.Ingress)
	if old != nil || in.Spec.IngressClassName != nil {
		return nil
	}
	if _, ok := in.Annotations[ingressclass.Annotation]; ok {
		return nil
	}
	list, err := p.storage(networkingv1.GroupName, "ingressclasses").List(ctx, "", &metav1.ListOptions{})
	if err != nil {
		return err
	}
	var chosen *networkingv1.IngressClass
	for i := range list.(*networkingv1.IngressClassList).Items {
		c := &list.(*networkingv1.IngressClassList).Items[i]
		if c.Annotations[networkingv1.AnnotationIsDefaultIngressClass] != "true" {
			continue
		}
		if chosen == nil || c.CreationTimestamp.After(chosen.CreationTimestamp.Time) ||
			c.CreationTimestamp.Equal(&chosen.CreationTimestamp) && c.Name < chosen.Name {
			chosen = c
		}
	}
	if chosen != nil {
		name := chosen.Name
		in.Spec.IngressClassName = &name
	}
	return nil
}
