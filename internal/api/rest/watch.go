package rest

import (
	"context"
	"encoding/binary"
	"net/http"

	"github.com/orch-dev/orch/internal/api/registry"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

// watch streams events over a chunked response, flushing whenever no
// other event waits, so clients see them at once: newline-delimited JSON WatchEvents, or
// length-prefixed protobuf ones for clients that ask for protobuf.
func (q *request) watch() error {
	f, err := q.negotiate()
	if err != nil {
		return err
	}
	f.yaml = false // Kubernetes streams watches as JSON even to YAML clients.
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
	contentType := "application/json"
	if f.protobuf {
		contentType = protobufType + ";stream=watch"
	}
	q.w.Header().Set("Content-Type", contentType)
	q.w.Header().Set("Transfer-Encoding", "chunked")
	q.w.WriteHeader(http.StatusOK)
	if flusher != nil {
		flusher.Flush()
	}
	var frame []byte
	for ev := range events {
		if frame, err = q.eventFrame(frame[:0], ev, f); err != nil {
			q.h.opts.Logger.Error("encode watch event", "path", q.r.URL.Path, "err", err)
			return nil
		}
		if _, err := q.w.Write(frame); err != nil {
			return nil
		}
		// Events already waiting go out in the same flush, as Kubernetes
		// does: under load, fewer and fuller frames.
		if flusher != nil && len(events) == 0 {
			flusher.Flush()
		}
	}
	return nil
}

// eventFrame appends one event to buf as Kubernetes frames it on the wire.
// Changed objects are the registry's shared ones, encoded once for all the
// watchers that see them; bookmarks, errors and tables are per watcher.
func (q *request) eventFrame(buf []byte, ev watch.Event, f format) ([]byte, error) {
	obj := ev.Object
	shared := false
	switch {
	case ev.Type == watch.Bookmark && f.partial:
		// Metadata-only clients decode only PartialObjectMetadata, bookmarks
		// included, as Kubernetes sends them.
		if pm, err := partialMetadata(obj); err == nil {
			obj = pm
		}
	case ev.Type != watch.Error && ev.Type != watch.Bookmark:
		shared = f.table == "" && !f.partial
		var err error
		if obj, err = q.transform(obj, f); err != nil {
			obj, ev.Type, shared = registry.StatusOf(err), watch.Error, false
		}
	}
	var raw []byte
	var err error
	if shared {
		raw, err = q.h.encodings.Get(encodingKey{obj, f.protobuf}, func() ([]byte, error) { return encodeObject(obj, f.protobuf) })
	} else {
		raw, err = encodeObject(obj, f.protobuf)
	}
	if err != nil {
		return buf, err
	}
	if f.protobuf {
		data, err := (&metav1.WatchEvent{Type: string(ev.Type), Object: runtime.RawExtension{Raw: raw}}).Marshal()
		if err != nil {
			return buf, err
		}
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(data)))
		return append(buf, data...), nil
	}
	buf = append(buf, `{"type":"`...)
	buf = append(buf, ev.Type...)
	buf = append(buf, `","object":`...)
	buf = append(buf, raw...)
	return append(buf, "}\n"...), nil
}
