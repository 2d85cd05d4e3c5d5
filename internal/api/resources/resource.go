// Package resources describes every resource the API serves: its names in
// discovery, where it is stored, and its strategy — the defaults Kubernetes
// applies on admission, validation, the fields it can be selected by, how it
// is deleted, and the columns `kubectl get` shows.
//
// Types come from k8s.io/api. Nothing here touches storage or HTTP; the
// registry and the REST handlers read these descriptions.
package resources

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Resource is one served resource (pods, deployments.apps, ...).
type Resource struct {
	schema.GroupVersionKind
	Plural     string
	Singular   string
	Namespaced bool
	ShortNames []string
	Categories []string
	// Subresources lists "status", "scale", "binding" where Kubernetes has them.
	Subresources []string
	// StorageKey is the resource's name in storage keys: /registry/<StorageKey>/...
	StorageKey string
	// Volatile, when set, names the namespaces whose objects live in the
	// store's memory tier; "*" means every object of the resource.
	Volatile []string
	// AllowCreateOnUpdate lets PUT create a missing object, as Kubernetes does
	// for endpoints, leases and events.
	AllowCreateOnUpdate bool
	// HasSpec says a change of .spec bumps metadata.generation.
	HasSpec bool
	// OrphanByDefault: a delete that names no propagation policy orphans
	// the dependents (batch/v1 Jobs, for compatibility, as in Kubernetes);
	// otherwise the default is background deletion.
	OrphanByDefault bool

	New     func() runtime.Object
	NewList func() runtime.Object
	// StorageNew, ToStorage and FromStorage are set when the resource is a
	// view of objects stored in another shape (events.k8s.io Events are core
	// Events underneath).
	StorageNew  func() runtime.Object
	ToStorage   func(runtime.Object) runtime.Object
	FromStorage func(runtime.Object) runtime.Object

	// Default applies Kubernetes' defaults (admission) before validation.
	Default func(obj runtime.Object)
	// Validate checks an object about to be created.
	Validate func(obj runtime.Object) field.ErrorList
	// ValidateUpdate checks an update; it also runs Validate on the new object.
	ValidateUpdate func(obj, old runtime.Object) field.ErrorList
	// PrepareForCreate clears what a client may not set on create (status).
	PrepareForCreate func(obj runtime.Object)
	// Fields returns the fields the resource may be selected by, beyond
	// metadata.name and metadata.namespace.
	Fields func(obj runtime.Object) fields.Set
	// GracePeriod returns how long deletion waits for the object's owner
	// (the kubelet for pods) to finish it; zero deletes at once.
	GracePeriod func(obj runtime.Object, requested *int64) int64
	// BeginDelete, when set, marks an object whose deletion also waits on
	// something other than metadata.finalizers (a namespace's
	// spec.finalizers) and reports whether it must wait.
	BeginDelete func(obj runtime.Object) bool
	// Columns and Row give the table `kubectl get` prints; columns with
	// Priority 1 appear with -o wide only.
	Columns []metav1.TableColumnDefinition
	Row     func(obj runtime.Object) []any
}

// GroupVersionResource of the resource.
func (r *Resource) GroupVersionResource() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: r.Group, Version: r.Version, Resource: r.Plural}
}

// HasSubresource reports whether sub is served for the resource.
func (r *Resource) HasSubresource(sub string) bool {
	for _, s := range r.Subresources {
		if s == sub {
			return true
		}
	}
	return false
}

// FieldSet returns every field of obj that a field selector may name.
func (r *Resource) FieldSet(obj runtime.Object) fields.Set {
	set := fields.Set{}
	if m, err := meta.Accessor(obj); err == nil {
		set["metadata.name"] = m.GetName()
		if r.Namespaced {
			set["metadata.namespace"] = m.GetNamespace()
		}
	}
	if r.Fields != nil {
		for k, v := range r.Fields(obj) {
			set[k] = v
		}
	}
	return set
}

// newOf builds the New and NewList functions for a k8s.io/api type pair.
func newOf[T any, L any, PT interface {
	*T
	runtime.Object
}, PL interface {
	*L
	runtime.Object
}]() (func() runtime.Object, func() runtime.Object) {
	return func() runtime.Object { return PT(new(T)) }, func() runtime.Object { return PL(new(L)) }
}
