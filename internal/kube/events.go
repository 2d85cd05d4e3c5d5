package kube

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// EventRecorder records what a loop did to an object, as an
// events.k8s.io/v1 Event that `kubectl describe` shows.
type EventRecorder interface {
	Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any)
}

// Events posts the loops' events in the background; when the API cannot
// keep up, events are dropped rather than slowing a loop (as client-go's
// broadcaster does).
type Events struct {
	client  *Client
	pending chan *eventsv1.Event
	log     *slog.Logger

	mu sync.Mutex
	// recent are the events posted lately, by what they say: one said
	// again within seriesWindow becomes a series (count, last observed)
	// on the same Event, as client-go's correlator makes it, instead of
	// another object (a failing probe says the same thing every period).
	recent map[string]*eventsv1.Event
}

// seriesWindow is how long a repeated event extends its series rather
// than starting a new Event (client-go's correlator: ten minutes).
const seriesWindow = 10 * time.Minute

// NewEvents starts posting events until ctx ends.
func NewEvents(ctx context.Context, c *Client, log *slog.Logger) *Events {
	e := &Events{client: c, pending: make(chan *eventsv1.Event, 1000), log: log, recent: map[string]*eventsv1.Event{}}
	go e.post(ctx)
	return e
}

func (e *Events) post(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-e.pending:
			var err error
			if ev.Series != nil {
				_, err = e.client.Events(ev.Namespace).Update(ctx, ev, metav1.UpdateOptions{})
			}
			if ev.Series == nil || apierrors.IsNotFound(err) {
				_, err = e.client.Events(ev.Namespace).Create(ctx, ev, metav1.CreateOptions{})
			}
			if err != nil && ctx.Err() == nil && !apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) && !apierrors.IsNotFound(err) {
				e.log.Debug("event not recorded", "reason", ev.Reason, "regarding", ev.Regarding.Name, "err", err)
			}
		}
	}
}

// Recorder is the recorder of one controller.
func (e *Events) Recorder(controller string) EventRecorder {
	host, _ := os.Hostname()
	return e.RecorderFor(controller, controller+"-"+host)
}

// RecorderFor is the recorder of a controller running as instance (the
// kubelet's events come from "kubelet" on the node's name).
func (e *Events) RecorderFor(controller, instance string) EventRecorder {
	return &recorder{events: e, controller: controller, instance: instance}
}

type recorder struct {
	events               *Events
	controller, instance string
}

// Eventf records an event about regarding: an object, or a
// *corev1.ObjectReference (one with a fieldPath names a part of it, as
// the kubelet's events name a pod's container).
func (r *recorder) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	ref, err := reference(regarding)
	if err != nil {
		return
	}
	now := time.Now()
	ev := &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", ref.Name, now.UnixNano()), Namespace: ref.Namespace},
		EventTime:  metav1.NewMicroTime(now), ReportingController: r.controller, ReportingInstance: r.instance,
		Action: action, Reason: reason, Regarding: ref, Note: fmt.Sprintf(note, args...), Type: eventtype,
	}
	if ev.Namespace == "" {
		ev.Namespace = metav1.NamespaceDefault
	}
	if related != nil {
		if rel, err := reference(related); err == nil {
			ev.Related = &rel
		}
	}
	ev = r.events.series(ev, now)
	select {
	case r.events.pending <- ev:
	default:
	}
}

// series turns ev into the next of a series when the same was said
// within seriesWindow. What it returns is the caller's to post: the
// client's encoder writes TypeMeta into it, so recent keeps its own copy.
func (e *Events) series(ev *eventsv1.Event, now time.Time) *eventsv1.Event {
	key := strings.Join([]string{string(ev.Regarding.UID), ev.Regarding.Name, ev.Regarding.FieldPath, ev.ReportingInstance, ev.Type, ev.Reason, ev.Note}, "\x00")
	e.mu.Lock()
	defer e.mu.Unlock()
	last, ok := e.recent[key]
	if !ok || now.Sub(lastObserved(last)) > seriesWindow {
		if len(e.recent) >= 4096 {
			for k, old := range e.recent {
				if now.Sub(lastObserved(old)) > seriesWindow {
					delete(e.recent, k)
				}
			}
		}
		e.recent[key] = ev.DeepCopy()
		return ev
	}
	next := last.DeepCopy()
	count := int32(2)
	if last.Series != nil {
		count = last.Series.Count + 1
	}
	next.Series = &eventsv1.EventSeries{Count: count, LastObservedTime: metav1.NewMicroTime(now)}
	e.recent[key] = next.DeepCopy()
	return next
}

func lastObserved(ev *eventsv1.Event) time.Time {
	if ev.Series != nil {
		return ev.Series.LastObservedTime.Time
	}
	return ev.EventTime.Time
}

// reference points at obj, naming its kind by the scheme (objects from
// informers carry no TypeMeta).
func reference(obj runtime.Object) (corev1.ObjectReference, error) {
	if ref, ok := obj.(*corev1.ObjectReference); ok {
		return *ref, nil
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return corev1.ObjectReference{}, err
	}
	gvk, err := GroupVersionKindOf(obj)
	if err != nil {
		return corev1.ObjectReference{}, err
	}
	return corev1.ObjectReference{
		Kind: gvk.Kind, APIVersion: gvk.GroupVersion().String(), Name: m.GetName(), Namespace: m.GetNamespace(),
		UID: m.GetUID(), ResourceVersion: m.GetResourceVersion(),
	}, nil
}
