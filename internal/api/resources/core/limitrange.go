package core

import (
	"fmt"
	"strings"

	"github.com/orch-dev/orch/internal/api/resources"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

func limitRanges() *resources.Resource {
	return resources.Described[corev1.LimitRange, corev1.LimitRangeList](&resources.Resource{
		GroupVersionKind: resources.GVK("", "LimitRange"), Plural: "limitranges", Singular: "limitrange", Namespaced: true,
		ShortNames: []string{"limits"}, StorageKey: "limitranges", HasSpec: true,
		Default: resources.Typed(defaultLimitRange), Validate: resources.TypedValidate(validateLimitRange),
	})
}

// defaultLimitRange is Kubernetes' defaulting of a container item: a
// max is also the default limit, and the default limit (else the min)
// the default request.
func defaultLimitRange(lr *corev1.LimitRange) {
	for i := range lr.Spec.Limits {
		item := &lr.Spec.Limits[i]
		if item.Type != corev1.LimitTypeContainer {
			continue
		}
		fillMissing(&item.Default, item.Max)
		fillMissing(&item.DefaultRequest, item.Default)
		fillMissing(&item.DefaultRequest, item.Min)
	}
}

// fillMissing copies into *to what from has and it does not.
func fillMissing(to *corev1.ResourceList, from corev1.ResourceList) {
	for name, q := range from {
		if _, ok := (*to)[name]; ok {
			continue
		}
		if *to == nil {
			*to = corev1.ResourceList{}
		}
		(*to)[name] = q.DeepCopy()
	}
}

// validateLimitRange checks a LimitRange as Kubernetes does: known item
// types, qualified resource names, non-negative quantities, min ≤
// default request ≤ default ≤ max, a ratio of at least 1 that min and
// max allow, no defaults for the Pod type, and storage bounds for
// claims.
func validateLimitRange(lr *corev1.LimitRange) field.ErrorList {
	var errs field.ErrorList
	limits := field.NewPath("spec", "limits")
	for i, item := range lr.Spec.Limits {
		p := limits.Index(i)
		switch item.Type {
		case corev1.LimitTypePod, corev1.LimitTypeContainer, corev1.LimitTypePersistentVolumeClaim:
		case "":
			errs = append(errs, field.Required(p.Child("type"), ""))
		default:
			if msgs := validation.IsQualifiedName(string(item.Type)); len(msgs) > 0 {
				errs = append(errs, field.Invalid(p.Child("type"), item.Type, strings.Join(msgs, "; ")))
			}
		}
		lists := []struct {
			name string
			list corev1.ResourceList
		}{{"max", item.Max}, {"min", item.Min}, {"default", item.Default}, {"defaultRequest", item.DefaultRequest}, {"maxLimitRequestRatio", item.MaxLimitRequestRatio}}
		for _, l := range lists {
			for name, q := range l.list {
				kp := p.Child(l.name).Key(string(name))
				if msgs := validation.IsQualifiedName(string(name)); len(msgs) > 0 {
					errs = append(errs, field.Invalid(kp, name, strings.Join(msgs, "; ")))
				}
				if q.Sign() < 0 {
					errs = append(errs, field.Invalid(kp, q.String(), "must be greater than or equal to 0"))
				}
			}
		}
		if item.Type == corev1.LimitTypePod {
			if len(item.Default) > 0 {
				errs = append(errs, field.Forbidden(p.Child("default"), "may not be specified when `type` is 'Pod'"))
			}
			if len(item.DefaultRequest) > 0 {
				errs = append(errs, field.Forbidden(p.Child("defaultRequest"), "may not be specified when `type` is 'Pod'"))
			}
		}
		if item.Type == corev1.LimitTypePersistentVolumeClaim {
			_, hasMin := item.Min[corev1.ResourceStorage]
			_, hasMax := item.Max[corev1.ResourceStorage]
			if !hasMin && !hasMax {
				errs = append(errs, field.Required(p.Child("limits"), "either minimum or maximum storage value is required, but neither was provided"))
			}
		}
		names := map[corev1.ResourceName]bool{}
		for _, l := range lists {
			for name := range l.list {
				names[name] = true
			}
		}
		for name := range names {
			errs = append(errs, validateLimitBounds(p, name, item)...)
		}
	}
	return errs
}

// validateLimitBounds checks one resource's quantities in an item
// against each other, with Kubernetes' messages.
func validateLimitBounds(p *field.Path, name corev1.ResourceName, item corev1.LimitRangeItem) field.ErrorList {
	var errs field.ErrorList
	key := string(name)
	min, hasMin := item.Min[name]
	max, hasMax := item.Max[name]
	def, hasDef := item.Default[name]
	req, hasReq := item.DefaultRequest[name]
	ratio, hasRatio := item.MaxLimitRequestRatio[name]
	if hasMin && hasMax && min.Cmp(max) > 0 {
		errs = append(errs, field.Invalid(p.Child("min").Key(key), min.String(), fmt.Sprintf("min value %s is greater than max value %s", min.String(), max.String())))
	}
	if hasReq && hasMin && min.Cmp(req) > 0 {
		errs = append(errs, field.Invalid(p.Child("defaultRequest").Key(key), req.String(), fmt.Sprintf("min value %s is greater than default request value %s", min.String(), req.String())))
	}
	if hasReq && hasMax && req.Cmp(max) > 0 {
		errs = append(errs, field.Invalid(p.Child("defaultRequest").Key(key), req.String(), fmt.Sprintf("default request value %s is greater than max value %s", req.String(), max.String())))
	}
	if hasReq && hasDef && req.Cmp(def) > 0 {
		errs = append(errs, field.Invalid(p.Child("defaultRequest").Key(key), req.String(), fmt.Sprintf("default request value %s is greater than default limit value %s", req.String(), def.String())))
	}
	if hasDef && hasMin && min.Cmp(def) > 0 {
		errs = append(errs, field.Invalid(p.Child("default").Key(key), min.String(), fmt.Sprintf("min value %s is greater than default value %s", min.String(), def.String())))
	}
	if hasDef && hasMax && def.Cmp(max) > 0 {
		errs = append(errs, field.Invalid(p.Child("default").Key(key), max.String(), fmt.Sprintf("default value %s is greater than max value %s", def.String(), max.String())))
	}
	if hasRatio {
		one := resource.MustParse("1")
		if ratio.Cmp(one) < 0 {
			errs = append(errs, field.Invalid(p.Child("maxLimitRequestRatio").Key(key), ratio.String(), fmt.Sprintf("ratio %s is less than 1", ratio.String())))
		}
		if hasMin && hasMax && min.MilliValue() > 0 {
			maxRatio := float64(max.MilliValue()) / float64(min.MilliValue())
			if ratio.AsApproximateFloat64() > maxRatio {
				errs = append(errs, field.Invalid(p.Child("maxLimitRequestRatio").Key(key), ratio.String(), fmt.Sprintf("ratio %s is greater than max/min = %f", ratio.String(), maxRatio)))
			}
		}
	}
	return errs
}
