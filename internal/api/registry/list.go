package registry

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/orch-dev/orch/internal/store"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
)

// Filter is a parsed label and field selector.
type Filter struct {
	Labels labels.Selector
	Fields fields.Selector
}

// NewFilter parses the selectors of a list or watch request.
func (s *Storage) NewFilter(opts *metav1.ListOptions) (Filter, error) {
	f := Filter{Labels: labels.Everything(), Fields: fields.Everything()}
	var err error
	if opts.LabelSelector != "" {
		if f.Labels, err = labels.Parse(opts.LabelSelector); err != nil {
			return f, apierrors.NewBadRequest(fmt.Sprintf("unable to parse requirement: %v", err))
		}
	}
	if opts.FieldSelector != "" {
		if f.Fields, err = fields.ParseSelector(opts.FieldSelector); err != nil {
			return f, apierrors.NewBadRequest(fmt.Sprintf("invalid field selector: %v", err))
		}
		// Kubernetes rejects a field the resource cannot be selected by.
		known := s.Resource.FieldSet(s.Resource.New())
		for _, req := range f.Fields.Requirements() {
			if _, ok := known[req.Field]; !ok {
				return f, apierrors.NewBadRequest(fmt.Sprintf("field label not supported: %s", req.Field))
			}
		}
	}
	return f, nil
}

// Empty reports whether the filter lets everything through.
func (f Filter) Empty() bool { return f.Labels.Empty() && f.Fields.Empty() }

// Matches reports whether obj passes the filter for resource s.
func (s *Storage) Matches(f Filter, obj runtime.Object) bool {
	if f.Empty() {
		return true
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return false
	}
	if !f.Labels.Matches(labels.Set(m.GetLabels())) {
		return false
	}
	return f.Fields.Empty() || f.Fields.Matches(s.Resource.FieldSet(obj))
}

// List returns the objects in namespace ("" for all) as the resource's
// List type, following Kubernetes' resourceVersion and paging rules.
func (s *Storage) List(ctx context.Context, namespace string, opts *metav1.ListOptions) (runtime.Object, error) {
	filter, err := s.NewFilter(opts)
	if err != nil {
		return nil, err
	}
	prefix := s.collectionPrefix(namespace)
	rv, err := parseRV(opts.ResourceVersion)
	if err != nil {
		return nil, err
	}
	if c := s.watchCache(); c != nil {
		if list, ok, err := c.list(ctx, namespace, filter, opts); ok || err != nil {
			return list, err
		}
	}
	sopts := store.ListOptions{Limit: opts.Limit}
	switch opts.ResourceVersionMatch {
	case metav1.ResourceVersionMatchExact:
		if rv == 0 {
			return nil, apierrors.NewBadRequest("resourceVersionMatch=Exact requires a resourceVersion other than 0")
		}
		sopts.Revision = rv
	case metav1.ResourceVersionMatchNotOlderThan, "":
		// A paged list from a given version reads at exactly that version,
		// as Kubernetes does for limit plus resourceVersion without a match.
		if opts.ResourceVersionMatch == "" && opts.Limit > 0 && rv > 0 {
			sopts.Revision = rv
		}
	default:
		return nil, apierrors.NewBadRequest(fmt.Sprintf("unsupported resourceVersionMatch %q", opts.ResourceVersionMatch))
	}
	if opts.Continue != "" {
		if opts.ResourceVersion != "" && opts.ResourceVersion != "0" {
			return nil, apierrors.NewBadRequest("specifying resource version is not allowed when using continue")
		}
		_, start, err := store.DecodeContinue(opts.Continue)
		if err != nil || !strings.HasPrefix(start, prefix) {
			return nil, apierrors.NewBadRequest("continue key is not valid: the continue token does not belong to this list")
		}
		sopts.Continue = opts.Continue
		sopts.Revision = 0
	}
	items := make([]runtime.Object, 0)
	var listRev int64
	var next string
	remaining := int64(-1)
pages:
	for {
		res, err := s.store.List(ctx, prefix, sopts)
		if err != nil {
			if opts.Continue != "" && errors.Is(err, store.ErrCompacted) {
				// As Kubernetes: the error carries a token that goes on from
				// the same key at the newest revision, for a client that
				// takes an inconsistent list over starting again.
				expired := apierrors.NewResourceExpired("The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.")
				if _, start, err := store.DecodeContinue(sopts.Continue); err == nil {
					if newest, err := s.store.Revision(ctx); err == nil {
						expired.ErrStatus.Continue = store.EncodeContinue(newest, start)
					}
				}
				return nil, expired
			}
			return nil, s.storeError(err, "")
		}
		listRev = res.Revision
		for i, kv := range res.KVs {
			obj, err := s.decode(kv)
			if err != nil {
				return nil, err
			}
			if !s.Matches(filter, obj) {
				continue
			}
			items = append(items, obj)
			if opts.Limit > 0 && int64(len(items)) == opts.Limit {
				if i < len(res.KVs)-1 || res.Continue != "" {
					next = store.EncodeContinue(res.Revision, kv.Key+"\x00")
					if filter.Empty() {
						// Kubernetes counts what follows only when nothing
						// is filtered out of it.
						remaining = int64(len(res.KVs)-1-i) + res.Remaining
					}
				}
				break pages
			}
		}
		if res.Continue == "" {
			break
		}
		// A filtered page came back short: read on at the same revision.
		sopts = store.ListOptions{Limit: opts.Limit, Continue: res.Continue}
	}
	list, err := s.newList(items, listRev, next)
	if err == nil && remaining >= 0 {
		if lm, err := meta.ListAccessor(list); err == nil {
			lm.SetRemainingItemCount(&remaining)
		}
	}
	return list, err
}
