package core

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/orch-dev/orch/internal/api/resources"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

func events() *resources.Resource {
	return resources.Described[corev1.Event, corev1.EventList](&resources.Resource{
		GroupVersionKind: resources.GVK("", "Event"), Plural: "events", Singular: "event", Namespaced: true,
		ShortNames: []string{"ev"}, StorageKey: "events", Volatile: []string{"*"}, AllowCreateOnUpdate: true,
		NameRule: resources.PathSegmentName,
		Validate: resources.TypedValidate(validateEvent), Fields: resources.TypedFields(EventFields),
		Columns: eventColumns, Row: resources.TypedRow(eventRow),
	})
}

// EventFields are the fields a core Event may be selected by.
func EventFields(e *corev1.Event) fields.Set {
	source := e.Source.Component
	if source == "" {
		source = e.ReportingController
	}
	return fields.Set{
		"involvedObject.kind": e.InvolvedObject.Kind, "involvedObject.namespace": e.InvolvedObject.Namespace,
		"involvedObject.name": e.InvolvedObject.Name, "involvedObject.uid": string(e.InvolvedObject.UID),
		"involvedObject.apiVersion": e.InvolvedObject.APIVersion, "involvedObject.resourceVersion": e.InvolvedObject.ResourceVersion,
		"involvedObject.fieldPath": e.InvolvedObject.FieldPath, "reason": e.Reason, "reportingComponent": e.ReportingController,
		"source": source, "type": e.Type,
	}
}

func validateEvent(e *corev1.Event) field.ErrorList {
	var errs field.ErrorList
	if e.InvolvedObject.Namespace != "" && e.Namespace != "" && e.InvolvedObject.Namespace != e.Namespace {
		errs = append(errs, field.Invalid(field.NewPath("involvedObject", "namespace"), e.InvolvedObject.Namespace, "does not match event.namespace"))
	}
	return errs
}

var eventColumns = []metav1.TableColumnDefinition{
	resources.Col("Last Seen", "string", 0, corev1.Event{}.SwaggerDoc()["lastTimestamp"]),
	resources.Col("Type", "string", 0, corev1.Event{}.SwaggerDoc()["type"]),
	resources.Col("Reason", "string", 0, corev1.Event{}.SwaggerDoc()["reason"]),
	resources.Col("Object", "string", 0, corev1.Event{}.SwaggerDoc()["involvedObject"]),
	resources.Col("Subobject", "string", 1, corev1.ObjectReference{}.SwaggerDoc()["fieldPath"]),
	resources.Col("Source", "string", 1, corev1.Event{}.SwaggerDoc()["source"]),
	resources.Col("Message", "string", 0, corev1.Event{}.SwaggerDoc()["message"]),
	resources.Col("First Seen", "string", 1, corev1.Event{}.SwaggerDoc()["firstTimestamp"]),
	resources.Col("Count", "string", 1, corev1.Event{}.SwaggerDoc()["count"]),
	{Name: "Name", Type: "string", Format: "name", Priority: 1, Description: metav1.ObjectMeta{}.SwaggerDoc()["name"]},
}

func eventRow(e *corev1.Event) []any {
	first, last := e.FirstTimestamp, e.LastTimestamp
	if last.IsZero() {
		last = metav1.NewTime(e.EventTime.Time)
	}
	if first.IsZero() {
		first = last
	}
	lastSeen := resources.Age(last)
	if e.Series != nil {
		lastSeen = fmt.Sprintf("%s (x%d over %s)", resources.Age(metav1.NewTime(e.Series.LastObservedTime.Time)), e.Series.Count, resources.Age(first))
	} else if e.Count > 1 {
		lastSeen = fmt.Sprintf("%s (x%d over %s)", lastSeen, e.Count, resources.Age(first))
	}
	obj := strings.ToLower(e.InvolvedObject.Kind) + "/" + e.InvolvedObject.Name
	source := e.Source.Component
	if source == "" {
		source = e.ReportingController
	}
	if e.Source.Host != "" {
		source += ", " + e.Source.Host
	}
	return []any{lastSeen, e.Type, e.Reason, obj, e.InvolvedObject.FieldPath, source,
		strings.TrimSpace(e.Message), resources.Age(first), int64(e.Count), e.Name}
}

// EventToCore converts an events.k8s.io/v1 Event to the core v1 Event it is
// stored as; the field mapping is Kubernetes' own.
func EventToCore(e *eventsv1.Event) *corev1.Event {
	out := &corev1.Event{
		ObjectMeta:          e.ObjectMeta,
		InvolvedObject:      e.Regarding,
		Related:             e.Related,
		Reason:              e.Reason,
		Message:             e.Note,
		Source:              e.DeprecatedSource,
		FirstTimestamp:      e.DeprecatedFirstTimestamp,
		LastTimestamp:       e.DeprecatedLastTimestamp,
		Count:               e.DeprecatedCount,
		Type:                e.Type,
		EventTime:           e.EventTime,
		Action:              e.Action,
		ReportingController: e.ReportingController,
		ReportingInstance:   e.ReportingInstance,
	}
	out.APIVersion, out.Kind = "v1", "Event"
	if e.Series != nil {
		out.Series = &corev1.EventSeries{Count: e.Series.Count, LastObservedTime: e.Series.LastObservedTime}
	}
	return out
}

// EventFromCore is EventToCore's inverse.
func EventFromCore(e *corev1.Event) *eventsv1.Event {
	out := &eventsv1.Event{
		ObjectMeta:               e.ObjectMeta,
		EventTime:                e.EventTime,
		ReportingController:      e.ReportingController,
		ReportingInstance:        e.ReportingInstance,
		Action:                   e.Action,
		Reason:                   e.Reason,
		Regarding:                e.InvolvedObject,
		Related:                  e.Related,
		Note:                     e.Message,
		Type:                     e.Type,
		DeprecatedSource:         e.Source,
		DeprecatedFirstTimestamp: e.FirstTimestamp,
		DeprecatedLastTimestamp:  e.LastTimestamp,
		DeprecatedCount:          e.Count,
	}
	out.APIVersion, out.Kind = "events.k8s.io/v1", "Event"
	if e.Series != nil {
		out.Series = &eventsv1.EventSeries{Count: e.Series.Count, LastObservedTime: e.Series.LastObservedTime}
	}
	return out
}
