package api

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/orch-dev/orch/internal/api/registry"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
)

// follower is what the server keeps in memory from a watch of one
// resource (the node authorizer's graph, the RBAC index): the whole of it
// after each fresh list, then each change.
type follower interface {
	Replace(objs []runtime.Object)
	Set(obj runtime.Object)
	Delete(obj runtime.Object)
}

// follow keeps f current with st's objects until ctx ends, listing again
// whenever the watch's history is gone, as an informer does.
func follow(ctx context.Context, st *registry.Storage, f follower, log *slog.Logger) {
	followSelected(ctx, st, "", "", f, log)
}

// followSelected is follow of the objects of one namespace ("" for all)
// that a field selector ("" for all) selects.
func followSelected(ctx context.Context, st *registry.Storage, namespace, fieldSelector string, f follower, log *slog.Logger) {
	rv := ""
	for ctx.Err() == nil {
		opts := &metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true, FieldSelector: fieldSelector}
		fresh := rv == ""
		if fresh {
			opts.SendInitialEvents, opts.ResourceVersionMatch = ptr.To(true), metav1.ResourceVersionMatchNotOlderThan
		}
		events, err := st.Watch(ctx, namespace, opts, time.Minute)
		if err != nil {
			log.Warn("watching for the server's own use", "resource", st.Resource.GroupResource().String(), "err", err)
			rv = ""
			sleep(ctx, time.Second)
			continue
		}
		var initial []runtime.Object // built aside, then handed over whole
		for ev := range events {
			switch ev.Type {
			case watch.Error:
				if status, ok := ev.Object.(*metav1.Status); ok && status.Code == http.StatusGone {
					rv = "" // history compacted: list again
				}
			case watch.Bookmark:
				if m, ok := ev.Object.(metav1.Object); ok {
					rv = m.GetResourceVersion()
					if fresh && m.GetAnnotations()[registry.InitialEventsEndAnnotation] == "true" {
						f.Replace(initial)
						initial, fresh = nil, false
					}
				}
			case watch.Added, watch.Modified, watch.Deleted:
				switch {
				case fresh && ev.Type == watch.Deleted:
					// not in a fresh list
				case fresh:
					initial = append(initial, ev.Object)
				case ev.Type == watch.Deleted:
					f.Delete(ev.Object)
				default:
					f.Set(ev.Object)
				}
				if m, ok := ev.Object.(metav1.Object); ok {
					rv = m.GetResourceVersion()
				}
			}
		}
		if fresh {
			rv = "" // the initial events never ended: list again
		}
		if _, err := strconv.ParseInt(rv, 10, 64); err != nil {
			rv = ""
		}
		sleep(ctx, 100*time.Millisecond)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
