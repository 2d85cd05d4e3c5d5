package builtin

import (
	"reflect"
	"testing"

	"github.com/orch-dev/orch/internal/api/resources"
	"github.com/orch-dev/orch/internal/apis"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestDescriptionsAreComplete checks what every description must hold, so a
// kind added with a hole fails here rather than on a user's request.
func TestDescriptionsAreComplete(t *testing.T) {
	scheme := apis.NewScheme()
	seen := map[schema.GroupVersionResource]bool{}
	keys := map[string]schema.GroupVersionKind{}
	for _, r := range Resources() {
		t.Run(r.GroupResource().String(), func(t *testing.T) {
			gvr := r.GroupVersionResource()
			if seen[gvr] {
				t.Fatalf("%s is described twice", gvr)
			}
			seen[gvr] = true
			if r.Plural == "" || r.Singular == "" || r.Kind == "" || r.StorageKey == "" || r.New == nil || r.NewList == nil {
				t.Fatalf("names, storage key and constructors are required: %+v", r)
			}
			want, err := scheme.New(r.GroupVersionKind)
			if err != nil {
				t.Fatalf("%s is not in the served scheme (internal/apis): %v", r.GroupVersionKind, err)
			}
			if got := r.New(); reflect.TypeOf(got) != reflect.TypeOf(want) {
				t.Fatalf("New() gives %T, the scheme has %T for %s", got, want, r.GroupVersionKind)
			}
			if list, err := scheme.New(r.GroupVersion().WithKind(r.Kind + "List")); err != nil || reflect.TypeOf(list) != reflect.TypeOf(r.NewList()) {
				t.Fatalf("NewList() gives %T, the scheme has %T (%v)", r.NewList(), list, err)
			}
			// Two resources may share stored objects only as views of one
			// kind (events.k8s.io over core Events).
			if other, ok := keys[r.StorageKey]; ok && (r.ToStorage == nil || r.StorageNew == nil) {
				t.Fatalf("storage key %q is %s's too", r.StorageKey, other)
			}
			keys[r.StorageKey] = r.GroupVersionKind
			if (r.Columns == nil) != (r.Row == nil) {
				t.Fatal("Columns and Row come together")
			}
			if r.Row != nil {
				if cells := r.Row(r.New()); len(cells) != len(r.Columns) {
					t.Fatalf("a row has %d cells for %d columns", len(cells), len(r.Columns))
				}
			}
			for _, sub := range r.Subresources {
				if sub.Name == "" || len(sub.Verbs) == 0 {
					t.Fatalf("subresource %+v has no name or verbs", sub)
				}
				switch sub.Serve {
				case resources.ServeScale:
					if sub.Scale == nil || sub.Scale.Get == nil || sub.Scale.Set == nil {
						t.Fatalf("%s: a scale subresource needs its accessors", sub.Name)
					}
				case resources.ServeAction:
					if sub.NewBody == nil || sub.Apply == nil {
						t.Fatalf("%s: an action subresource needs NewBody and Apply", sub.Name)
					}
				}
				if !sub.Kind.Empty() {
					if _, err := scheme.New(sub.Kind); err != nil {
						t.Fatalf("%s speaks %s, which is not in the served scheme: %v", sub.Name, sub.Kind, err)
					}
				}
			}
		})
	}
}

// TestScaleAccessors round-trips replicas through every scale subresource.
func TestScaleAccessors(t *testing.T) {
	for _, r := range Resources() {
		access := r.Scale()
		if access == nil {
			continue
		}
		obj := r.New()
		access.Set(obj, 7)
		if desired, _, _ := access.Get(obj); desired == nil || *desired != 7 {
			t.Errorf("%s: set 7 replicas, read back %v", r.GroupResource(), desired)
		}
	}
}
