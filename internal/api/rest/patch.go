package rest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/orch-dev/orch/internal/api/registry"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"sigs.k8s.io/yaml"
)

// maxJSONPatchOperations bounds a JSON patch, as Kubernetes does.
const maxJSONPatchOperations = 10000

// limitPatchCopies lets a JSON patch's copy operations add at most a
// request body's worth of data: 1.9 KB of repeated copies would otherwise
// grow an object to a gigabyte in memory before any size check. The limit
// is json-patch's own setting, set once by the first handler.
var limitPatchCopies = sync.OnceFunc(func() { jsonpatch.AccumulatedCopySizeLimit = MaxBodyBytes })

// patch applies a JSON, merge or strategic merge patch to the stored object.
func (q *request) patch() error {
	body, err := q.readBody()
	if err != nil {
		return err
	}
	contentType, _, _ := strings.Cut(q.r.Header.Get("Content-Type"), ";")
	patchType := types.PatchType(strings.TrimSpace(contentType))
	switch patchType {
	case types.StrategicMergePatchType:
		if q.st.Resource.Custom {
			// A custom resource's schema has no patch strategies: Kubernetes
			// refuses strategic merge patches for them.
			return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 415,
				Reason: metav1.StatusReasonUnsupportedMediaType, Message: fmt.Sprintf(
					"the body of the request was in an unknown format - accepted media types include: %s, %s, %s",
					types.JSONPatchType, types.MergePatchType, types.ApplyYAMLPatchType)}}
		}
	case types.JSONPatchType, types.MergePatchType:
	case types.ApplyYAMLPatchType:
		return q.apply(body)
	default:
		// CBOR apply too, as Kubernetes without its CBOR feature gate.
		return unsupportedPatch(patchType, "")
	}
	update := func(ctx context.Context, current runtime.Object) (runtime.Object, error) {
		if current == nil {
			return nil, apierrors.NewNotFound(q.st.Resource.GroupVersionResource().GroupResource(), q.info.Name)
		}
		return q.applyPatch(patchType, body, current, q.st.Resource.GroupVersionKind, q.st.Resource.New)
	}
	out, _, err := q.st.Update(q.ctx(), q.namespace, q.info.Name, update,
		registry.UpdateOptions{WriteOptions: q.writeOptions(), Subresource: q.info.Subresource})
	if err != nil {
		return err
	}
	return q.respond(200, out)
}

// apply serves a server-side apply (application/apply-patch+yaml): the
// body is an apply configuration, a partial object of the resource's kind
// holding only the fields its manager has opinions about.
func (q *request) apply(body []byte) error {
	r := q.st.Resource
	if q.info.Subresource != "" && q.info.Subresource != "status" {
		return unsupportedPatch(types.ApplyYAMLPatchType, fmt.Sprintf("server-side apply is served on the resource and its status, not on %s", q.info.Subresource))
	}
	patch := &unstructured.Unstructured{Object: map[string]any{}}
	// Parsed strictly first; a body that only repeats a field parses
	// leniently, and fieldValidation says what becomes of the repeat.
	if strictErr := yaml.UnmarshalStrict(body, &patch.Object); strictErr != nil {
		patch.Object = map[string]any{}
		if err := yaml.Unmarshal(body, &patch.Object); err != nil {
			return apierrors.NewBadRequest(fmt.Sprintf("error decoding YAML: %v", err))
		}
		switch q.r.URL.Query().Get("fieldValidation") {
		case metav1.FieldValidationIgnore:
		case metav1.FieldValidationStrict:
			return apierrors.NewBadRequest(fmt.Sprintf("error strict decoding YAML: %v", strictErr))
		default:
			q.w.Header().Add("Warning", `299 - `+strconv.Quote(strictErr.Error()))
		}
	}
	if patch.Object == nil {
		return apierrors.NewBadRequest("error decoding YAML: the apply configuration is empty: send a " + r.Kind + " object")
	}
	gvk := patch.GroupVersionKind()
	if gvk.Kind == "" || patch.GetAPIVersion() == "" {
		return apierrors.NewBadRequest("the apply configuration must set apiVersion and kind")
	}
	if gvk.Kind != r.Kind {
		return apierrors.NewBadRequest(fmt.Sprintf("the kind in the data (%s) does not match the expected kind (%s)", gvk.Kind, r.Kind))
	}
	if err := q.checkNamespace(patch, q.info.Name); err != nil {
		return err
	}
	if r.Normalize != nil && gvk == r.GroupVersionKind {
		// The fields a custom resource's apply configuration has that its
		// schema does not declare are reported as fieldValidation asks, in
		// the words of Kubernetes' typed apply (a copy is normalized: the
		// configuration itself must not take defaults it did not set).
		unknown := r.Normalize(patch.DeepCopy())
		switch q.r.URL.Query().Get("fieldValidation") {
		case metav1.FieldValidationIgnore:
		case metav1.FieldValidationStrict:
			if len(unknown) > 0 {
				msgs := make([]string, len(unknown))
				for i, f := range unknown {
					msgs[i] = "." + f + ": field not declared in schema"
				}
				return apierrors.NewBadRequest(fmt.Sprintf("failed to create typed patch object (%s; %s): %s", q.info.Name, gvk, strings.Join(msgs, ", ")))
			}
		default:
			for _, f := range unknown {
				q.w.Header().Add("Warning", `299 - `+strconv.Quote(fmt.Sprintf("unknown field %q", f)))
			}
		}
		for _, f := range unknown {
			dropPath(patch.Object, f)
		}
	}
	var force bool
	if f := q.r.URL.Query().Get("force"); f != "" {
		force, _ = strconv.ParseBool(f) // checked by checkOptions
	}
	out, created, err := q.st.Apply(q.ctx(), q.namespace, q.info.Name, patch,
		registry.ApplyOptions{WriteOptions: q.writeOptions(), Force: force, Subresource: q.info.Subresource})
	if err != nil {
		return err
	}
	if created {
		return q.respond(http.StatusCreated, out)
	}
	return q.respond(http.StatusOK, out)
}

// dropPath removes the field at path (dotted, with [i] for list items, as
// pruning reports it) from an object.
func dropPath(obj map[string]any, path string) {
	var cur any = obj
	parts := strings.Split(path, ".")
	for i, part := range parts {
		name, index, hasIndex := strings.Cut(part, "[")
		m, ok := cur.(map[string]any)
		if !ok {
			return
		}
		if i == len(parts)-1 && !hasIndex {
			delete(m, name)
			return
		}
		cur = m[name]
		for hasIndex {
			var n string
			n, index, _ = strings.Cut(index, "]")
			k, err := strconv.Atoi(n)
			list, ok := cur.([]any)
			if err != nil || !ok || k < 0 || k >= len(list) {
				return
			}
			cur = list[k]
			_, index, hasIndex = strings.Cut(index, "[")
		}
	}
}

func unsupportedPatch(pt types.PatchType, why string) error {
	msg := fmt.Sprintf("the body of the request was in an unknown format - accepted media types include: %s, %s, %s, %s",
		types.JSONPatchType, types.MergePatchType, types.StrategicMergePatchType, types.ApplyYAMLPatchType)
	if why != "" {
		msg = fmt.Sprintf("%s: %s", pt, why)
	}
	return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 415,
		Reason: metav1.StatusReasonUnsupportedMediaType, Message: msg}}
}

// applyPatch patches current's JSON and decodes the result. A patch that
// leaves the resourceVersion alone makes an unconditional update, retried
// on conflict; one that sets it is a precondition, as in Kubernetes.
func (q *request) applyPatch(pt types.PatchType, patch []byte, current runtime.Object, want schema.GroupVersionKind, newObj func() runtime.Object) (runtime.Object, error) {
	original, err := json.Marshal(current)
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	if pt != types.JSONPatchType {
		// Merge patches may arrive as YAML from hand-written clients.
		if js, err := yaml.YAMLToJSON(patch); err == nil {
			patch = js
		}
	}
	var patched []byte
	switch pt {
	case types.JSONPatchType:
		ops, err := jsonpatch.DecodePatch(patch)
		if err != nil {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("invalid JSON patch: %v", err))
		}
		if len(ops) > maxJSONPatchOperations {
			return nil, apierrors.NewRequestEntityTooLargeError(fmt.Sprintf("the JSON patch has %d operations, more than the limit of %d", len(ops), maxJSONPatchOperations))
		}
		if patched, err = ops.Apply(original); errors.As(err, new(*jsonpatch.AccumulatedCopySizeError)) {
			return nil, apierrors.NewRequestEntityTooLargeError(err.Error())
		} else if err != nil {
			return nil, &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 422,
				Reason: metav1.StatusReasonInvalid, Message: fmt.Sprintf("the JSON patch could not be applied: %v", err)}}
		}
	case types.MergePatchType:
		if patched, err = jsonpatch.MergePatch(original, patch); err != nil {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("invalid merge patch: %v", err))
		}
	case types.StrategicMergePatchType:
		schema, err := strategicpatch.NewPatchMetaFromStruct(newObj())
		if err != nil {
			return nil, apierrors.NewInternalError(err)
		}
		var originalMap, patchMap map[string]any
		if err := json.Unmarshal(original, &originalMap); err != nil {
			return nil, apierrors.NewInternalError(err)
		}
		if err := json.Unmarshal(patch, &patchMap); err != nil {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("invalid strategic merge patch: %v", err))
		}
		result, err := strategicpatch.StrategicMergeMapPatchUsingLookupPatchMeta(originalMap, patchMap, schema)
		if err != nil {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("the strategic merge patch could not be applied: %v", err))
		}
		if patched, err = json.Marshal(result); err != nil {
			return nil, apierrors.NewInternalError(err)
		}
	}
	obj, err := q.decode(patched, "application/json", want, newObj())
	if err != nil {
		return nil, err
	}
	cm, _ := metaOf(current)
	m, err := metaOf(obj)
	if err != nil {
		return nil, err
	}
	if m.GetName() != cm.GetName() || m.GetNamespace() != cm.GetNamespace() {
		return nil, apierrors.NewBadRequest("a patch may not change metadata.name or metadata.namespace")
	}
	if m.GetResourceVersion() == cm.GetResourceVersion() {
		m.SetResourceVersion("")
	}
	return obj, nil
}

func metaOf(obj runtime.Object) (metav1.Object, error) {
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	return m, nil
}
