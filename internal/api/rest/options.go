package rest

import (
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metainternalvalidation "k8s.io/apimachinery/pkg/apis/meta/internalversion/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// checkOptions validates a request's query options before anything is
// read or written, as Kubernetes' handlers do: a parameter that does not
// parse is 400; options that do not make sense (a dryRun other than All,
// an unknown fieldValidation, resourceVersionMatch without a
// resourceVersion) are 422 naming the options' kind and field. A dry run
// that is refused has written nothing.
func (q *request) checkOptions() error {
	query := q.r.URL.Query()
	decode := func(into runtime.Object) error {
		if err := q.h.params.DecodeParameters(query, metav1.SchemeGroupVersion, into); err != nil {
			return apierrors.NewBadRequest(err.Error())
		}
		return nil
	}
	switch q.info.Verb {
	case "create":
		var o metav1.CreateOptions
		if err := decode(&o); err != nil {
			return err
		}
		return invalidOptions("CreateOptions", metav1validation.ValidateCreateOptions(&o))
	case "update":
		var o metav1.UpdateOptions
		if err := decode(&o); err != nil {
			return err
		}
		return invalidOptions("UpdateOptions", metav1validation.ValidateUpdateOptions(&o))
	case "patch":
		var o metav1.PatchOptions
		if err := decode(&o); err != nil {
			return err
		}
		contentType, _, _ := strings.Cut(q.r.Header.Get("Content-Type"), ";")
		patchType := types.PatchType(strings.TrimSpace(contentType))
		if patchType == types.ApplyCBORPatchType {
			return nil // refused as unsupported, whatever its options
		}
		return invalidOptions("PatchOptions", metav1validation.ValidatePatchOptions(&o, patchType))
	case "list", "watch":
		var o metav1.ListOptions
		if err := decode(&o); err != nil {
			return err
		}
		var internal metainternalversion.ListOptions
		if err := metainternalversion.Convert_v1_ListOptions_To_internalversion_ListOptions(&o, &internal, nil); err != nil {
			return apierrors.NewBadRequest(err.Error())
		}
		if q.info.Verb == "watch" {
			internal.Watch = true
		}
		// orch serves watch lists (sendInitialEvents), as Kubernetes does
		// with its WatchList feature on.
		return invalidOptions("ListOptions", metainternalvalidation.ValidateListOptions(&internal, true))
	}
	return nil
}

func invalidOptions(kind string, errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	return apierrors.NewInvalid(schema.GroupKind{Group: metav1.GroupName, Kind: kind}, "", errs)
}
