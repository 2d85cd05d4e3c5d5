package apply

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
)

func TestManagerName(t *testing.T) {
	for _, tc := range []struct{ fieldManager, userAgent, want string }{
		{"helm", "kubectl/v1.37.2 (linux/amd64)", "helm"},
		{"", "kubectl/v1.37.2 (linux/amd64) kubernetes/abc", "kubectl"},
		{"", "orch-loops", "orch-loops"},
		{"", "bad\x00agent\x7f/1", "badagent"},
		{"", strings.Repeat("a", 200) + "/1", strings.Repeat("a", 128)},
		{"", "", ""},
	} {
		if got := ManagerName(tc.fieldManager, tc.userAgent); got != tc.want {
			t.Errorf("ManagerName(%q, %q) = %q, want %q", tc.fieldManager, tc.userAgent, got, tc.want)
		}
	}
}

// TestStatusIsNotTheMainResources checks the reset fields: an apply to the
// main resource owns no status field, and one to status owns no spec
// field, as Kubernetes' strategies reset them.
func TestStatusIsNotTheMainResources(t *testing.T) {
	kind := appsv1.SchemeGroupVersion.WithKind("Deployment")
	m := NewManagers(kind, true)
	live := &appsv1.Deployment{TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"}, ObjectMeta: metav1.ObjectMeta{Name: "d", Namespace: "ns"}}
	cfg := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apps/v1", "kind": "Deployment", "metadata": map[string]any{"name": "d", "namespace": "ns"},
		"spec": map[string]any{"replicas": int64(3)}, "status": map[string]any{"replicas": int64(2)},
	}}
	for _, tc := range []struct{ subresource, owns, ownsNot string }{
		{"", "f:spec", "f:status"},
		{"status", "f:status", "f:spec"},
	} {
		fm, err := m.For(tc.subresource)
		if err != nil {
			t.Fatal(err)
		}
		out, err := fm.Apply(live.DeepCopy(), cfg.DeepCopy(), "me", false)
		if err != nil {
			t.Fatalf("%q: %v", tc.subresource, err)
		}
		d := out.(*appsv1.Deployment)
		if d.Spec.Replicas == nil || *d.Spec.Replicas != 3 {
			t.Errorf("%q: applied object %+v", tc.subresource, d.Spec)
		}
		fields := d.ManagedFields[0].FieldsV1.GetRawString()
		if !strings.Contains(fields, tc.owns) || strings.Contains(fields, tc.ownsNot) || d.ManagedFields[0].Subresource != tc.subresource {
			t.Errorf("%q: owns %s (subresource %q)", tc.subresource, fields, d.ManagedFields[0].Subresource)
		}
	}
	// An update records what changed, under the writer's name.
	fm, _ := m.For("")
	updated := live.DeepCopy()
	updated.Spec.Replicas = ptr.To[int32](1)
	out, err := fm.Update(live, updated, "kubectl-edit")
	if err != nil {
		t.Fatal(err)
	}
	entries := out.(*appsv1.Deployment).ManagedFields
	if len(entries) != 1 || entries[0].Manager != "kubectl-edit" || entries[0].Operation != metav1.ManagedFieldsOperationUpdate ||
		!strings.Contains(entries[0].FieldsV1.GetRawString(), "f:replicas") {
		t.Errorf("after an update: %+v", entries)
	}
}
