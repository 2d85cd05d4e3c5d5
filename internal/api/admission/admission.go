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
	"strings"
	"sync"

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
