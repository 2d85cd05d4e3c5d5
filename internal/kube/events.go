package kube

import (
	"context"
	"fmt"
	"log/slog"
	"os"
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
}

// NewEvents starts posting events until ctx ends.
func NewEvents(ctx context.Context, c *Client, log *slog.Logger) *Events {
	e := &Events{client: c, pending: make(chan *eventsv1.Event, 1000), log: log}
	go e.post(ctx)
	return e
}

func (e *Events) post(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-e.pending:
			_, err := e.client.Events(ev.Namespace).Create(ctx, ev, metav1.CreateOptions{})
			if err != nil && ctx.Err() == nil && !apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) && !apierrors.IsNotFound(err) {
				e.log.Debug("event not recorded", "reason", ev.Reason, "regarding", ev.Regarding.Name, "err", err)
			}
		}
	}
}

// Recorder is the recorder of one controller.
func (e *Events) Recorder(controller string) EventRecorder {
	host, _ := os.Hostname()
	return &recorder{events: e, controller: controller, instance: controller + "-" + host}
}

type recorder struct {
	events               *Events
	controller, instance string
}

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
	select {
	case r.events.pending <- ev:
	default:
	}
}

// reference points at obj, naming its kind by the scheme (objects from
// informers carry no TypeMeta).
func reference(obj runtime.Object) (corev1.ObjectReference, error) {
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
