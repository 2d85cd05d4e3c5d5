package controller

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/fnv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/rand"
)

// TemplateHash names a pod template (a Deployment's pod-template-hash, a
// DaemonSet's controller-revision-hash): a hash of it, and of the
// collision count, which moves a name another template took, in
// Kubernetes' safe alphabet. Pods and ReplicaSets carry it, so it must
// not change for a template that did not.
func TemplateHash(t *corev1.PodTemplateSpec, collisions *int32) string {
	data, _ := json.Marshal(t)
	if collisions != nil {
		data = fmt.Appendf(data, "%d", *collisions)
	}
	h := fnv.New32a()
	_, _ = h.Write(data) // a hash never fails to write
	return rand.SafeEncodeString(fmt.Sprint(h.Sum32()))
}

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
	if bytes.Equal(a, b) {
		return true // the usual case: both written by TemplatePatch
	}
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && equality.Semantic.DeepEqual(x, y)
}
