package registry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/orch-dev/orch/internal/store"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/watch"
)

// InitialEventsEndAnnotation marks the bookmark that ends the initial
// events of a watch with sendInitialEvents (client-go's watch-list).
const InitialEventsEndAnnotation = "k8s.io/initial-events-end"

// Watch streams changes to the objects in namespace ("" for all) that pass
// the request's selectors. It follows Kubernetes' rules: no resourceVersion
// (or "0") first sends the current objects as ADDED; a resourceVersion
// sends what happened after it, or a 410 ERROR once that history is
// compacted; sendInitialEvents sends the current objects then a bookmark
// marking their end. With allowWatchBookmarks, a BOOKMARK carrying the
// current resourceVersion comes every bookmarkEvery. The channel closes
// when ctx ends or after an ERROR event.
func (s *Storage) Watch(ctx context.Context, namespace string, opts *metav1.ListOptions, bookmarkEvery time.Duration) (<-chan watch.Event, error) {
	filter, err := s.NewFilter(opts)
	if err != nil {
		return nil, err
	}
	rv, err := parseRV(opts.ResourceVersion)
	if err != nil {
		return nil, err
	}
	if err := validateWatchOptions(opts); err != nil {
		return nil, err
	}
	if rv > 0 && !s.watchCache().reached(rv) {
		// A resourceVersion the store has not reached is another store's
		// (a datastore the cluster moved into, a restored snapshot):
		// Kubernetes' "Too large resource version", on which client-go
		// lists again, instead of a watch silent until the store gets
		// there. The cache answers for what it has seen, so the common
		// resume asks the store nothing.
		cur, err := s.store.Revision(ctx)
		if err != nil {
			return nil, s.storeError(err, "")
		}
		if rv > cur {
			return nil, TooLargeResourceVersion(fmt.Sprintf("Too large resource version: %d, current: %d", rv, cur))
		}
	}
	sendInitial := opts.SendInitialEvents != nil && *opts.SendInitialEvents
	initial := sendInitial || opts.SendInitialEvents == nil && rv == 0
	prefix := s.collectionPrefix(namespace)
	if c := s.watchCache(); c != nil && c.waitReady(ctx) {
		if out, ok := c.watch(ctx, watchRequest{prefix: prefix, filter: filter, rv: rv, initial: initial,
			initialEnd: sendInitial && opts.AllowWatchBookmarks, bookmarks: opts.AllowWatchBookmarks && bookmarkEvery > 0,
			bookmarkEvery: bookmarkEvery}); ok {
			return out, nil
		}
	}
	out := make(chan watch.Event, 16)
	var (
		items   []runtime.Object
		fromRev = rv
	)
	if initial {
		list, err := s.List(ctx, namespace, &metav1.ListOptions{LabelSelector: opts.LabelSelector, FieldSelector: opts.FieldSelector})
		if err != nil {
			return nil, err
		}
		if items, err = meta.ExtractList(list); err != nil {
			return nil, apierrors.NewInternalError(err)
		}
		lm, _ := meta.ListAccessor(list)
		fromRev, _ = parseRV(lm.GetResourceVersion())
	}
	w, err := s.store.Watch(ctx, prefix, fromRev)
	if err != nil && !errors.Is(err, store.ErrCompacted) {
		return nil, s.storeError(err, "")
	}
	go func() {
		defer close(out)
		send := func(e watch.Event) bool {
			select {
			case out <- e:
				return true
			case <-ctx.Done():
				return false
			}
		}
		if err != nil {
			send(watch.Event{Type: watch.Error, Object: s.watchError(err, rv)})
			return
		}
		defer w.Stop()
		for _, obj := range items {
			if !send(watch.Event{Type: watch.Added, Object: obj}) {
				return
			}
		}
		if sendInitial && opts.AllowWatchBookmarks {
			if !send(watch.Event{Type: watch.Bookmark, Object: s.bookmark(fromRev, true)}) {
				return
			}
		}
		var tick <-chan time.Time
		if opts.AllowWatchBookmarks && bookmarkEvery > 0 {
			t := time.NewTicker(bookmarkEvery)
			defer t.Stop()
			tick = t.C
		}
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick:
				w.RequestProgress()
			case ev, ok := <-w.Events():
				if !ok {
					if err := w.Err(); err != nil && !errors.Is(err, store.ErrWatcherTooSlow) && !errors.Is(err, store.ErrClosed) {
						send(watch.Event{Type: watch.Error, Object: s.watchError(err, rv)})
					}
					// A watcher cut off for falling behind just ends: the client
					// resumes from the last resourceVersion it saw.
					return
				}
				e, ok, err := s.convertEvent(ev, filter, opts.AllowWatchBookmarks)
				if err != nil {
					send(watch.Event{Type: watch.Error, Object: StatusOf(err)})
					return
				}
				if ok && !send(e) {
					return
				}
			}
		}
	}()
	return out, nil
}

func validateWatchOptions(opts *metav1.ListOptions) error {
	var errs field.ErrorList
	if opts.SendInitialEvents != nil {
		if opts.ResourceVersionMatch != metav1.ResourceVersionMatchNotOlderThan {
			errs = append(errs, field.Forbidden(field.NewPath("resourceVersionMatch"), "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"))
		}
		if *opts.SendInitialEvents && !opts.AllowWatchBookmarks {
			errs = append(errs, field.Forbidden(field.NewPath("allowWatchBookmarks"), "sendInitialEvents requires setting allowWatchBookmarks to true"))
		}
	} else if opts.ResourceVersionMatch != "" {
		errs = append(errs, field.Forbidden(field.NewPath("resourceVersionMatch"), "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided"))
	}
	if len(errs) > 0 {
		return apierrors.NewInvalid(metav1.SchemeGroupVersion.WithKind("ListOptions").GroupKind(), "", errs)
	}
	return nil
}

// convertEvent turns a store event into a watch event, applying the filter
// as Kubernetes does: an object that starts matching is ADDED, one that
// stops matching is DELETED.
func (s *Storage) convertEvent(ev store.Event, filter Filter, bookmarks bool) (watch.Event, bool, error) {
	switch ev.Type {
	case store.EventProgress:
		if !bookmarks {
			return watch.Event{}, false, nil
		}
		return watch.Event{Type: watch.Bookmark, Object: s.bookmark(ev.Revision, false)}, true, nil
	case store.EventDelete:
		if ev.PrevKV == nil {
			return watch.Event{}, false, nil
		}
		obj, err := s.decodeShared(ev.PrevKV.Key, ev.PrevKV.Value, ev.Revision)
		if err != nil {
			return watch.Event{}, false, err
		}
		return watch.Event{Type: watch.Deleted, Object: obj}, s.Matches(filter, obj), nil
	}
	obj, err := s.decodeShared(ev.KV.Key, ev.KV.Value, ev.KV.ModRevision)
	if err != nil {
		return watch.Event{}, false, err
	}
	matches := s.Matches(filter, obj)
	matched := false
	if ev.PrevKV != nil {
		if filter.Empty() {
			matched = true
		} else if prev, err := s.decodeShared(ev.PrevKV.Key, ev.PrevKV.Value, ev.PrevKV.ModRevision); err == nil {
			matched = s.Matches(filter, prev)
		}
	}
	switch {
	case matches && matched:
		return watch.Event{Type: watch.Modified, Object: obj}, true, nil
	case matches:
		return watch.Event{Type: watch.Added, Object: obj}, true, nil
	case matched:
		return watch.Event{Type: watch.Deleted, Object: obj}, true, nil
	}
	return watch.Event{}, false, nil
}

func (s *Storage) bookmark(rev int64, initialEnd bool) runtime.Object {
	obj := s.Resource.New()
	s.setTypeMeta(obj)
	m, _ := meta.Accessor(obj)
	m.SetResourceVersion(fmt.Sprint(rev))
	if initialEnd {
		m.SetAnnotations(map[string]string{InitialEventsEndAnnotation: "true"})
	}
	return obj
}

func (s *Storage) watchError(err error, rv int64) runtime.Object {
	if errors.Is(err, store.ErrCompacted) {
		return StatusOf(apierrors.NewResourceExpired(fmt.Sprintf("too old resource version: %d (%d)", rv, s.store.CompactedRevision()+1)))
	}
	return StatusOf(s.storeError(err, ""))
}

// StatusOf is err as the metav1.Status an ERROR watch event carries.
func StatusOf(err error) *metav1.Status {
	var se apierrors.APIStatus
	if errors.As(err, &se) {
		st := se.Status()
		st.Kind, st.APIVersion = "Status", "v1"
		return &st
	}
	st := apierrors.NewInternalError(err).Status()
	st.Kind, st.APIVersion = "Status", "v1"
	return &st
}
