package plugins

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	resourcehelper "k8s.io/component-helpers/resource"
)

// limitRangerAnnotation records the defaults LimitRanger set on a pod.
const limitRangerAnnotation = "kubernetes.io/limit-ranger"

// admitLimitRanges is Kubernetes' LimitRanger admission for new pods: the
// namespace's LimitRanges give containers that set none their default
// requests and limits (noted in the kubernetes.io/limit-ranger
// annotation), then each container, and the pod as a whole, must keep
// within min, max and maxLimitRequestRatio.
func (p *Plugins) admitLimitRanges(ctx context.Context, obj, old runtime.Object) error {
	pod := obj.(*corev1.Pod)
	if old != nil {
		return nil
	}
	list, err := p.storage("", "limitranges").List(ctx, pod.Namespace, &metav1.ListOptions{})
	if err != nil {
		return err
	}
	ranges := list.(*corev1.LimitRangeList).Items
	if len(ranges) == 0 {
		return nil
	}
	var errs []error
	for i := range ranges {
		setDefaultResources(pod, &ranges[i])
		errs = append(errs, checkLimits(pod, &ranges[i])...)
	}
	if len(errs) > 0 {
		return apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, pod.Name, utilerrors.NewAggregate(errs))
	}
	return nil
}

// setDefaultResources gives each container the Container items' default
// requests and limits it does not set itself.
func setDefaultResources(pod *corev1.Pod, lr *corev1.LimitRange) {
	var requests, limits corev1.ResourceList
	for _, item := range lr.Spec.Limits {
		if item.Type == corev1.LimitTypeContainer {
			requests, limits = item.DefaultRequest, item.Default
			break
		}
	}
	if len(requests) == 0 && len(limits) == 0 {
		return
	}
	var notes []string
	apply := func(c *corev1.Container) {
		set := func(have *corev1.ResourceList, defaults corev1.ResourceList) []string {
			var names []string
			for name, q := range defaults {
				if _, ok := (*have)[name]; ok {
					continue
				}
				if *have == nil {
					*have = corev1.ResourceList{}
				}
				(*have)[name] = q.DeepCopy()
				names = append(names, string(name))
			}
			slices.Sort(names)
			return names
		}
		if names := set(&c.Resources.Requests, requests); len(names) > 0 {
			notes = append(notes, fmt.Sprintf("%s request for container %s", strings.Join(names, ", "), c.Name))
		}
		if names := set(&c.Resources.Limits, limits); len(names) > 0 {
			notes = append(notes, fmt.Sprintf("%s limit for container %s", strings.Join(names, ", "), c.Name))
		}
	}
	for i := range pod.Spec.InitContainers {
		apply(&pod.Spec.InitContainers[i])
	}
	for i := range pod.Spec.Containers {
		apply(&pod.Spec.Containers[i])
	}
	if len(notes) > 0 {
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		pod.Annotations[limitRangerAnnotation] = "LimitRanger plugin set: " + strings.Join(notes, "; ")
	}
}

// checkLimits holds each container (Container items) and the pod's total
// (Pod items) to a LimitRange's bounds, with Kubernetes' messages.
func checkLimits(pod *corev1.Pod, lr *corev1.LimitRange) []error {
	var errs []error
	check := func(kind string, item corev1.LimitRangeItem, requests, limits corev1.ResourceList) {
		for _, name := range sortedNames(item.Min) {
			if err := minConstraint(kind, name, item.Min[name], requests, limits); err != nil {
				errs = append(errs, err)
			}
		}
		for _, name := range sortedNames(item.Max) {
			if err := maxConstraint(kind, name, item.Max[name], requests, limits); err != nil {
				errs = append(errs, err)
			}
		}
		for _, name := range sortedNames(item.MaxLimitRequestRatio) {
			if err := ratioConstraint(kind, name, item.MaxLimitRequestRatio[name], requests, limits); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, item := range lr.Spec.Limits {
		switch item.Type {
		case corev1.LimitTypeContainer:
			for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
				check(string(item.Type), item, c.Resources.Requests, c.Resources.Limits)
			}
		case corev1.LimitTypePod:
			opts := resourcehelper.PodResourcesOptions{}
			check(string(item.Type), item, resourcehelper.PodRequests(pod, opts), resourcehelper.PodLimits(pod, opts))
		}
	}
	return errs
}

func sortedNames(l corev1.ResourceList) []corev1.ResourceName {
	names := make([]corev1.ResourceName, 0, len(l))
	for n := range l {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func minConstraint(kind string, name corev1.ResourceName, min resource.Quantity, requests, limits corev1.ResourceList) error {
	req, hasReq := requests[name]
	lim, hasLim := limits[name]
	switch {
	case !hasReq:
		return fmt.Errorf("minimum %s usage per %s is %s.  No request is specified", name, kind, min.String())
	case req.Cmp(min) < 0:
		return fmt.Errorf("minimum %s usage per %s is %s, but request is %s", name, kind, min.String(), req.String())
	case hasLim && lim.Cmp(min) < 0:
		return fmt.Errorf("minimum %s usage per %s is %s, but limit is %s", name, kind, min.String(), lim.String())
	}
	return nil
}

func maxConstraint(kind string, name corev1.ResourceName, max resource.Quantity, requests, limits corev1.ResourceList) error {
	req, hasReq := requests[name]
	lim, hasLim := limits[name]
	switch {
	case !hasLim:
		return fmt.Errorf("maximum %s usage per %s is %s.  No limit is specified", name, kind, max.String())
	case lim.Cmp(max) > 0:
		return fmt.Errorf("maximum %s usage per %s is %s, but limit is %s", name, kind, max.String(), lim.String())
	case hasReq && req.Cmp(max) > 0:
		return fmt.Errorf("maximum %s usage per %s is %s, but request is %s", name, kind, max.String(), req.String())
	}
	return nil
}

func ratioConstraint(kind string, name corev1.ResourceName, ratio resource.Quantity, requests, limits corev1.ResourceList) error {
	req, hasReq := requests[name]
	lim, hasLim := limits[name]
	if !hasReq || req.IsZero() {
		return fmt.Errorf("%s max limit to request ratio per %s is %s, but no request is specified or request is 0", name, kind, ratio.String())
	}
	if !hasLim || lim.IsZero() {
		return fmt.Errorf("%s max limit to request ratio per %s is %s, but no limit is specified or limit is 0", name, kind, ratio.String())
	}
	observed := float64(lim.MilliValue()) / float64(req.MilliValue())
	if observed > ratio.AsApproximateFloat64() {
		return fmt.Errorf("%s max limit to request ratio per %s is %s, but provided ratio is %f", name, kind, ratio.String(), observed)
	}
	return nil
}

// admitClaimLimitRanges holds a new claim to the PersistentVolumeClaim
// items of its namespace's LimitRanges: storage asked within min and max,
// with Kubernetes' messages (max bounds the request, as there).
func (p *Plugins) admitClaimLimitRanges(ctx context.Context, obj, old runtime.Object) error {
	pvc := obj.(*corev1.PersistentVolumeClaim)
	if old != nil {
		return nil
	}
	list, err := p.storage("", "limitranges").List(ctx, pvc.Namespace, &metav1.ListOptions{})
	if err != nil {
		return err
	}
	var errs []error
	kind := string(corev1.LimitTypePersistentVolumeClaim)
	requests, limits := pvc.Spec.Resources.Requests, pvc.Spec.Resources.Limits
	for _, lr := range list.(*corev1.LimitRangeList).Items {
		for _, item := range lr.Spec.Limits {
			if item.Type != corev1.LimitTypePersistentVolumeClaim {
				continue
			}
			for _, name := range sortedNames(item.Min) {
				if err := minConstraint(kind, name, item.Min[name], requests, limits); err != nil {
					errs = append(errs, err)
				}
			}
			for _, name := range sortedNames(item.Max) {
				max := item.Max[name]
				if req, ok := requests[name]; !ok {
					errs = append(errs, fmt.Errorf("maximum %s usage per %s is %s.  No request is specified", name, kind, max.String()))
				} else if req.Cmp(max) > 0 {
					errs = append(errs, fmt.Errorf("maximum %s usage per %s is %s, but request is %s", name, kind, max.String(), req.String()))
				}
			}
		}
	}
	if len(errs) > 0 {
		return apierrors.NewForbidden(schema.GroupResource{Resource: "persistentvolumeclaims"}, pvc.Name, utilerrors.NewAggregate(errs))
	}
	return nil
}
