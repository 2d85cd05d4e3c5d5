package controller

import (
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
)

// TemplatePatch is what a ControllerRevision of a DaemonSet or StatefulSet
// holds, as Kubernetes writes it: the pod template as a strategic merge
// patch that replaces the set's, which `kubectl rollout undo` applies.
// Keys come sorted (a map), so equal templates give equal bytes, as
// kubectl compares them.
func TemplatePatch(t *corev1.PodTemplateSpec) ([]byte, error) {
	raw, err := json.Marshal(t)
	if err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	var template map[string]any
	if err := json.Unmarshal(raw, &template); err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	template["$patch"] = "replace"
	return json.Marshal(map[string]any{"spec": map[string]any{"template": template}})
}

// SamePatch says whether two revisions' data hold the same JSON, however
// spaced or ordered (a revision a client wrote may be either).
func SamePatch(a, b []byte) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && equality.Semantic.DeepEqual(x, y)
}
