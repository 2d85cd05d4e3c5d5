package nodegraph

import (
	"context"
	"slices"
	"sync"

	"github.com/orch-dev/orch/internal/ingressclass"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// IngressSecrets is which Secrets the Ingresses orch serves name for
// TLS, kept from watches of Ingresses and IngressClasses: every node
// serves every such Ingress, so every node may read those Secrets, and
// no other Secret a pod of its does not use.
type IngressSecrets struct {
	mu sync.RWMutex
	// byNamespace holds each Ingress's class and TLS Secret names.
	byNamespace map[string]map[string]ingressTLS
	// classes are the IngressClasses, by name, with whether orch serves
	// them.
	classes map[string]bool
	// ingressesSynced and classesSynced close at their first lists.
	ingressesSynced, classesSynced chan struct{}
}

type ingressTLS struct {
	class   string
	secrets []string
}

// NewIngressSecrets is empty until both lists have come.
func NewIngressSecrets() *IngressSecrets {
	return &IngressSecrets{byNamespace: map[string]map[string]ingressTLS{}, classes: map[string]bool{},
		ingressesSynced: make(chan struct{}), classesSynced: make(chan struct{})}
}

func closeOnce(c chan struct{}) {
	select {
	case <-c:
	default:
		close(c)
	}
}

// Replace implements the API server's follower, for Ingresses.
func (s *IngressSecrets) Replace(objs []runtime.Object) {
	fresh := map[string]map[string]ingressTLS{}
	for _, o := range objs {
		in := o.(*networkingv1.Ingress)
		if fresh[in.Namespace] == nil {
			fresh[in.Namespace] = map[string]ingressTLS{}
		}
		fresh[in.Namespace][in.Name] = tlsOf(in)
	}
	s.mu.Lock()
	s.byNamespace = fresh
	s.mu.Unlock()
	closeOnce(s.ingressesSynced)
}

// Set implements the API server's follower, for Ingresses.
func (s *IngressSecrets) Set(obj runtime.Object) {
	in := obj.(*networkingv1.Ingress)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byNamespace[in.Namespace] == nil {
		s.byNamespace[in.Namespace] = map[string]ingressTLS{}
	}
	s.byNamespace[in.Namespace][in.Name] = tlsOf(in)
}

// Delete implements the API server's follower, for Ingresses.
func (s *IngressSecrets) Delete(obj runtime.Object) {
	in := obj.(*networkingv1.Ingress)
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byNamespace[in.Namespace], in.Name)
	if len(s.byNamespace[in.Namespace]) == 0 {
		delete(s.byNamespace, in.Namespace)
	}
}

func tlsOf(in *networkingv1.Ingress) ingressTLS {
	t := ingressTLS{class: ingressclass.Of(in)}
	for _, tl := range in.Spec.TLS {
		if tl.SecretName != "" && !slices.Contains(t.secrets, tl.SecretName) {
			t.secrets = append(t.secrets, tl.SecretName)
		}
	}
	return t
}

// Classes is the follower of IngressClasses.
func (s *IngressSecrets) Classes() ClassFollower { return ClassFollower{s} }

// ClassFollower keeps IngressSecrets' view of the IngressClasses.
type ClassFollower struct{ s *IngressSecrets }

// Replace implements the API server's follower, for IngressClasses.
func (f ClassFollower) Replace(objs []runtime.Object) {
	fresh := map[string]bool{}
	for _, o := range objs {
		c := o.(*networkingv1.IngressClass)
		fresh[c.Name] = c.Spec.Controller == ingressclass.Controller
	}
	f.s.mu.Lock()
	f.s.classes = fresh
	f.s.mu.Unlock()
	closeOnce(f.s.classesSynced)
}

// Set implements the API server's follower, for IngressClasses.
func (f ClassFollower) Set(obj runtime.Object) {
	c := obj.(*networkingv1.IngressClass)
	f.s.mu.Lock()
	f.s.classes[c.Name] = c.Spec.Controller == ingressclass.Controller
	f.s.mu.Unlock()
}

// Delete implements the API server's follower, for IngressClasses.
func (f ClassFollower) Delete(obj runtime.Object) {
	f.s.mu.Lock()
	delete(f.s.classes, obj.(*networkingv1.IngressClass).Name)
	f.s.mu.Unlock()
}

// Serves reports whether an Ingress orch serves names the Secret for
// TLS.
func (s *IngressSecrets) Serves(ctx context.Context, namespace, name string) (bool, error) {
	for _, c := range []chan struct{}{s.ingressesSynced, s.classesSynced} {
		select {
		case <-c:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, t := range s.byNamespace[namespace] {
		if s.classes[t.class] && slices.Contains(t.secrets, name) {
			return true, nil
		}
	}
	return false, nil
}
