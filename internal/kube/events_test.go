package kube

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestEventSeries: an event said again within ten minutes extends the
// first one's series (count, last observed) under the same name, as
// client-go's correlator does; a different note, or one said after the
// window, is a new Event.
func TestEventSeries(t *testing.T) {
	e := &Events{recent: map[string]*eventsv1.Event{}}
	start := time.Now()
	event := func(note string, at time.Time) *eventsv1.Event {
		return e.series(&eventsv1.Event{ObjectMeta: metav1.ObjectMeta{Name: note + at.String()}, EventTime: metav1.NewMicroTime(at),
			Regarding:         corev1.ObjectReference{Kind: "Pod", Name: "web", UID: "u1", FieldPath: "spec.containers{main}"},
			ReportingInstance: "node-1", Type: corev1.EventTypeWarning, Reason: "BackOff", Note: note}, at)
	}
	first := event("back-off", start)
	if first.Series != nil {
		t.Fatalf("a first event has a series: %+v", first.Series)
	}
	for i, at := range []time.Time{start.Add(time.Minute), start.Add(9 * time.Minute)} {
		ev := event("back-off", at)
		if ev.Name != first.Name || ev.Series == nil || ev.Series.Count != int32(i+2) || !ev.Series.LastObservedTime.Time.Equal(at) {
			t.Errorf("repeat %d: %s %+v, want %s in a series of %d", i+1, ev.Name, ev.Series, first.Name, i+2)
		}
	}
	if ev := event("something else", start.Add(10*time.Minute)); ev.Series != nil {
		t.Errorf("another note joined the series: %+v", ev.Series)
	}
	if ev := event("back-off", start.Add(20*time.Minute)); ev.Series != nil || ev.Name == first.Name {
		t.Errorf("a repeat after ten quiet minutes joined the old series: %s %+v", ev.Name, ev.Series)
	}
}

// TestEventSeriesOwnsItsMemory: the poster's client writes TypeMeta into
// the event it sends while the next repeat is being made from the
// series; they must not share an object (a data race under -race).
func TestEventSeriesOwnsItsMemory(t *testing.T) {
	e := &Events{recent: map[string]*eventsv1.Event{}}
	now := time.Now()
	event := func(at time.Time) *eventsv1.Event {
		return e.series(&eventsv1.Event{ObjectMeta: metav1.ObjectMeta{Name: "web.1"}, EventTime: metav1.NewMicroTime(at),
			Regarding: corev1.ObjectReference{Kind: "Pod", Name: "web"}, Reason: "BackOff", Note: "back-off"}, at)
	}
	for i, at := range []time.Time{now, now.Add(time.Second)} {
		sent := event(at)
		sent.Kind, sent.APIVersion = "Event", "events.k8s.io/v1"
		sent.ReportingController = "changed by the poster"
		if next := event(at.Add(time.Second)); next.ReportingController != "" {
			t.Fatalf("post %d: the series shares the posted event", i)
		}
	}
}
