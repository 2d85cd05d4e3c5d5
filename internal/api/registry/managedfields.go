package registry

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/orch-dev/orch/internal/api/apply"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// untracked are the subresources whose writes Kubernetes does not record
// in managedFields: a binding is a create of its own kind, not an update
// of the pod.
var untracked = map[string]bool{"binding": true}

// trackUpdate records in obj's managedFields what manager changed from
// live (nil on create), as every Kubernetes write does. A failure keeps
// the fields as they were rather than failing the write, as Kubernetes'
// UpdateNoErrors does.
func (s *Storage) trackUpdate(live, obj runtime.Object, manager, subresource string) {
	if untracked[subresource] {
		if live != nil {
			keepManagedFields(live, obj)
		}
		return
	}
	if manager == "" {
		manager = apply.DefaultManager
	}
	fm, err := s.fields.For(subresource)
	if err != nil {
		slog.Error("managedFields not updated", "kind", s.Resource.Kind, "err", err)
		return
	}
	if live == nil {
		live = s.Resource.New()
	}
	s.setTypeMeta(live)
	s.setTypeMeta(obj)
	fm.UpdateNoErrors(live, obj, manager)
}

func keepManagedFields(from, to runtime.Object) {
	f, _ := meta.Accessor(from)
	t, _ := meta.Accessor(to)
	t.SetManagedFields(f.GetManagedFields())
}

// encodeWrite encodes an object for a write. An object too large only
// for its managedFields is stored without them, as Kubernetes does for
// every write but an apply, whose fields are the point of it.
func (s *Storage) encodeWrite(obj runtime.Object, applied bool) ([]byte, error) {
	data, err := s.encode(obj)
	m, _ := meta.Accessor(obj)
	if apierrors.IsRequestEntityTooLargeError(err) && !applied && len(m.GetManagedFields()) > 0 {
		m.SetManagedFields(nil)
		return s.encode(obj)
	}
	return data, err
}

// ApplyOptions are a server-side apply's options.
type ApplyOptions struct {
	WriteOptions
	// Force takes the fields another manager owns instead of conflicting.
	Force bool
	// Subresource is "" or "status".
	Subresource string
}

// Apply merges an apply configuration into the named object as
// Kubernetes' server-side apply does, creating the object when it does
// not exist: fields the manager applied before and leaves out now are
// removed, fields another manager owns with a different value conflict
// (409, naming the managers) unless forced. It reports whether the object
// was created.
func (s *Storage) Apply(ctx context.Context, namespace, name string, patch *unstructured.Unstructured, opts ApplyOptions) (runtime.Object, bool, error) {
	fm, err := s.fields.For(opts.Subresource)
	if err != nil {
		return nil, false, apierrors.NewInternalError(err)
	}
	update := func(_ context.Context, current runtime.Object) (runtime.Object, error) {
		live := current
		if live == nil {
			live = s.Resource.New()
		}
		s.setTypeMeta(live)
		obj, err := fm.Apply(live, patch.DeepCopy(), opts.FieldManager, opts.Force)
		if err != nil {
			if _, ok := err.(apierrors.APIStatus); ok {
				return nil, err
			}
			// Kubernetes answers 500 to an apply configuration its schema
			// cannot hold (an unknown field, a wrong type); it is the
			// client's input, so orch says 400 with the same words.
			return nil, apierrors.NewBadRequest(err.Error())
		}
		if s.Resource.Normalize != nil {
			// The schema's defaults (what it does not know, the apply
			// could not hold).
			s.Resource.Normalize(obj)
		}
		m, err := meta.Accessor(obj)
		if err != nil {
			return nil, apierrors.NewInternalError(err)
		}
		if current == nil && m.GetUID() != "" {
			return nil, apierrors.NewConflict(s.groupResource(), name, fmt.Errorf("uid mismatch: the provided object specified uid %s, and no existing object was found", m.GetUID()))
		}
		if patch.GetResourceVersion() == "" {
			// Without a resourceVersion of its own, an apply is
			// unconditional: retried over concurrent writes.
			m.SetResourceVersion("")
		}
		return obj, nil
	}
	return s.update(ctx, namespace, name, update, UpdateOptions{WriteOptions: opts.WriteOptions, Subresource: opts.Subresource}, true)
}
