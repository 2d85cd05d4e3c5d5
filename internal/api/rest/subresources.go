package rest

import (
	"context"
	"fmt"
	"net/http"

	"github.com/orch-dev/orch/internal/api/registry"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

var scaleGVK = autoscalingv1.SchemeGroupVersion.WithKind("Scale")

// scale serves the scale subresource of deployments and replicasets, which
// `kubectl scale` and autoscalers use.
func (q *request) scale() error {
	switch q.info.Verb {
	case "get":
		obj, err := q.st.Get(q.ctx(), q.namespace, q.info.Name)
		if err != nil {
			return err
		}
		s, err := scaleOf(obj)
		if err != nil {
			return err
		}
		return q.respondRaw(http.StatusOK, s)
	case "update", "patch":
	default:
		return apierrors.NewMethodNotSupported(q.st.Resource.GroupVersionResource().GroupResource(), q.info.Verb)
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
		if patchType != types.JSONPatchType && patchType != types.MergePatchType && patchType != types.StrategicMergePatchType {
			return unsupportedPatch(patchType, "")
		}
	}
	out, _, err := q.st.Update(q.ctx(), q.namespace, q.info.Name, func(ctx context.Context, current runtime.Object) (runtime.Object, error) {
		if current == nil {
			return nil, apierrors.NewNotFound(q.st.Resource.GroupVersionResource().GroupResource(), q.info.Name)
		}
		cur, err := scaleOf(current)
		if err != nil {
			return nil, err
		}
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
		switch o := obj.(type) {
		case *appsv1.Deployment:
			o.Spec.Replicas = &s.Spec.Replicas
		case *appsv1.ReplicaSet:
			o.Spec.Replicas = &s.Spec.Replicas
		}
		// The scale's resourceVersion is the parent's: a precondition if sent.
		o, _ := metaOf(obj)
		o.SetResourceVersion(s.ResourceVersion)
		return obj, nil
	}, registry.UpdateOptions{WriteOptions: registry.WriteOptions{DryRun: q.dryRun()}})
	if err != nil {
		return err
	}
	s, err := scaleOf(out)
	if err != nil {
		return err
	}
	return q.respondRaw(http.StatusOK, s)
}

func scaleOf(obj runtime.Object) (*autoscalingv1.Scale, error) {
	var (
		om       metav1.ObjectMeta
		replicas *int32
		current  int32
		sel      *metav1.LabelSelector
	)
	switch o := obj.(type) {
	case *appsv1.Deployment:
		om, replicas, current, sel = o.ObjectMeta, o.Spec.Replicas, o.Status.Replicas, o.Spec.Selector
	case *appsv1.ReplicaSet:
		om, replicas, current, sel = o.ObjectMeta, o.Spec.Replicas, o.Status.Replicas, o.Spec.Selector
	default:
		return nil, apierrors.NewInternalError(fmt.Errorf("%T has no scale", obj))
	}
	s := &autoscalingv1.Scale{
		TypeMeta: metav1.TypeMeta{Kind: "Scale", APIVersion: "autoscaling/v1"},
		ObjectMeta: metav1.ObjectMeta{Name: om.Name, Namespace: om.Namespace, UID: om.UID,
			ResourceVersion: om.ResourceVersion, CreationTimestamp: om.CreationTimestamp},
		Status: autoscalingv1.ScaleStatus{Replicas: current},
	}
	if replicas != nil {
		s.Spec.Replicas = *replicas
	}
	if sel != nil {
		if ls, err := metav1.LabelSelectorAsSelector(sel); err == nil {
			s.Status.Selector = ls.String()
		}
	}
	return s, nil
}

// bind assigns a pod to a node, as the scheduler does through pods/binding.
func (q *request) bind() error {
	obj, err := q.decodeBody(corev1.SchemeGroupVersion.WithKind("Binding"), &corev1.Binding{})
	if err != nil {
		return err
	}
	b := obj.(*corev1.Binding)
	if b.Namespace != "" && b.Namespace != q.namespace {
		return apierrors.NewBadRequest("the namespace of the provided object does not match the namespace sent on the request")
	}
	if b.Name != "" && b.Name != q.info.Name {
		return apierrors.NewBadRequest(fmt.Sprintf("the name of the object (%s) does not match the name on the URL (%s)", b.Name, q.info.Name))
	}
	if b.Target.Kind != "" && b.Target.Kind != "Node" {
		return apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Binding").GroupKind(), q.info.Name, field.ErrorList{
			field.NotSupported(field.NewPath("target", "kind"), b.Target.Kind, []string{"Node"})})
	}
	if b.Target.Name == "" {
		return apierrors.NewBadRequest("binding target.name (the node) is required")
	}
	gr := q.st.Resource.GroupVersionResource().GroupResource()
	_, _, err = q.st.Update(q.ctx(), q.namespace, q.info.Name, func(ctx context.Context, current runtime.Object) (runtime.Object, error) {
		if current == nil {
			return nil, apierrors.NewNotFound(gr, q.info.Name)
		}
		pod := current.(*corev1.Pod).DeepCopy()
		if pod.DeletionTimestamp != nil {
			return nil, apierrors.NewConflict(gr, q.info.Name, fmt.Errorf("pod %s is being deleted, cannot be assigned to a host", pod.Name))
		}
		if pod.Spec.NodeName != "" {
			return nil, apierrors.NewConflict(gr, q.info.Name, fmt.Errorf("pod %s is already assigned to node %q", pod.Name, pod.Spec.NodeName))
		}
		if b.UID != "" && b.UID != pod.UID {
			return nil, apierrors.NewConflict(gr, q.info.Name, fmt.Errorf("Precondition failed: UID in precondition: %v, UID in object meta: %v", b.UID, pod.UID)) //nolint:staticcheck // Kubernetes' own wording
		}
		pod.Spec.NodeName = b.Target.Name
		for k, v := range b.Annotations {
			if pod.Annotations == nil {
				pod.Annotations = map[string]string{}
			}
			pod.Annotations[k] = v
		}
		setPodScheduled(pod)
		pod.ResourceVersion = ""
		return pod, nil
	}, registry.UpdateOptions{WriteOptions: registry.WriteOptions{DryRun: q.dryRun()}, Subresource: "binding"})
	if err != nil {
		return err
	}
	return q.respondRaw(http.StatusCreated, &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status: metav1.StatusSuccess, Code: http.StatusCreated})
}

func setPodScheduled(pod *corev1.Pod) {
	now := metav1.Now()
	for i := range pod.Status.Conditions {
		if c := &pod.Status.Conditions[i]; c.Type == corev1.PodScheduled {
			if c.Status != corev1.ConditionTrue {
				c.LastTransitionTime = now
			}
			c.Status, c.Reason, c.Message = corev1.ConditionTrue, "", ""
			return
		}
	}
	pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now})
}

// finalize sets a namespace's spec.finalizers, the one change the
// namespace controller makes once the namespace is empty.
func (q *request) finalize() error {
	obj, err := q.decodeBody(corev1.SchemeGroupVersion.WithKind("Namespace"), &corev1.Namespace{})
	if err != nil {
		return err
	}
	want := obj.(*corev1.Namespace)
	out, _, err := q.st.Update(q.ctx(), "", q.info.Name, func(ctx context.Context, current runtime.Object) (runtime.Object, error) {
		if current == nil {
			return nil, apierrors.NewNotFound(q.st.Resource.GroupVersionResource().GroupResource(), q.info.Name)
		}
		ns := current.(*corev1.Namespace).DeepCopy()
		ns.Spec.Finalizers = want.Spec.Finalizers
		ns.ResourceVersion = want.ResourceVersion
		return ns, nil
	}, registry.UpdateOptions{WriteOptions: registry.WriteOptions{DryRun: q.dryRun()}, Subresource: "finalize"})
	if err != nil {
		return err
	}
	return q.respond(http.StatusOK, out)
}
