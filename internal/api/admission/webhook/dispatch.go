package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync"

	"github.com/orch-dev/orch/internal/api/admission"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// maxPatchOps bounds a webhook's patch: far more than any real mutation,
// far less than what could stall the server.
const maxPatchOps = 10000

func kindOf(a *admission.Attributes, obj runtime.Object) schema.GroupVersionKind {
	if obj != nil {
		if gvk := obj.GetObjectKind().GroupVersionKind(); gvk.Kind != "" {
			return gvk
		}
	}
	return a.Resource.GroupVersionKind
}

// relevant returns the webhooks of list that a applies to, each with
// whether it may be called, in order.
func (d *Dispatcher) relevant(ctx context.Context, list *[]*hook, a *admission.Attributes) ([]*hook, error) {
	if list == nil || len(*list) == 0 || admission.Exempt(a) {
		return nil, nil
	}
	var out []*hook
	for _, h := range *list {
		if !rulesMatch(h.Rules, a) {
			continue
		}
		if h.broken != nil {
			out = append(out, h) // fails as its policy says when called
			continue
		}
		ok, err := d.selectorsMatch(ctx, h, a)
		if err != nil {
			return nil, apierrors.NewInternalError(err)
		}
		if ok {
			out = append(out, h)
		}
	}
	return out, nil
}

// invoke calls h unless its match conditions exclude the request, and
// turns what went wrong into the error the client gets; a webhook that
// fails open returns nil and no response.
func (d *Dispatcher) invoke(ctx context.Context, h *hook, a *admission.Attributes) (*admissionv1.AdmissionResponse, error) {
	resp, err := d.tryInvoke(ctx, h, a)
	var ce *callError
	if errors.As(err, &ce) {
		if h.failOpen() {
			d.log.Warn("admission webhook failed, failing open", "webhook", h.Name, "configuration", h.config, "err", ce.reason)
			return nil, nil
		}
		d.log.Warn("admission webhook failed, failing closed", "webhook", h.Name, "configuration", h.config, "err", ce.reason)
		return nil, ce.status()
	}
	return resp, err
}

func (d *Dispatcher) tryInvoke(ctx context.Context, h *hook, a *admission.Attributes) (*admissionv1.AdmissionResponse, error) {
	if h.broken != nil {
		return nil, &callError{h.Name, h.broken}
	}
	if h.matcher != nil {
		ok, err := h.matcher.Match(ctx, a)
		if err != nil {
			return nil, &callError{h.Name, fmt.Errorf("evaluating matchConditions: %w", err)}
		}
		if !ok {
			return nil, nil
		}
	}
	if a.DryRun && !sideEffectsAllowDryRun(h) {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("admission webhook %q does not support dry run", h.Name))
	}
	resp, err := d.call(ctx, h, a)
	if err != nil {
		return nil, err
	}
	for k, v := range resp.AuditAnnotations {
		d.log.Info("admission webhook audit annotation", "key", h.Name+"/"+k, "value", v, "resource", a.Resource.Plural, "namespace", a.Namespace, "name", a.Name)
	}
	for _, w := range resp.Warnings {
		admission.Warn(ctx, w)
	}
	if !resp.Allowed {
		return nil, denied(h.Name, resp.Result)
	}
	return resp, nil
}

// denied is Kubernetes' error for a webhook's refusal: its status, at
// least a 400, its message prefixed with who denied.
func denied(name string, result *metav1.Status) error {
	s := metav1.Status{Status: metav1.StatusFailure}
	if result != nil {
		s = *result
	}
	if s.Code < 400 {
		s.Code = 400
	}
	if s.Status == "" || s.Status == metav1.StatusSuccess {
		s.Status = metav1.StatusFailure
	}
	by := fmt.Sprintf("admission webhook %q denied the request", name)
	switch {
	case s.Message != "":
		s.Message = by + ": " + s.Message
	case s.Reason != "":
		s.Message = by + ": " + string(s.Reason)
	default:
		s.Message = by + " without explanation"
	}
	return &apierrors.StatusError{ErrStatus: s}
}

// Mutate calls the mutating webhooks that apply to a, one after another,
// applying each one's patch to a.Object; webhooks asking to be reinvoked
// are called once more when a later one changed the object.
func (d *Dispatcher) Mutate(ctx context.Context, a *admission.Attributes) error {
	hooks, err := d.relevant(ctx, d.mutating.Load(), a)
	if err != nil || len(hooks) == 0 {
		return err
	}
	var reinvoke []*hook
	changedAfter := map[*hook]bool{}
	for _, h := range hooks {
		changed, err := d.mutateWith(ctx, h, a)
		if err != nil {
			return err
		}
		if changed {
			for prev := range changedAfter {
				changedAfter[prev] = true
			}
		}
		if h.reinvoke {
			changedAfter[h] = false
			reinvoke = append(reinvoke, h)
		}
	}
	for _, h := range reinvoke {
		if !changedAfter[h] {
			continue
		}
		if _, err := d.mutateWith(ctx, h, a); err != nil {
			return err
		}
	}
	return nil
}

// mutateWith calls one mutating webhook and applies its patch.
func (d *Dispatcher) mutateWith(ctx context.Context, h *hook, a *admission.Attributes) (bool, error) {
	resp, err := d.invoke(ctx, h, a)
	if err != nil || resp == nil || len(resp.Patch) == 0 {
		return false, err
	}
	if *resp.PatchType != admissionv1.PatchTypeJSONPatch {
		return false, apierrors.NewInternalError(&callError{h.Name, fmt.Errorf("unsupported patch type %q", *resp.PatchType)})
	}
	patch, err := jsonpatch.DecodePatch(resp.Patch)
	if err != nil {
		return false, d.failPatch(h, fmt.Errorf("received undecodable patch in webhook response: %w", err))
	}
	if len(patch) == 0 {
		return false, nil
	}
	if len(patch) > maxPatchOps {
		return false, d.failPatch(h, fmt.Errorf("received a patch of %d operations, more than %d", len(patch), maxPatchOps))
	}
	if a.Object == nil {
		return false, apierrors.NewInternalError(fmt.Errorf("admission webhook %q attempted to modify the object, which is not supported for this operation", h.Name))
	}
	raw, err := encodeObject(a, a.Object)
	if err != nil {
		return false, apierrors.NewInternalError(err)
	}
	patched, err := patch.Apply(raw.Raw)
	if err != nil {
		return false, apierrors.NewInternalError(fmt.Errorf("admission webhook %q: applying its patch: %w", h.Name, err))
	}
	fresh, err := decodeLike(a, patched)
	if err != nil {
		return false, apierrors.NewInternalError(fmt.Errorf("admission webhook %q: the patched object does not decode: %w", h.Name, err))
	}
	// What a patch adds takes its defaults, and a custom resource's
	// schema prunes what it does not know, as after decoding a request.
	if a.OwnKind() {
		if a.Resource.Normalize != nil {
			a.Resource.Normalize(fresh)
		}
		if a.Resource.Default != nil {
			a.Resource.Default(fresh)
		}
	}
	changed := !apiequality.Semantic.DeepEqual(a.Object, fresh)
	if changed {
		a.Replace(fresh)
	}
	return changed, nil
}

func (d *Dispatcher) failPatch(h *hook, err error) error {
	ce := &callError{h.Name, err}
	if h.failOpen() {
		d.log.Warn("admission webhook failed, failing open", "webhook", h.Name, "err", err)
		return nil
	}
	return ce.status()
}

// decodeLike decodes data into a new object of a.Object's type.
func decodeLike(a *admission.Attributes, data []byte) (runtime.Object, error) {
	if _, ok := a.Object.(*unstructured.Unstructured); ok {
		u := &unstructured.Unstructured{}
		return u, u.UnmarshalJSON(data)
	}
	fresh := reflect.New(reflect.TypeOf(a.Object).Elem()).Interface().(runtime.Object)
	return fresh, json.Unmarshal(data, fresh)
}

// Validate calls the validating webhooks that apply to a, all at once;
// the first refusal in their order is the answer.
func (d *Dispatcher) Validate(ctx context.Context, a *admission.Attributes) error {
	hooks, err := d.relevant(ctx, d.validating.Load(), a)
	if err != nil || len(hooks) == 0 {
		return err
	}
	if len(hooks) == 1 {
		_, err := d.invoke(ctx, hooks[0], a)
		return err
	}
	errs := make([]error, len(hooks))
	var wg sync.WaitGroup
	for i, h := range hooks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = d.invoke(ctx, h, a)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
