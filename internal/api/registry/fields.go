package registry

import (
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// copyField returns dst with the field at path replaced by src's: how a
// status update keeps the stored spec, a spec update the stored status,
// and an update of a pod's ephemeral containers everything else. Both
// objects are of the same type.
func copyField(dst, src runtime.Object, path ...string) (runtime.Object, error) {
	d, err := runtime.DefaultUnstructuredConverter.ToUnstructured(dst)
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	sm, err := runtime.DefaultUnstructuredConverter.ToUnstructured(src)
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	if v, ok, _ := unstructured.NestedFieldNoCopy(sm, path...); ok {
		if err := unstructured.SetNestedField(d, v, path...); err != nil {
			return nil, apierrors.NewInternalError(err)
		}
	} else {
		unstructured.RemoveNestedField(d, path...)
	}
	out := dst.DeepCopyObject()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(d, out); err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	return out, nil
}

// fieldChanged reports whether the top-level field name differs.
func fieldChanged(a, b runtime.Object, name string) (bool, error) {
	am, err := runtime.DefaultUnstructuredConverter.ToUnstructured(a)
	if err != nil {
		return false, apierrors.NewInternalError(err)
	}
	bm, err := runtime.DefaultUnstructuredConverter.ToUnstructured(b)
	if err != nil {
		return false, apierrors.NewInternalError(err)
	}
	return !apiequality.Semantic.DeepEqual(am[name], bm[name]), nil
}
