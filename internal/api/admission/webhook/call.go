package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/orch-dev/orch/internal/api/admission"
	"github.com/orch-dev/orch/internal/api/auth"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

// maxResponse bounds what a webhook may answer: Kubernetes' own request
// body limit, which no sane review nears.
const maxResponse = 3 << 20

// defaultTimeout is Kubernetes' default for timeoutSeconds.
const defaultTimeout = 10 * time.Second

// callError is a webhook that could not be called or answered nonsense:
// its failure policy decides.
type callError struct {
	webhook string
	reason  error
}

func (e *callError) Error() string {
	return fmt.Sprintf("failed calling webhook %q: %v", e.webhook, e.reason)
}

// status is the error a failing-closed webhook gives the client, as
// Kubernetes words it.
func (e *callError) status() error { return apierrors.NewInternalError(e) }

// reviewVersion picks the AdmissionReview version to send: the first of
// the webhook's that the server speaks.
func reviewVersion(h *hook) (string, bool) {
	for _, v := range h.AdmissionReviewVersions {
		if v == "v1" || v == "v1beta1" {
			return v, true
		}
	}
	return "", false
}

// encodeObject is obj as JSON with its apiVersion and kind.
func encodeObject(a *admission.Attributes, obj runtime.Object) (runtime.RawExtension, error) {
	if obj == nil {
		return runtime.RawExtension{}, nil
	}
	if u, ok := obj.(*unstructured.Unstructured); ok {
		data, err := json.Marshal(u.Object)
		return runtime.RawExtension{Raw: data}, err
	}
	obj = obj.DeepCopyObject()
	if obj.GetObjectKind().GroupVersionKind().Kind == "" {
		obj.GetObjectKind().SetGroupVersionKind(kindOf(a, obj))
	}
	data, err := json.Marshal(obj)
	return runtime.RawExtension{Raw: data}, err
}

// review builds the request sent to h.
func review(ctx context.Context, a *admission.Attributes, version string) (*admissionv1.AdmissionReview, error) {
	gvk := kindOf(a, a.Object)
	if a.Object == nil {
		gvk = kindOf(a, a.OldObject)
	}
	kind := metav1.GroupVersionKind{Group: gvk.Group, Version: gvk.Version, Kind: gvk.Kind}
	resource := metav1.GroupVersionResource{Group: a.Resource.Group, Version: a.Resource.Version, Resource: a.Resource.Plural}
	// A request converted for the webhook (matchPolicy Equivalent) says
	// which version it was made through.
	requestKind, requestResource := kind, resource
	if r := a.Request; r != nil {
		requestKind = metav1.GroupVersionKind{Group: r.Group, Version: r.Version, Kind: kind.Kind}
		requestResource = metav1.GroupVersionResource{Group: r.Group, Version: r.Version, Resource: r.Plural}
	}
	req := &admissionv1.AdmissionRequest{
		UID: types.UID(uuid.NewString()), Kind: kind, Resource: resource, SubResource: a.Subresource,
		RequestKind: &requestKind, RequestResource: &requestResource, RequestSubResource: a.Subresource,
		Name: a.Name, Namespace: a.Namespace, Operation: admissionv1.Operation(a.Operation), DryRun: &a.DryRun,
	}
	if u, ok := auth.UserFrom(ctx); ok {
		req.UserInfo = authenticationv1.UserInfo{Username: u.Name, UID: u.UID, Groups: u.Groups}
		if len(u.Extra) > 0 {
			req.UserInfo.Extra = map[string]authenticationv1.ExtraValue{}
			for k, v := range u.Extra {
				req.UserInfo.Extra[k] = v
			}
		}
	}
	var err error
	if req.Object, err = encodeObject(a, a.Object); err != nil {
		return nil, err
	}
	if req.OldObject, err = encodeObject(a, a.OldObject); err != nil {
		return nil, err
	}
	if a.Options != nil {
		if req.Options, err = encodeObject(a, a.Options); err != nil {
			return nil, err
		}
	}
	return &admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/" + version, Kind: "AdmissionReview"}, Request: req}, nil
}

// call sends the review to h and returns its verified response.
func (d *Dispatcher) call(ctx context.Context, h *hook, a *admission.Attributes) (*admissionv1.AdmissionResponse, error) {
	version, ok := reviewVersion(h)
	if !ok {
		return nil, &callError{h.Name, fmt.Errorf("webhook does not accept known AdmissionReview versions (%v)", h.AdmissionReviewVersions)}
	}
	rev, err := review(ctx, a, version)
	if err != nil {
		return nil, &callError{h.Name, fmt.Errorf("could not create admission objects: %w", err)}
	}
	body, err := json.Marshal(rev)
	if err != nil {
		return nil, &callError{h.Name, fmt.Errorf("could not create admission objects: %w", err)}
	}
	timeout := defaultTimeout
	if h.TimeoutSeconds != nil && *h.TimeoutSeconds > 0 {
		timeout = time.Duration(*h.TimeoutSeconds) * time.Second
	}
	h.clientOnce.Do(func() { h.client = NewClient(h.ClientConfig, d.services) })
	data, err := h.client.Post(ctx, body, timeout)
	if err != nil {
		return nil, &callError{h.Name, err}
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, &callError{h.Name, fmt.Errorf("failed to call webhook: %w", err)}
	}
	if err := verify(rev, &out, h.mutating); err != nil {
		return nil, &callError{h.Name, fmt.Errorf("received invalid webhook response: %w", err)}
	}
	return out.Response, nil
}

// verify applies Kubernetes' checks to a webhook's answer.
func verify(sent, got *admissionv1.AdmissionReview, mutating bool) error {
	r := got.Response
	if r == nil {
		return errors.New("webhook response was absent")
	}
	if r.UID != sent.Request.UID {
		return fmt.Errorf("expected response.uid=%q, got %q", sent.Request.UID, r.UID)
	}
	if sent.APIVersion == "admission.k8s.io/v1" && (got.APIVersion != sent.APIVersion || got.Kind != "AdmissionReview") {
		return fmt.Errorf("expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got %s, Kind=%s", got.APIVersion, got.Kind)
	}
	if !mutating {
		if len(r.Patch) > 0 {
			return errors.New("validating webhook may not return response.patch")
		}
		if r.PatchType != nil {
			return errors.New("validating webhook may not return response.patchType")
		}
		return nil
	}
	if sent.APIVersion == "admission.k8s.io/v1beta1" && len(r.Patch) > 0 && r.PatchType == nil {
		pt := admissionv1.PatchTypeJSONPatch
		r.PatchType = &pt
	}
	if len(r.Patch) > 0 && r.PatchType == nil {
		return errors.New("webhook returned response.patch but not response.patchType")
	}
	if len(r.Patch) == 0 && r.PatchType != nil {
		return errors.New("webhook returned response.patchType but not response.patch")
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// sideEffectsAllowDryRun: only webhooks that promise no side effects on
// a dry run are called for one.
func sideEffectsAllowDryRun(h *hook) bool {
	return h.SideEffects != nil && (*h.SideEffects == admissionregistrationv1.SideEffectClassNone || *h.SideEffects == admissionregistrationv1.SideEffectClassNoneOnDryRun)
}
