package rest

import (
	"bytes"
	"context"
	"net/http"

	"github.com/orch-dev/orch/internal/api/registry"

	"k8s.io/apimachinery/pkg/watch"
)

// watch streams events as newline-delimited JSON WatchEvents over a chunked
// response, flushing after each so clients see them at once.
func (q *request) watch() error {
	f, err := negotiate(q.r)
	if err != nil {
		return err
	}
	if f.yaml {
		f = format{} // Kubernetes streams watches as JSON even to YAML clients.
	}
	opts, err := q.listOptions()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(q.ctx(), q.watchTimeout(opts))
	defer cancel()
	events, err := q.st.Watch(ctx, q.namespace, opts, q.h.opts.BookmarkInterval)
	if err != nil {
		return err
	}
	flusher, _ := q.w.(http.Flusher)
	q.w.Header().Set("Content-Type", "application/json")
	q.w.Header().Set("Transfer-Encoding", "chunked")
	q.w.WriteHeader(http.StatusOK)
	if flusher != nil {
		flusher.Flush()
	}
	var buf bytes.Buffer
	for ev := range events {
		obj := ev.Object
		if ev.Type != watch.Error && ev.Type != watch.Bookmark {
			if obj, err = q.transform(obj, f); err != nil {
				obj = registry.StatusOf(err)
				ev.Type = watch.Error
			}
		}
		if err := encodeEvent(&buf, string(ev.Type), obj); err != nil {
			q.h.opts.Logger.Error("encode watch event", "path", q.r.URL.Path, "err", err)
			return nil
		}
		if _, err := q.w.Write(buf.Bytes()); err != nil {
			return nil
		}
		if flusher != nil {
			flusher.Flush()
		}
	}
	return nil
}
