package api

import (
	"context"
	"net"
	"strconv"

	"github.com/orch-dev/orch/internal/api/openapi"
	"k8s.io/kube-openapi/pkg/validation/spec"

	"github.com/orch-dev/orch/internal/api/admission"
	"github.com/orch-dev/orch/internal/api/admission/policy"
	"github.com/orch-dev/orch/internal/api/admission/webhook"
	"github.com/orch-dev/orch/internal/api/registry"
	"github.com/orch-dev/orch/internal/api/rest"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// newWebhooks makes the dispatcher of the cluster's admission webhooks,
// reaching Services' endpoints directly, without the node's proxy.
func (s *Server) newWebhooks() *webhook.Dispatcher {
	return webhook.New(webhookServices{s}, func(ctx context.Context, name string) (map[string]string, error) {
		obj, err := s.storage("", "namespaces").Get(ctx, "", name)
		if err != nil {
			return nil, err
		}
		return obj.(*corev1.Namespace).Labels, nil
	}, policy.Conditions{Authz: s.authz}, s.log.With("component", "admission-webhooks"))
}

// newPolicies makes the evaluators of the cluster's Mutating- and
// ValidatingAdmissionPolicies.
func (s *Server) newPolicies() (*policy.Mutating, *policy.Validating) {
	namespace := func(ctx context.Context, name string) (*corev1.Namespace, error) {
		obj, err := s.storage("", "namespaces").Get(ctx, "", name)
		if err != nil {
			return nil, err
		}
		return obj.(*corev1.Namespace), nil
	}
	log := s.log.With("component", "admission-policies")
	return policy.NewMutating(s.paramKind, namespace, s.authz, log), policy.NewValidating(s.paramKind, namespace, s.authz, log)
}

// clusterAdmission is the admission the cluster configures, in
// Kubernetes' order: mutating policies, mutating webhooks, then
// validating policies, validating webhooks.
func (s *Server) clusterAdmission() admission.Interface {
	return admission.Chain{s.mutatingPolicies, s.policies, s.webhooks}
}

// followAdmission keeps the webhook configurations, policies and bindings
// current until ctx ends.
func (s *Server) followAdmission(ctx context.Context) {
	group := admissionregistrationv1.GroupName
	go follow(ctx, s.storage(group, "mutatingwebhookconfigurations"), s.webhooks.Mutating(), s.log)
	go follow(ctx, s.storage(group, "validatingwebhookconfigurations"), s.webhooks.Validating(), s.log)
	go follow(ctx, s.storage(group, "validatingadmissionpolicies"), policyStatus{s.policies.Policies(), s, ctx}, s.log)
	go follow(ctx, s.storage(group, "validatingadmissionpolicybindings"), s.policies.Bindings(), s.log)
	go follow(ctx, s.storage(group, "mutatingadmissionpolicies"), s.mutatingPolicies.Policies(), s.log)
	go follow(ctx, s.storage(group, "mutatingadmissionpolicybindings"), s.mutatingPolicies.Bindings(), s.log)
}

// paramKind finds the served kind a policy takes its parameters from.
func (s *Server) paramKind(gvk schema.GroupVersionKind) (policy.ParamStore, bool) {
	for _, st := range s.catalog.Load().Storages {
		if st.Resource.GroupVersionKind == gvk && st.Resource.NewList != nil {
			return paramStore{st}, true
		}
	}
	return nil, false
}

// paramStore reads parameter objects from their storage.
type paramStore struct{ st *registry.Storage }

func (p paramStore) Namespaced() bool { return p.st.Resource.Namespaced }

func (p paramStore) Get(ctx context.Context, namespace, name string) (runtime.Object, error) {
	return p.st.Get(ctx, namespace, name)
}

func (p paramStore) List(ctx context.Context, namespace string, sel labels.Selector) ([]runtime.Object, error) {
	list, err := p.st.List(ctx, namespace, &metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, err
	}
	return meta.ExtractList(list)
}

// webhookServices resolves a webhook's Service to a ready endpoint, and
// reaches it as the server reaches pods.
type webhookServices struct{ s *Server }

func (w webhookServices) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return w.s.podDial.DialContext(ctx, network, addr)
}

func (w webhookServices) ResolveService(ctx context.Context, namespace, name string, port int32) (string, error) {
	return rest.ServiceEndpoint(ctx, w.s.storage("", "services"), w.s.storage("discovery.k8s.io", "endpointslices"), namespace, name, strconv.Itoa(int(port)))
}

// policyStatus feeds the policies and records in each one's status that
// the server has read its generation and what type checking its
// expressions against the matched kinds' schemas found, as Kubernetes'
// policy controller does.
type policyStatus struct {
	policy.Follower
	s   *Server
	ctx context.Context
}

func (f policyStatus) Replace(objs []runtime.Object) {
	f.Follower.Replace(objs)
	for _, o := range objs {
		f.report(o)
	}
}

func (f policyStatus) Set(obj runtime.Object) {
	f.Follower.Set(obj)
	f.report(obj)
}

func (f policyStatus) report(obj runtime.Object) {
	p, ok := obj.(*admissionregistrationv1.ValidatingAdmissionPolicy)
	if !ok || p.Status.ObservedGeneration == p.Generation {
		return
	}
	st := f.s.storage(admissionregistrationv1.GroupName, "validatingadmissionpolicies")
	go func() {
		_, _, err := st.Update(f.ctx, "", p.Name, func(_ context.Context, current runtime.Object) (runtime.Object, error) {
			if current == nil {
				return nil, apierrors.NewNotFound(st.Resource.GroupResource(), p.Name)
			}
			cur := current.(*admissionregistrationv1.ValidatingAdmissionPolicy).DeepCopy()
			cur.Status.ObservedGeneration = cur.Generation
			cur.Status.TypeChecking = &admissionregistrationv1.TypeChecking{ExpressionWarnings: f.s.typeChecker().Check(cur)}
			return cur, nil
		}, registry.UpdateOptions{Subresource: "status", WriteOptions: registry.WriteOptions{FieldManager: "orch-admission-policies"}})
		if err != nil && !apierrors.IsNotFound(err) && f.ctx.Err() == nil {
			f.s.log.Warn("recording a policy's observed generation", "policy", p.Name, "err", err)
		}
	}()
}

// typeChecker checks policies against the served kinds' OpenAPI schemas.
func (s *Server) typeChecker() policy.TypeChecker {
	_, served := s.catalog.Resources()
	return policy.TypeChecker{
		Kind: func(gvr schema.GroupVersionResource) (schema.GroupVersionKind, bool) {
			if st := s.catalog.Load().Storage(gvr); st != nil {
				return st.Resource.GroupVersionKind, true
			}
			return schema.GroupVersionKind{}, false
		},
		Schema: func(gvk schema.GroupVersionKind) (*spec.Schema, error) { return openapi.KindSchema(gvk, served) },
	}
}
