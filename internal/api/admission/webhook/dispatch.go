package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync"

	"github.com/orch-dev/orch/internal/api/admission"
	"github.com/orch-dev/orch/internal/api/resources"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
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

// target is a webhook a request applies to, and the equivalent version
// of the request's resource it is called for (nil: the request's own).
type target struct {
	h  *hook
	as *resources.Resource
}

// attributes are what t's webhook is sent: a, converted to the version
// its rules name when that is another.
func (t target) attributes(a *admission.Attributes) (*admission.Attributes, error) {
	if t.as == nil {
		return a, nil
	}
	at, err := a.As(t.as)
	if err != nil {
		return nil, &callError{t.h.Name, fmt.Errorf("converting the object to %s: %w", t.as.GroupVersion(), err)}
	}
	return at, nil
}

// relevant returns the webhooks of list that a applies to, in order: by
// their rules, or (matchPolicy Equivalent, the default) by their rules
// for another version of a's resource; then by their selectors.
func (d *Dispatcher) relevant(ctx context.Context, list *[]*hook, a *admission.Attributes) ([]target, error) {
	if list == nil || len(*list) == 0 || admission.Exempt(a) {
		return nil, nil
	}
	var out []target
	for _, h := range *list {
		t := target{h: h}
		if !rulesMatch(h.Rules, a) {
			if h.MatchPolicy != nil && *h.MatchPolicy == admissionregistrationv1.Exact {
				continue
			}
			if t.as = a.Equivalent(func(at *admission.Attributes) bool { return rulesMatch(h.Rules, at) }); t.as == nil {
				continue
			}
		}
		if h.broken != nil {
			out = append(out, t) // fails as its policy says when called
			continue
		}
		ok, err := d.selectorsMatch(ctx, h, a)
		if err != nil {
			return nil, apierrors.NewInternalError(err)
		}
		if ok {
			out = append(out, t)
		}
	}
	return out, nil
}

// invoke calls h unless its match conditions exclude the request, and
// turns what went wrong into the error the client gets; a webhook that
// fails open returns nil and no response.
func (d *Dispatcher) invoke(ctx context.Context, h *hook, a *admission.Attributes) (*admissionv1.AdmissionResponse, error) {
	resp, err := d.tryInvoke(ctx, h, a)
	if err != nil {
		return nil, d.failed(h, err)
	}
	return resp, nil
}

// failed is what the client gets when calling h failed with err: nothing
// when a call error and h fails open, Kubernetes' error naming h when it
// fails closed, other errors as they are.
func (d *Dispatcher) failed(h *hook, err error) error {
	var ce *callError
	if !errors.As(err, &ce) {
		return err
	}
	if h.failOpen() {
		d.log.Warn("admission webhook failed, failing open", "webhook", h.Name, "configuration", h.config, "err", ce.reason)
		return nil
	}
	d.log.Warn("admission webhook failed, failing closed", "webhook", h.Name, "configuration", h.config, "err", ce.reason)
	return ce.status()
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
	targets, err := d.relevant(ctx, d.mutating.Load(), a)
	if err != nil || len(targets) == 0 {
		return err
	}
	var reinvoke []target
	changedAfter := map[*hook]bool{}
	for _, t := range targets {
		changed, err := d.mutateAs(ctx, t, a)
		if err != nil {
			return err
		}
		if changed {
			for prev := range changedAfter {
				changedAfter[prev] = true
			}
		}
		if t.h.reinvoke {
			changedAfter[t.h] = false
			reinvoke = append(reinvoke, t)
		}
	}
	for _, t := range reinvoke {
		if !changedAfter[t.h] {
			continue
		}
		if _, err := d.mutateAs(ctx, t, a); err != nil {
			return err
		}
	}
	return nil
}

// mutateAs calls t's webhook with a in the version it is for, and what it
// changed is converted back into a.Object.
func (d *Dispatcher) mutateAs(ctx context.Context, t target, a *admission.Attributes) (bool, error) {
	at, err := t.attributes(a)
	if err != nil {
		return false, d.failed(t.h, err)
	}
	changed, err := d.mutateWith(ctx, t.h, at)
	if err != nil || !changed || at == a {
		return changed, err
	}
	back, err := a.Resource.FromStorage(at.Object)
	if err != nil {
		return false, d.failed(t.h, &callError{t.h.Name, fmt.Errorf("converting the mutated object back to %s: %w", a.Resource.GroupVersion(), err)})
	}
	a.Replace(back)
	return true, nil
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
	targets, err := d.relevant(ctx, d.validating.Load(), a)
	if err != nil || len(targets) == 0 {
		return err
	}
	validate := func(t target) error {
		at, err := t.attributes(a)
		if err != nil {
			return d.failed(t.h, err)
		}
		_, err = d.invoke(ctx, t.h, at)
		return err
	}
	if len(targets) == 1 {
		return validate(targets[0])
	}
	errs := make([]error, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = validate(t)
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
