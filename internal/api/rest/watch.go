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
	var buf []byte
	for ev := range events {
		frame, shared, err := q.eventFrame(buf[:0], ev, f)
		if err != nil {
			q.h.opts.Logger.Error("encode watch event", "path", q.r.URL.Path, "err", err)
			return nil
		}
		if !shared {
			buf = frame // this watcher's own buffer, reused
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

// eventFrame appends one event to buf as Kubernetes frames it on the wire,
// or returns a frame shared with other watchers (which nobody may modify).
// Changed objects are the registry's shared ones, framed once for all the
// watchers that see them (a protobuf frame made per watcher was 1.8 KB of
// garbage for each pod each of 2,000 watchers was sent); bookmarks, errors
// and tables are per watcher.
func (q *request) eventFrame(buf []byte, ev watch.Event, f format) (frame []byte, shared bool, err error) {
	obj := ev.Object
	switch {
	case ev.Type == watch.Bookmark && f.partial:
		// Metadata-only clients decode only PartialObjectMetadata, bookmarks
		// included, as Kubernetes sends them.
		if pm, err := partialMetadata(obj); err == nil {
			obj = pm
		}
	case ev.Type != watch.Error && ev.Type != watch.Bookmark:
		shared = f.table == "" && !f.partial
		if obj, err = q.transform(obj, f); err != nil {
			obj, ev.Type, shared = registry.StatusOf(err), watch.Error, false
		}
	}
	if shared {
		frame, err = q.h.encodings.Get(encodingKey{obj, f.protobuf, ev.Type}, func() ([]byte, error) {
			return appendFrame(nil, ev.Type, obj, f.protobuf)
		})
		return frame, true, err
	}
	frame, err = appendFrame(buf, ev.Type, obj, f.protobuf)
	return frame, false, err
}

// appendFrame appends one event as Kubernetes frames it on the wire:
// newline-delimited JSON, or a length-prefixed protobuf WatchEvent.
func appendFrame(buf []byte, typ watch.EventType, obj runtime.Object, protobuf bool) ([]byte, error) {
	raw, err := encodeObject(obj, protobuf)
	if err != nil {
		return buf, err
	}
	if protobuf {
		data, err := (&metav1.WatchEvent{Type: string(typ), Object: runtime.RawExtension{Raw: raw}}).Marshal()
		if err != nil {
			return buf, err
		}
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(data)))
		return append(buf, data...), nil
	}
	buf = append(buf, `{"type":"`...)
	buf = append(buf, typ...)
	buf = append(buf, `","object":`...)
	buf = append(buf, raw...)
	return append(buf, "}\n"...), nil
}
