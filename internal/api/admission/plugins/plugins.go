// Package plugins is the API server's built-in admission, one file per
// plugin as in Kubernetes' plugin/pkg/admission: NamespaceLifecycle,
// ServiceAccount, NodeRestriction, RuntimeClass, DefaultStorageClass,
// LimitRanger, Priority, DefaultIngressClass, PodSecurity and ResourceQuota, and
// orch's OneUpgrade. Plugins.For chains the ones a
// resource takes in one fixed order, as kube-apiserver's plugin list
// does; the admission the cluster configures (../webhook, ../policy)
// runs after them and ResourceQuota last, which the registry sees to.
//
// A plugin here both mutates and validates in one step, so the order
// keeps what Kubernetes gets from running every mutation before any
// validation: a pod's RuntimeClass overhead is set before LimitRanger
// checks the pod's total, for instance.
package plugins

import (
	"context"
	"log/slog"

	"github.com/orch-dev/orch/internal/api/admission/podsecurity"
	"github.com/orch-dev/orch/internal/api/registry"
	"github.com/orch-dev/orch/internal/api/resources"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Func is one admission step for a write: obj is the object being written,
// which the step may change; old is the stored one on an update, nil on a
// create. It refuses with a Kubernetes StatusError.
type Func = func(ctx context.Context, obj, old runtime.Object) error

// Storages finds the storage of a served resource, which plugins read
// (and ResourceQuota writes the status of).
type Storages func(group, resource string) *registry.Storage

// Plugins is the built-in admission of one API server.
type Plugins struct {
	storage     Storages
	log         *slog.Logger
	quota       quotaBatches
	podSecurity *podsecurity.Admission
}

// New returns the built-in admission reading objects through storage.
func New(storage Storages, log *slog.Logger) *Plugins {
	return &Plugins{storage: storage, log: log}
}

// plugin is one entry of the ordered list: the resources it admits.
type plugin struct {
	name      string
	resources []schema.GroupResource
	admit     func(gr schema.GroupResource) Func
}

var (
	podsResource    = schema.GroupResource{Resource: "pods"}
	claimsResource  = schema.GroupResource{Resource: "persistentvolumeclaims"}
	priorityClasses = schema.GroupResource{Group: "scheduling.k8s.io", Resource: "priorityclasses"}
	ingresses       = schema.GroupResource{Group: "networking.k8s.io", Resource: "ingresses"}
	nodeScoped      = []schema.GroupResource{{Resource: "nodes"}, podsResource, {Group: "coordination.k8s.io", Resource: "leases"}}
)

// ordered is the plugins in the order they run.
func (p *Plugins) ordered() []plugin {
	same := func(f Func) func(schema.GroupResource) Func { return func(schema.GroupResource) Func { return f } }
	return []plugin{
		{"ServiceAccount", []schema.GroupResource{podsResource}, same(p.admitServiceAccount)},
		{"NodeRestriction", nodeScoped, nodeRestriction},
		{"RuntimeClass", []schema.GroupResource{podsResource}, same(p.admitRuntimeClass)},
		{"DefaultStorageClass", []schema.GroupResource{claimsResource}, same(p.admitDefaultStorageClass)},
		{"LimitRanger", []schema.GroupResource{podsResource}, same(p.admitLimitRanges)},
		{"LimitRanger", []schema.GroupResource{claimsResource}, same(p.admitClaimLimitRanges)},
		{"Priority", []schema.GroupResource{podsResource}, same(p.admitPodPriority)},
		{"Priority", []schema.GroupResource{priorityClasses}, same(p.admitPriorityClass)},
		{"DefaultIngressClass", []schema.GroupResource{ingresses}, same(p.admitDefaultIngressClass)},
		// orch's own: one Upgrade plan at a time.
		{"OneUpgrade", []schema.GroupResource{upgradesResource}, same(p.admitOneUpgrade)},
		// A validating plugin in Kubernetes: it sees pods as the
		// mutating ones above left them.
		{"PodSecurity", append([]schema.GroupResource{podsResource, namespacesResource}, podsecurity.ControllerResources...), p.admitPodSecurity},
	}
}

// For is the built-in admission of writes to r before the cluster's own
// (webhooks, policies), then extra, the resource's own steps (a Service's
// addresses, RBAC's escalation check): NamespaceLifecycle first for a
// namespaced resource, then each plugin that handles r, in order. It is
// nil when there is none.
func (p *Plugins) For(r *resources.Resource, extra ...Func) Func {
	gr := r.GroupResource()
	var steps []Func
	if r.Namespaced {
		steps = append(steps, p.namespaceLifecycle(gr))
	}
	for _, pl := range p.ordered() {
		for _, handled := range pl.resources {
			if handled == gr {
				steps = append(steps, pl.admit(gr))
			}
		}
	}
	steps = append(steps, extra...)
	switch len(steps) {
	case 0:
		return nil
	case 1:
		return steps[0]
	}
	return func(ctx context.Context, obj, old runtime.Object) error {
		for _, step := range steps {
			if err := step(ctx, obj, old); err != nil {
				return err
			}
		}
		return nil
	}
}

// Quota is ResourceQuota's admission of creates of r, which runs after
// every other (the cluster's webhooks too) and charges what they let
// through; nil for a resource no quota counts.
func (p *Plugins) Quota(r *resources.Resource) Func {
	if !r.Namespaced || r.Review != nil {
		return nil
	}
	return p.admitQuota(r.GroupResource())
}

// AdmitDelete is the built-in admission of deletes of r (the system's
// PriorityClasses stay), or nil.
func (p *Plugins) AdmitDelete(r *resources.Resource) func(ctx context.Context, obj runtime.Object) error {
	if r.GroupResource() == priorityClasses {
		return keepSystemPriorityClasses
	}
	return nil
}
