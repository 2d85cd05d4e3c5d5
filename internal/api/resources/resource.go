// Package resources is the shape of a served resource's description: its
// names in discovery, where it is stored, and its strategy — the defaults
// Kubernetes applies on admission, validation, name rules, the fields it
// can be selected by, how it is deleted, its subresources and the columns
// `kubectl get` shows — with the helpers the descriptions share.
//
// The descriptions themselves live one kind to a file in a package per API
// group (core, apps, batch, ...); builtin lists them. Types come from
// k8s.io/api. Nothing here touches storage or HTTP; the registry, the REST
// handlers and the OpenAPI documents read these descriptions.
package resources

import (
	"context"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/managedfields"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

// Resource is one served resource (pods, deployments.apps, ...).
type Resource struct {
	schema.GroupVersionKind
	Plural     string
	Singular   string
	Namespaced bool
	ShortNames []string
	Categories []string
	// Subresources are served under the object's path, as in Kubernetes.
	Subresources []Subresource
	// StatusMetadata names the metadata fields (labels, annotations,
	// finalizers, ownerReferences) an update of the status subresource
	// may change too: Kubernetes' older kinds take them from a status
	// write, newer kinds and custom resources take none.
	StatusMetadata []string
	// StorageKey is the resource's name in storage keys: /registry/<StorageKey>/...
	// Kubernetes' keys for built-in kinds are the plural (with a few
	// historical exceptions); custom resources are <group>/<plural>.
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
	// NameRule checks metadata.name (and a generateName prefix); nil is
	// Kubernetes' default, a DNS subdomain.
	NameRule func(name string, prefix bool) []string

	New     func() runtime.Object
	NewList func() runtime.Object
	// Review, when set, makes the resource a question rather than
	// something stored (the access reviews, SelfSubjectReview): only
	// create is served, Validate runs on the body, and the answer is
	// Review's, kept nowhere. NewList is nil.
	Review func(ctx context.Context, obj runtime.Object) (runtime.Object, error)
	// Live, when set, makes the resource a view the server computes when it
	// is read (metrics.k8s.io's node and pod metrics): only get and list
	// are served, by Live; nothing is stored.
	Live Live
	// StorageNew, ToStorage and FromStorage are set when the resource is a
	// view of objects stored in another shape (events.k8s.io Events are core
	// Events underneath, a custom resource's versions are its storage
	// version's); FromStorage also finishes what is read as it is stored
	// (a custom resource is defaulted on read). Their errors are
	// Kubernetes StatusErrors.
	StorageNew  func() runtime.Object
	ToStorage   func(runtime.Object) (runtime.Object, error)
	FromStorage func(runtime.Object) (runtime.Object, error)
	// Equivalents are the other served versions of the same objects (a
	// custom resource's), each converting an object of any of them to its
	// own with FromStorage: what admission's matchPolicy Equivalent
	// matches.
	Equivalents []*Resource

	// Default applies Kubernetes' defaults (admission) before validation.
	Default func(obj runtime.Object)
	// PrepareForUpdate, when set, adjusts an update of the object itself
	// before its defaults (Kubernetes' strategies drop the fields a change
	// makes meaningless, such as a Service's cluster IP on becoming an
	// ExternalName).
	PrepareForUpdate func(obj, old runtime.Object)
	// Validate checks an object about to be created.
	Validate func(obj runtime.Object) field.ErrorList
	// ValidateUpdate checks an update; it also runs Validate on the new object.
	ValidateUpdate func(obj, old runtime.Object) field.ErrorList
	// Rules, when set, checks what depends on the old object (nil on
	// create): a custom resource's x-kubernetes-validations with their
	// transition rules, or a built-in kind's checks of creates only.
	Rules func(obj, old runtime.Object) field.ErrorList
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
	// Warn, when set, returns warnings about an object being written,
	// sent to the client as Warning headers (kubectl prints them).
	Warn func(obj runtime.Object) []string
	// Normalize, when set, brings an object decoded from a client to the
	// resource's shape before it is stored: custom resources drop the
	// fields their schema does not know (returned, for fieldValidation)
	// and take their schema's defaults.
	Normalize func(obj runtime.Object) (unknownFields []string)
	// Generational, when set, says whether an update changes what
	// metadata.generation counts (instead of a change of .spec, with
	// HasSpec).
	Generational func(obj, old runtime.Object) bool
	// Custom marks a kind a CustomResourceDefinition defines: unstructured
	// objects, in JSON only (no protobuf, no strategic merge patch).
	Custom bool
	// OpenAPISchema, when set, is the kind's schema in the OpenAPI
	// documents (a custom resource's, from its definition) instead of one
	// reflected from New's type.
	OpenAPISchema *spec.Schema
	// OpenAPISchemaV2 is a custom resource's schema as OpenAPI v2 (Swagger)
	// publishes it, what v2 and the kubectl of its day cannot read taken
	// out (Kubernetes' v2 conversion); nil for built-in kinds.
	OpenAPISchemaV2 *spec.Schema
	// TypeConverter, when set, is what server-side apply merges the kind
	// with (a custom resource's schema) instead of Kubernetes' built-in
	// schema.
	TypeConverter managedfields.TypeConverter
	// Columns and Row give the table `kubectl get` prints; columns with
	// Priority 1 appear with -o wide only. Without them the table is
	// Kubernetes' default: name and creation time.
	Columns []metav1.TableColumnDefinition
	Row     func(obj runtime.Object) []any
}

// Live reads a resource that is computed rather than stored.
type Live interface {
	Get(ctx context.Context, namespace, name string) (runtime.Object, error)
	List(ctx context.Context, namespace string, opts *metav1.ListOptions) (runtime.Object, error)
}

// GroupVersionResource of the resource.
func (r *Resource) GroupVersionResource() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: r.Group, Version: r.Version, Resource: r.Plural}
}

// GroupResource of the resource.
func (r *Resource) GroupResource() schema.GroupResource {
	return schema.GroupResource{Group: r.Group, Resource: r.Plural}
}

// Subresource returns the named subresource, or nil if it is not served.
func (r *Resource) Subresource(name string) *Subresource {
	for i := range r.Subresources {
		if r.Subresources[i].Name == name {
			return &r.Subresources[i]
		}
	}
	return nil
}

// HasSubresource reports whether sub is served for the resource.
func (r *Resource) HasSubresource(sub string) bool { return r.Subresource(sub) != nil }

// Scale is the scale subresource's view of the resource, if it has one.
func (r *Resource) Scale() *ScaleAccess {
	if s := r.Subresource("scale"); s != nil {
		return s.Scale
	}
	return nil
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

// Serving is how the REST layer serves a subresource.
type Serving int

const (
	// ServeStatus serves the object itself, of which only .status may
	// change (or what the subresource's own strategy allows).
	ServeStatus Serving = iota
	// ServeScale serves an autoscaling/v1 Scale over the resource's replicas.
	ServeScale
	// ServeAction takes a body (Binding, Namespace) that changes the object
	// through Apply.
	ServeAction
	// ServeLog serves a container's log, fetched from the pod's node.
	ServeLog
	// ServeStream serves exec, attach or port-forward, an upgraded stream to the
	// pod's node.
	ServeStream
	// ServeAnswer takes a body about the object and answers with what
	// Answer makes of the two, leaving the object as it is
	// (serviceaccounts/token).
	ServeAnswer
	// ServeNodeProxy passes a GET of the path after the subresource to the
	// node's kubelet API (nodes/proxy: the Summary API).
	ServeNodeProxy
	// ServeProxy passes a request for the path after the subresource to a
	// pod, or to a ready endpoint of a Service (pods/proxy,
	// services/proxy).
	ServeProxy
)

// Subresource is one subresource of a resource.
type Subresource struct {
	Name  string
	Serve Serving
	// Kind is what the subresource speaks when not the parent's kind
	// (Scale, Binding, PodExecOptions), as discovery lists it.
	Kind schema.GroupVersionKind
	// Verbs as discovery lists them.
	Verbs metav1.Verbs
	// Scale reads and sets the replicas of a ServeScale subresource.
	Scale *ScaleAccess
	// NewBody and Apply serve a ServeAction subresource: Apply returns
	// current (never nil) as changed by body, or an API error.
	NewBody func() runtime.Object
	Apply   func(body, current runtime.Object) (runtime.Object, error)
	// Answer serves a ServeAnswer subresource: the response to body
	// about current (never nil), or an API error. A Status answered
	// with a Code is sent with that code.
	Answer func(ctx context.Context, body, current runtime.Object, opts AnswerOptions) (runtime.Object, error)
	// Created: the action answers 201 with a Success Status (as
	// pods/binding does) instead of the changed object.
	Created bool
	// PrepareForUpdate and ValidateUpdate, when set, are a ServeStatus
	// subresource's own strategy, in place of the resource's (a
	// CertificateSigningRequest's approval changes only its Approved
	// and Denied conditions, its status only the certificate and the
	// others). PrepareForUpdate runs after the status was taken from
	// what was sent.
	PrepareForUpdate func(obj, old runtime.Object)
	ValidateUpdate   func(obj, old runtime.Object) field.ErrorList
	// Field is the path of what a ServeStatus subresource writes, taken
	// from what was sent while the rest is kept as stored: .status when
	// nil. A field under .spec (a pod's ephemeral containers) is a spec
	// change: it counts in metadata.generation, and the resource's
	// StatusMetadata does not apply.
	Field []string
}

// Writes is the path of what a ServeStatus subresource writes.
func (s *Subresource) Writes() []string {
	if len(s.Field) == 0 {
		return []string{"status"}
	}
	return s.Field
}

// AnswerOptions are the request's options an answer acts on.
type AnswerOptions struct {
	// DryRun: the request's dryRun=All; nothing may be persisted.
	DryRun bool
}

// ScaleAccess reads and sets what a Scale shows of an object.
type ScaleAccess struct {
	// Get returns the desired replicas (nil: unset), the current ones and
	// the selector.
	Get func(obj runtime.Object) (desired *int32, current int32, selector *metav1.LabelSelector)
	// Set changes the desired replicas of obj in place.
	Set func(obj runtime.Object, replicas int32)
}

// Status is the status subresource every kind with a status has.
func Status() Subresource {
	return Subresource{Name: "status", Serve: ServeStatus, Verbs: metav1.Verbs{"get", "patch", "update"}}
}

// ScaleOf is the scale subresource over the given accessors.
func ScaleOf(access ScaleAccess) Subresource {
	return Subresource{Name: "scale", Serve: ServeScale, Kind: schema.GroupVersionKind{Group: "autoscaling", Version: "v1", Kind: "Scale"},
		Verbs: metav1.Verbs{"get", "patch", "update"}, Scale: &access}
}

// Described returns r with its New and NewList set for the k8s.io/api type
// pair T, L: every description's last step.
func Described[T any, L any, PT interface {
	*T
	runtime.Object
}, PL interface {
	*L
	runtime.Object
}](r *Resource) *Resource {
	r.New = func() runtime.Object { return PT(new(T)) }
	r.NewList = func() runtime.Object { return PL(new(L)) }
	return r
}

// Reviewed returns r, a create-only resource of type T answered by
// review (see Resource.Review).
func Reviewed[T any, PT interface {
	*T
	runtime.Object
}](r *Resource, review func(ctx context.Context, obj runtime.Object) (runtime.Object, error)) *Resource {
	r.New = func() runtime.Object { return PT(new(T)) }
	r.Review = review
	return r
}

// GVK names a kind at v1, the version every built-in group orch serves is at.
func GVK(group, kind string) schema.GroupVersionKind {
	return schema.GroupVersionKind{Group: group, Version: "v1", Kind: kind}
}

// StatusMetadataAll is what a status write may change of the metadata of
// most of Kubernetes' older kinds (Jobs, ReplicaSets, Nodes, Services, ...).
var StatusMetadataAll = []string{"labels", "annotations", "finalizers", "ownerReferences"}
