// Package events describes the events.k8s.io API group: a second view of
// the core Events.
package events

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/orch-dev/orch/internal/api/resources"
	"github.com/orch-dev/orch/internal/api/resources/core"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
)

// Resources describes the events.k8s.io group's kinds.
func Resources() []*resources.Resource { return []*resources.Resource{events()} }

// events serves the same stored Events as core v1 in the events.k8s.io
// shape, as Kubernetes does: one set of objects, two views.
func events() *resources.Resource {
	return resources.Described[eventsv1.Event, eventsv1.EventList](&resources.Resource{
		GroupVersionKind: resources.GVK("events.k8s.io", "Event"), Plural: "events", Singular: "event", Namespaced: true,
		StorageKey: "events", Volatile: []string{"*"}, AllowCreateOnUpdate: true, NameRule: resources.PathSegmentName,
		Columns: eventsV1Columns, Row: resources.TypedRow(eventsV1Row),
		Fields: resources.TypedFields(func(e *eventsv1.Event) fields.Set {
			set := core.EventFields(core.EventToCore(e))
			for _, k := range []string{"kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath"} {
				set["regarding."+k] = set["involvedObject."+k]
				delete(set, "involvedObject."+k)
			}
			set["reportingController"] = e.ReportingController
			return set
		}),
		StorageNew: func() runtime.Object { return &corev1.Event{} },
		ToStorage:  func(o runtime.Object) (runtime.Object, error) { return core.EventToCore(o.(*eventsv1.Event)), nil },
		FromStorage: func(o runtime.Object) (runtime.Object, error) {
			return core.EventFromCore(o.(*corev1.Event)), nil
		},
	})
}

var eventsV1Columns = []metav1.TableColumnDefinition{
	resources.Col("Last Seen", "string", 0, eventsv1.Event{}.SwaggerDoc()["eventTime"]),
	resources.Col("Type", "string", 0, eventsv1.Event{}.SwaggerDoc()["type"]),
	resources.Col("Reason", "string", 0, eventsv1.Event{}.SwaggerDoc()["reason"]),
	resources.Col("Object", "string", 0, eventsv1.Event{}.SwaggerDoc()["regarding"]),
	resources.Col("Message", "string", 0, eventsv1.Event{}.SwaggerDoc()["note"]),
}

func eventsV1Row(e *eventsv1.Event) []any {
	last := e.EventTime.Time
	if e.Series != nil {
		last = e.Series.LastObservedTime.Time
	} else if !e.DeprecatedLastTimestamp.IsZero() {
		last = e.DeprecatedLastTimestamp.Time
	}
	return []any{resources.Age(metav1.NewTime(last)), e.Type, e.Reason, strings.ToLower(e.Regarding.Kind) + "/" + e.Regarding.Name, strings.TrimSpace(e.Note)}
}
