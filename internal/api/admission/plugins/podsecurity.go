package plugins

import (
	"context"
	"fmt"

	"github.com/orch-dev/orch/internal/api/admission"
	"github.com/orch-dev/orch/internal/api/admission/podsecurity"
	"github.com/orch-dev/orch/internal/api/auth"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var namespacesResource = schema.GroupResource{Resource: "namespaces"}

// UsePodSecurity turns on Pod Security Admission with the cluster's
// defaults and exemptions (Kubernetes has it on, privileged by default).
func (p *Plugins) UsePodSecurity(cfg podsecurity.Config) error {
	a, err := podsecurity.New(cfg, storedNamespaces{p})
	if err != nil {
		return err
	}
	p.podSecurity = a
	return nil
}

// admitPodSecurity is the PodSecurity plugin: pods are checked against
// their namespace's levels, controllers' templates warned about,
// namespaces' labels checked. Warnings go to the client; what the audit
// level finds is logged (orch keeps no audit log).
func (p *Plugins) admitPodSecurity(gr schema.GroupResource) Func {
	return func(ctx context.Context, obj, old runtime.Object) error {
		if p.podSecurity == nil {
			return nil
		}
		r := podsecurity.Request{Resource: gr}
		if u, ok := auth.UserFrom(ctx); ok {
			r.User = u.Name
		}
		if a := admission.AttributesFrom(ctx); a != nil {
			r.Subresource = a.Subresource
		}
		if m, err := meta.Accessor(obj); err == nil {
			r.Namespace, r.Name = m.GetNamespace(), m.GetName()
		}
		var v podsecurity.Verdict
		switch o := obj.(type) {
		case *corev1.Pod:
			prev, _ := old.(*corev1.Pod)
			v = p.podSecurity.AdmitPod(ctx, r, o, prev)
		case *corev1.Namespace:
			prev, _ := old.(*corev1.Namespace)
			v = p.podSecurity.AdmitNamespace(ctx, r, o, prev)
		default:
			v = p.podSecurity.AdmitController(ctx, r, obj)
		}
		for _, w := range v.Warnings {
			admission.Warn(ctx, w)
		}
		if v.Audit != "" {
			p.log.Info("pod security audit", "resource", gr.String(), "namespace", r.Namespace, "name", r.Name, "user", r.User, "violations", v.Audit)
		}
		return v.Err
	}
}

// storedNamespaces reads namespaces and pods from the server's storage.
type storedNamespaces struct{ p *Plugins }

func (s storedNamespaces) Namespace(ctx context.Context, name string) (*corev1.Namespace, error) {
	obj, err := s.p.storage("", "namespaces").Get(ctx, "", name)
	if err != nil {
		return nil, err
	}
	ns, ok := obj.(*corev1.Namespace)
	if !ok {
		return nil, fmt.Errorf("namespace %s: unexpected %T", name, obj)
	}
	return ns, nil
}

func (s storedNamespaces) Pods(ctx context.Context, namespace string) ([]*corev1.Pod, error) {
	obj, err := s.p.storage("", "pods").List(ctx, namespace, &metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	list, ok := obj.(*corev1.PodList)
	if !ok {
		return nil, fmt.Errorf("pods of %s: unexpected %T", namespace, obj)
	}
	pods := make([]*corev1.Pod, len(list.Items))
	for i := range list.Items {
		pods[i] = &list.Items[i]
	}
	return pods, nil
}
