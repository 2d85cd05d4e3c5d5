package customresource

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/orch-dev/orch/internal/api/admission/webhook"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// conversionTimeout is how long Kubernetes waits for a conversion webhook.
const conversionTimeout = 30 * time.Second

// converter turns a definition's custom resources from one version into
// another: by their apiVersion alone (conversion strategy None) or through
// the definition's conversion webhook with a ConversionReview, as
// Kubernetes does. Objects are stored in the storage version and read in
// the version asked for.
type converter struct {
	group  string
	kind   schema.GroupKind
	client *webhook.Client // nil for None
	// reviewVersion is the ConversionReview version the webhook takes.
	reviewVersion string
}

func newConverter(crd *apiextensionsv1.CustomResourceDefinition, services webhook.ServiceResolver) *converter {
	c := &converter{group: crd.Spec.Group, kind: schema.GroupKind{Group: crd.Spec.Group, Kind: Names(crd).Kind}}
	conv := crd.Spec.Conversion
	if conv == nil || conv.Strategy != apiextensionsv1.WebhookConverter || conv.Webhook == nil || conv.Webhook.ClientConfig == nil {
		return c
	}
	cc := conv.Webhook.ClientConfig
	hook := admissionregistrationv1.WebhookClientConfig{URL: cc.URL, CABundle: cc.CABundle}
	if s := cc.Service; s != nil {
		hook.Service = &admissionregistrationv1.ServiceReference{Namespace: s.Namespace, Name: s.Name, Path: s.Path, Port: s.Port}
	}
	c.client = webhook.NewClient(hook, services)
	c.reviewVersion = "v1"
	for _, v := range conv.Webhook.ConversionReviewVersions {
		if v == "v1" || v == "v1beta1" {
			c.reviewVersion = v
			break
		}
	}
	return c
}

// convert returns obj in version (obj itself when it is in it already).
func (c *converter) convert(obj runtime.Object, version string) (runtime.Object, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, apierrors.NewInternalError(fmt.Errorf("cannot convert %T", obj))
	}
	want := schema.GroupVersion{Group: c.group, Version: version}.String()
	if u.GetAPIVersion() == want {
		return u, nil
	}
	if c.client == nil {
		out := u.DeepCopy()
		out.SetAPIVersion(want)
		return out, nil
	}
	out, err := c.review(u, want)
	if err != nil {
		return nil, apierrors.NewInternalError(fmt.Errorf("conversion webhook for %s failed: %w", c.kind.WithVersion(version), err))
	}
	return out, nil
}

// review asks the conversion webhook for one object in apiVersion want and
// checks what it answers as Kubernetes does: the request's uid, a success,
// one object of the wanted apiVersion and the same kind, and metadata
// changed only in labels and annotations.
func (c *converter) review(u *unstructured.Unstructured, want string) (*unstructured.Unstructured, error) {
	raw, err := json.Marshal(u.Object)
	if err != nil {
		return nil, err
	}
	uid := types.UID(uuid.NewString())
	req := map[string]any{"apiVersion": "apiextensions.k8s.io/" + c.reviewVersion, "kind": "ConversionReview",
		"request": map[string]any{"uid": uid, "desiredAPIVersion": want, "objects": []json.RawMessage{raw}}}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	data, err := c.client.Post(context.Background(), body, conversionTimeout)
	if err != nil {
		return nil, err
	}
	var review apiextensionsv1.ConversionReview
	if err := json.Unmarshal(data, &review); err != nil {
		return nil, fmt.Errorf("received invalid webhook response: %w", err)
	}
	r := review.Response
	switch {
	case r == nil:
		return nil, errors.New("conversion webhook response was absent")
	case r.UID != uid:
		return nil, fmt.Errorf("expected response.uid=%q, got %q", uid, r.UID)
	case r.Result.Status != metav1.StatusSuccess:
		return nil, fmt.Errorf("conversion request failed: %s", r.Result.Message)
	case len(r.ConvertedObjects) != 1:
		return nil, fmt.Errorf("returned %d objects, expected 1", len(r.ConvertedObjects))
	}
	out := &unstructured.Unstructured{}
	if err := out.UnmarshalJSON(r.ConvertedObjects[0].Raw); err != nil {
		return nil, fmt.Errorf("invalid converted object: %w", err)
	}
	if out.GetAPIVersion() != want {
		return nil, fmt.Errorf("invalid converted object: expected apiVersion %s, got %s", want, out.GetAPIVersion())
	}
	if out.GetKind() != u.GetKind() {
		return nil, fmt.Errorf("invalid converted object: expected kind %s, got %s", u.GetKind(), out.GetKind())
	}
	// Only labels and annotations of the metadata may change.
	meta, _, _ := unstructured.NestedMap(u.Object, "metadata")
	labels, annotations := out.GetLabels(), out.GetAnnotations()
	if err := unstructured.SetNestedMap(out.Object, meta, "metadata"); err != nil {
		return nil, err
	}
	out.SetLabels(labels)
	out.SetAnnotations(annotations)
	return out, nil
}
