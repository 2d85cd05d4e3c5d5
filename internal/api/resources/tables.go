package resources

import (
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"
)

// The descriptions' tables mirror the columns Kubernetes' printers give
// `kubectl get` (priority 1 columns are the extra ones of -o wide).

// Col is one table column.
func Col(name, typ string, priority int32, desc string) metav1.TableColumnDefinition {
	format := ""
	if name == "Name" {
		format = "name"
	}
	return metav1.TableColumnDefinition{Name: name, Type: typ, Format: format, Priority: priority, Description: desc}
}

var (
	// NameCol is the Name column every table starts with.
	NameCol = Col("Name", "string", 0, metav1.ObjectMeta{}.SwaggerDoc()["name"])
	// AgeCol is the Age column.
	AgeCol = Col("Age", "string", 0, metav1.ObjectMeta{}.SwaggerDoc()["creationTimestamp"])
)

// DefaultColumns is the table of a resource without its own printer.
var DefaultColumns = []metav1.TableColumnDefinition{NameCol, Col("Created At", "date", 0, metav1.ObjectMeta{}.SwaggerDoc()["creationTimestamp"])}

// DefaultRow is the row of a resource without its own printer.
func DefaultRow(obj runtime.Object) []any {
	m, err := meta.Accessor(obj)
	if err != nil {
		return []any{"", ""}
	}
	return []any{m.GetName(), m.GetCreationTimestamp().UTC().Format(time.RFC3339)}
}

// Age is how kubectl shows the time since t.
func Age(t metav1.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(time.Since(t.Time))
}

// OrNone shows an empty cell as kubectl does.
func OrNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

// SelectorString shows a label selector as kubectl does.
func SelectorString(sel *metav1.LabelSelector) string {
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return "<error>"
	}
	return OrNone(s.String())
}

// PtrOr is *p, or def when p is nil.
func PtrOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}
