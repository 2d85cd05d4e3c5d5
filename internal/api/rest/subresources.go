package rest

import (
	"context"
	"fmt"
	"github.com/orch-dev/orch/internal/api/admission"
	"net/http"
	"slices"

	"github.com/orch-dev/orch/internal/api/registry"
	"github.com/orch-dev/orch/internal/api/resources"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

var scaleGVK = autoscalingv1.SchemeGroupVersion.WithKind("Scale")

// scale serves the scale subresource (deployments, replicasets), which
// `kubectl scale` and autoscalers use.
func (q *request) scale(access *resources.ScaleAccess) error {
	switch q.info.Verb {
	case "get":
		obj, err := q.st.Get(q.ctx(), q.namespace, q.info.Name)
		if err != nil {
			return err
		}
		return q.respondRaw(http.StatusOK, scaleOf(access, obj))
	case "update", "patch":
	default:
		return apierrors.NewMethodNotSupported(q.st.Resource.GroupResource(), q.info.Verb)
	}
	var body []byte
	var put runtime.Object
	var err error
	if q.info.Verb == "update" {
		if put, err = q.decodeBody(scaleGVK, &autoscalingv1.Scale{}); err != nil {
			return err
		}
	} else if body, err = q.readBody(); err != nil {
		return err
	}
	var patchType types.PatchType
	if q.info.Verb == "patch" {
		ct := q.r.Header.Get("Content-Type")
		patchType = types.PatchType(ct)
		switch patchType {
		case types.JSONPatchType, types.MergePatchType, types.StrategicMergePatchType:
		case types.ApplyYAMLPatchType:
			return unsupportedPatch(patchType, "server-side apply is served on the resource and its status, not on scale")
		default:
			return unsupportedPatch(patchType, "")
		}
	}
	out, _, err := q.st.Update(q.ctx(), q.namespace, q.info.Name, func(ctx context.Context, current runtime.Object) (runtime.Object, error) {
		if current == nil {
			return nil, apierrors.NewNotFound(q.st.Resource.GroupResource(), q.info.Name)
		}
		cur := scaleOf(access, current)
		want := put
		if want == nil {
			if want, err = q.applyPatch(patchType, body, cur, scaleGVK, func() runtime.Object { return &autoscalingv1.Scale{} }); err != nil {
				return nil, err
			}
		}
		s := want.(*autoscalingv1.Scale)
		if s.Spec.Replicas < 0 {
			return nil, apierrors.NewInvalid(scaleGVK.GroupKind(), q.info.Name, field.ErrorList{
				field.Invalid(field.NewPath("spec", "replicas"), s.Spec.Replicas, "must be greater than or equal to 0")})
		}
		obj := current.DeepCopyObject()
		access.Set(obj, s.Spec.Replicas)
		// The scale's resourceVersion is the parent's: a precondition if sent.
		o, _ := metaOf(obj)
		o.SetResourceVersion(s.ResourceVersion)
		return obj, nil
	}, registry.UpdateOptions{WriteOptions: q.writeOptions(), Subresource: "scale"})
	if err != nil {
		return err
	}
	return q.respondRaw(http.StatusOK, scaleOf(access, out))
}

func scaleOf(access *resources.ScaleAccess, obj runtime.Object) *autoscalingv1.Scale {
	desired, current, sel := access.Get(obj)
	om, _ := metaOf(obj)
	s := &autoscalingv1.Scale{
		TypeMeta: metav1.TypeMeta{Kind: "Scale", APIVersion: "autoscaling/v1"},
		ObjectMeta: metav1.ObjectMeta{Name: om.GetName(), Namespace: om.GetNamespace(), UID: om.GetUID(),
			ResourceVersion: om.GetResourceVersion(), CreationTimestamp: om.GetCreationTimestamp()},
		Status: autoscalingv1.ScaleStatus{Replicas: current},
	}
	if desired != nil {
		s.Spec.Replicas = *desired
	}
	if sel != nil {
		if ls, err := metav1.LabelSelectorAsSelector(sel); err == nil {
			s.Status.Selector = ls.String()
		}
	}
	return s
}

// action serves a subresource that takes a body and changes the object
// with it (pods/binding, namespaces/finalize).
func (q *request) action(sub *resources.Subresource) error {
	if !slices.Contains(sub.Verbs, q.info.Verb) {
		return apierrors.NewMethodNotSupported(schema.GroupResource{Group: q.st.Resource.Group, Resource: q.st.Resource.Plural + "/" + sub.Name}, q.info.Verb)
	}
	body, err := q.subresourceBody(sub)
	if err != nil {
		return err
	}
	out, _, err := q.st.Update(q.ctx(), q.namespace, q.info.Name, func(ctx context.Context, current runtime.Object) (runtime.Object, error) {
		if current == nil {
			return nil, apierrors.NewNotFound(q.st.Resource.GroupResource(), q.info.Name)
		}
		return sub.Apply(body, current)
	}, registry.UpdateOptions{WriteOptions: q.writeOptions(), Subresource: sub.Name})
	if err != nil {
		return err
	}
	if sub.Created {
		return q.respondRaw(http.StatusCreated, &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
			Status: metav1.StatusSuccess, Code: http.StatusCreated})
	}
	return q.respond(http.StatusOK, out)
}

// subresourceBody decodes the body of an action or an answer, which may
// name the object but not another one.
func (q *request) subresourceBody(sub *resources.Subresource) (runtime.Object, error) {
	bodyKind := sub.Kind
	if bodyKind.Empty() {
		bodyKind = q.st.Resource.GroupVersionKind
	}
	body, err := q.decodeBody(bodyKind, sub.NewBody())
	if err != nil {
		return nil, err
	}
	if m, err := metaOf(body); err == nil {
		if ns := m.GetNamespace(); ns != "" && ns != q.namespace {
			return nil, apierrors.NewBadRequest("the namespace of the provided object does not match the namespace sent on the request")
		}
		if name := m.GetName(); name != "" && name != q.info.Name {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("the name of the object (%s) does not match the name on the URL (%s)", name, q.info.Name))
		}
	}
	return body, nil
}

// answer serves a subresource that answers a body about the object
// without changing it (serviceaccounts/token): 201 with the answer.
func (q *request) answer(sub *resources.Subresource) error {
	if !slices.Contains(sub.Verbs, q.info.Verb) {
		return apierrors.NewMethodNotSupported(schema.GroupResource{Group: q.st.Resource.Group, Resource: q.st.Resource.Plural + "/" + sub.Name}, q.info.Verb)
	}
	body, err := q.subresourceBody(sub)
	if err != nil {
		return err
	}
	current, err := q.st.Get(q.ctx(), q.namespace, q.info.Name)
	if err != nil {
		return err
	}
	// The cluster's admission sees the body as a create of the
	// subresource (webhooks on pods/eviction, serviceaccounts/token), as
	// Kubernetes sends it.
	if ext := q.st.External; ext != nil && ext.Active() {
		if !sub.Kind.Empty() {
			body.GetObjectKind().SetGroupVersionKind(sub.Kind)
		}
		a := &admission.Attributes{Resource: q.st.Resource, Operation: admission.Create, Subresource: sub.Name, Namespace: q.namespace, Name: q.info.Name,
			Object: body, Options: &metav1.CreateOptions{TypeMeta: metav1.TypeMeta{APIVersion: "meta.k8s.io/v1", Kind: "CreateOptions"}, DryRun: q.r.URL.Query()["dryRun"]},
			DryRun: q.dryRun()}
		if err := ext.Mutate(q.ctx(), a); err != nil {
			return err
		}
		if err := ext.Validate(q.ctx(), a); err != nil {
			return err
		}
	}
	out, err := sub.Answer(q.ctx(), body, current, resources.AnswerOptions{DryRun: q.dryRun()})
	if err != nil {
		return err
	}
	code := http.StatusCreated
	if st, ok := out.(*metav1.Status); ok && st.Code != 0 {
		code = int(st.Code)
	}
	return q.respondRaw(code, out)
}
