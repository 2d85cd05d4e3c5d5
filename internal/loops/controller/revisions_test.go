package controller

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestTemplateHashIsStable: the hash ReplicaSets and daemon pods carry
// does not change from one orch to the next for the same template (a
// change would replace every pod of every Deployment and DaemonSet on
// upgrade); the collision count moves it; revision data compare alike
// however spaced.
func TestTemplateHashIsStable(t *testing.T) {
	tmpl := &corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox:1"}}}}
	one := int32(1)
	got, moved := TemplateHash(tmpl, nil), TemplateHash(tmpl, &one)
	if got != "f7cd7757b" || moved == got {
		t.Errorf("TemplateHash: %q, with a collision %q", got, moved)
	}
	patch, err := TemplatePatch(tmpl)
	if err != nil {
		t.Fatal(err)
	}
	if !SamePatch(patch, []byte(" "+string(patch))) || SamePatch(patch, []byte(`{"spec":{}}`)) {
		t.Errorf("SamePatch of %s", patch)
	}
}
