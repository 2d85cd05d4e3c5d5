// Package admission is what the API server's pluggable admission sees of a
// request: the attributes of one write (or connect), and the interface the
// admission the cluster configures — webhooks, admission policies —
// implements. The registry calls it in Kubernetes' order: built-in
// mutation, then Mutate, validation, Validate, and quota last.
//
// It also carries the warnings admission has for the client, which the
// REST layer sends as Warning headers.
package admission

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/orch-dev/orch/internal/api/resources"
	"k8s.io/apimachinery/pkg/runtime"
)

// Operations, as admission.k8s.io names them.
const (
	Create  = "CREATE"
	Update  = "UPDATE"
	Delete  = "DELETE"
	Connect = "CONNECT"
)

// Attributes are one request as admission sees it.
type Attributes struct {
	Resource    *resources.Resource
	Operation   string
	Subresource string
	Namespace   string
	Name        string
	// Object is the object being written (nil on delete): Mutate may
	// change it in place. Kind is its kind when it is not the resource's
	// (a pod's attach options on CONNECT).
	Object    runtime.Object
	OldObject runtime.Object
	// Options are the request's Create-, Update-, DeleteOptions or the
	// connect's options object.
	Options runtime.Object
	DryRun  bool
	// Request is the resource the request was made through when these
	// attributes are another version's (As); nil when it is Resource.
	Request *resources.Resource
}

// Interface is admission the cluster configures. Mutate may change
// a.Object; Validate only judges. Either refuses with a Kubernetes
// StatusError.
type Interface interface {
	// Active reports whether any is configured; with none, the registry
	// skips it.
	Active() bool
	Mutate(ctx context.Context, a *Attributes) error
	Validate(ctx context.Context, a *Attributes) error
}

// attributesKey carries the attributes of the write being admitted.
type attributesKey struct{}

// WithAttributes returns ctx carrying the attributes of the write being
// admitted, for the built-in steps that act by subresource (a
// CertificateSigningRequest's approval and status).
func WithAttributes(ctx context.Context, a *Attributes) context.Context {
	return context.WithValue(ctx, attributesKey{}, a)
}

// AttributesFrom returns the attributes ctx carries, or nil.
func AttributesFrom(ctx context.Context) *Attributes {
	a, _ := ctx.Value(attributesKey{}).(*Attributes)
	return a
}

// warningsKey carries a request's warnings.
type warningsKey struct{}

// Warnings collects what admission has to tell the client.
type Warnings struct {
	mu   sync.Mutex
	list []string
}

// WithWarnings returns ctx carrying w.
func WithWarnings(ctx context.Context, w *Warnings) context.Context {
	return context.WithValue(ctx, warningsKey{}, w)
}

// WarningsFrom returns the warnings ctx carries, or nil.
func WarningsFrom(ctx context.Context) *Warnings {
	w, _ := ctx.Value(warningsKey{}).(*Warnings)
	return w
}

// Warn records a warning for the client of ctx's request, once; outside a
// request it is dropped.
func Warn(ctx context.Context, msg string) {
	w, _ := ctx.Value(warningsKey{}).(*Warnings)
	msg = strings.TrimSpace(msg)
	if w == nil || msg == "" {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, have := range w.list {
		if have == msg {
			return
		}
	}
	w.list = append(w.list, msg)
}

// Take returns the warnings recorded so far and forgets them.
func (w *Warnings) Take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.list
	w.list = nil
	return out
}

// RuleMatches is Kubernetes' rule matching of webhooks and policies: the
// operation, group, version and resource (with subresource: "pods" is the
// main resource only, "pods/*" its subresources, "*/status" every status,
// "*/*" everything) and the scope.
func RuleMatches(r admissionregistrationv1.RuleWithOperations, a *Attributes) bool {
	if !slices.ContainsFunc(r.Operations, func(op admissionregistrationv1.OperationType) bool {
		return op == admissionregistrationv1.OperationAll || string(op) == a.Operation
	}) {
		return false
	}
	if !matchesOrStar(r.APIGroups, a.Resource.Group) || !matchesOrStar(r.APIVersions, a.Resource.Version) {
		return false
	}
	if r.Scope != nil {
		switch *r.Scope {
		case admissionregistrationv1.ClusterScope:
			if a.Resource.Namespaced {
				return false
			}
		case admissionregistrationv1.NamespacedScope:
			if !a.Resource.Namespaced {
				return false
			}
		}
	}
	for _, res := range r.Resources {
		name, sub, _ := strings.Cut(res, "/")
		switch {
		case res == "*/*":
			return true
		case name == "*" && sub == "" && a.Subresource == "":
			return true
		case name == "*" && sub == a.Subresource && sub != "":
			return true
		case name == a.Resource.Plural && (sub == a.Subresource || sub == "*" && a.Subresource != ""):
			return true
		}
	}
	return false
}

func matchesOrStar(list []string, want string) bool {
	return slices.ContainsFunc(list, func(s string) bool { return s == "*" || s == want })
}

// SelectorsMatch checks the namespace selector (on the namespace's labels;
// a Namespace is judged by its own, other cluster-scoped kinds always
// match) and the object selector (on the new object's labels or the old
// one's).
func SelectorsMatch(ctx context.Context, a *Attributes, nsSel, objSel labels.Selector, namespaceLabels func(ctx context.Context, name string) (map[string]string, error)) (bool, error) {
	if !nsSel.Empty() {
		var nsLabels map[string]string
		switch {
		case a.Resource.Group == "" && a.Resource.Plural == "namespaces":
			nsLabels = labelsOf(firstObject(a))
		case a.Resource.Namespaced:
			var err error
			if nsLabels, err = namespaceLabels(ctx, a.Namespace); err != nil {
				if apierrors.IsNotFound(err) {
					return false, nil
				}
				return false, fmt.Errorf("namespace %q: %w", a.Namespace, err)
			}
		default:
			nsLabels = nil
		}
		if a.Resource.Namespaced || a.Resource.Plural == "namespaces" {
			if !nsSel.Matches(labels.Set(nsLabels)) {
				return false, nil
			}
		}
	}
	if !objSel.Empty() {
		newMatch := a.Object != nil && objSel.Matches(labels.Set(labelsOf(a.Object)))
		oldMatch := a.OldObject != nil && objSel.Matches(labels.Set(labelsOf(a.OldObject)))
		if !newMatch && !oldMatch {
			return false, nil
		}
	}
	return true, nil
}

func firstObject(a *Attributes) runtime.Object {
	if a.Object != nil {
		return a.Object
	}
	return a.OldObject
}

func labelsOf(obj runtime.Object) map[string]string {
	if obj == nil {
		return nil
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil
	}
	return m.GetLabels()
}

// Exempt are the kinds no webhook or policy sees, so that a broken one
// can always be removed, as in Kubernetes.
func Exempt(a *Attributes) bool {
	if a.Resource.Group != admissionregistrationv1.GroupName {
		return false
	}
	return strings.HasSuffix(a.Resource.Plural, "webhookconfigurations") || strings.Contains(a.Resource.Plural, "admissionpolic")
}

// Chain is admission the cluster configures from several sources, run
// in order: each one's Mutate, then each one's Validate.
type Chain []Interface

// Active reports whether any of the chain is.
func (c Chain) Active() bool {
	for _, i := range c {
		if i.Active() {
			return true
		}
	}
	return false
}

// Mutate runs the active members' mutation in order.
func (c Chain) Mutate(ctx context.Context, a *Attributes) error {
	for _, i := range c {
		if i.Active() {
			if err := i.Mutate(ctx, a); err != nil {
				return err
			}
		}
	}
	return nil
}

// Validate runs the active members' validation in order.
func (c Chain) Validate(ctx context.Context, a *Attributes) error {
	for _, i := range c {
		if i.Active() {
			if err := i.Validate(ctx, a); err != nil {
				return err
			}
		}
	}
	return nil
}

// OwnKind reports whether a's object is of the resource's own kind (not a
// connect's options): what mutation may change.
func (a *Attributes) OwnKind() bool {
	return a.Object != nil && a.Resource.New != nil && reflect.TypeOf(a.Object) == reflect.TypeOf(a.Resource.New())
}

// As is a as the same request made through r, an equivalent version of
// a's resource (Resource.Equivalents): its objects converted to r's
// version.
func (a *Attributes) As(r *resources.Resource) (*Attributes, error) {
	out := *a
	out.Resource = r
	if out.Request == nil {
		out.Request = a.Resource
	}
	var err error
	if a.Object != nil && a.OwnKind() {
		if out.Object, err = r.FromStorage(a.Object); err != nil {
			return nil, err
		}
	}
	if a.OldObject != nil {
		if out.OldObject, err = r.FromStorage(a.OldObject); err != nil {
			return nil, err
		}
	}
	return &out, nil
}

// Equivalent is the version of a's resource that matches says a request
// made through it would match, when a's own does not: Kubernetes'
// matchPolicy Equivalent (the default), under which a webhook or policy
// written for one version of a kind sees requests made through the
// others, converted to its version. It is nil when none does.
func (a *Attributes) Equivalent(matches func(*Attributes) bool) *resources.Resource {
	for _, r := range a.Resource.Equivalents {
		probe := *a
		probe.Resource = r
		if matches(&probe) {
			return r
		}
	}
	return nil
}

// Replace makes a.Object what obj is, in place: the registry goes on with
// the object it passed in. obj must be of the same type.
func (a *Attributes) Replace(obj runtime.Object) {
	if u, ok := a.Object.(*unstructured.Unstructured); ok {
		if src, ok := obj.(*unstructured.Unstructured); ok {
			u.Object = src.DeepCopy().Object
		}
		return
	}
	if reflect.TypeOf(a.Object) != reflect.TypeOf(obj) {
		return
	}
	gvk := a.Object.GetObjectKind().GroupVersionKind()
	reflect.ValueOf(a.Object).Elem().Set(reflect.ValueOf(obj.DeepCopyObject()).Elem())
	a.Object.GetObjectKind().SetGroupVersionKind(gvk)
}
