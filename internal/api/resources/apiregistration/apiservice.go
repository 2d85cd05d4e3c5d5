// Package apiregistration describes the kinds of the
// apiregistration.k8s.io API group: the APIServices that say which
// group/versions orch serves itself and which a Service in the cluster
// serves behind it (API aggregation).
package apiregistration

import (
	"fmt"
	"strings"

	"github.com/orch-dev/orch/internal/api/resources"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"
)

// Resources describes the apiregistration.k8s.io group's kinds.
func Resources() []*resources.Resource { return []*resources.Resource{apiServices()} }

// Group is the group's name.
const Group = "apiregistration.k8s.io"

func apiServices() *resources.Resource {
	return resources.Described[apiregistrationv1.APIService, apiregistrationv1.APIServiceList](&resources.Resource{
		GroupVersionKind: resources.GVK(Group, "APIService"), Plural: "apiservices", Singular: "apiservice",
		Categories: []string{"api-extensions"}, StorageKey: "apiregistration.k8s.io/apiservices",
		Subresources:   []resources.Subresource{resources.Status()},
		StatusMetadata: resources.StatusMetadataAll,
		NameRule:       resources.PathSegmentName,
		Default: resources.Typed(func(s *apiregistrationv1.APIService) {
			if s.Spec.Service != nil && s.Spec.Service.Port == nil {
				s.Spec.Service.Port = ptr.To[int32](443)
			}
		}),
		Validate: resources.TypedValidate(validateAPIService),
		ValidateUpdate: resources.TypedValidateUpdate(func(s, _ *apiregistrationv1.APIService) field.ErrorList {
			return validateStatus(s)
		}),
		Columns: []metav1.TableColumnDefinition{resources.NameCol,
			resources.Col("Service", "string", 0, "The Service that serves the group/version, or Local when the API server does."),
			resources.Col("Available", "string", 0, "Whether the group/version is served now, and why not."),
			resources.AgeCol},
		Row: resources.TypedRow(func(s *apiregistrationv1.APIService) []any {
			service := "Local"
			if ref := s.Spec.Service; ref != nil {
				service = ref.Namespace + "/" + ref.Name
			}
			return []any{s.Name, service, Availability(s), resources.Age(s.CreationTimestamp)}
		}),
	})
}

// Availability is what `kubectl get apiservices` shows: True, or False
// (Reason), or Unknown.
func Availability(s *apiregistrationv1.APIService) string {
	for _, c := range s.Status.Conditions {
		if c.Type != apiregistrationv1.Available {
			continue
		}
		if c.Status == apiregistrationv1.ConditionTrue || c.Reason == "" {
			return string(c.Status)
		}
		return fmt.Sprintf("%s (%s)", c.Status, c.Reason)
	}
	return "Unknown"
}

// validateAPIService is kube-aggregator's validation: named
// <version>.<group>, a group that is a DNS subdomain (empty only for the
// legacy v1), a version that is a DNS label, priorities in range, and a
// Service reference with its port, or none (local) without TLS settings.
func validateAPIService(s *apiregistrationv1.APIService) field.ErrorList {
	var errs field.ErrorList
	spec := field.NewPath("spec")
	if want := s.Spec.Version + "." + s.Spec.Group; s.Name != want && s.Name != "" {
		errs = append(errs, field.Invalid(field.NewPath("metadata", "name"), s.Name, fmt.Sprintf("must be `spec.version+\".\"+spec.group`: %q", want)))
	}
	if s.Spec.Group == "" && s.Spec.Version != "v1" {
		errs = append(errs, field.Required(spec.Child("group"), "only v1 may have an empty group and it better be legacy kube"))
	}
	if s.Spec.Group != "" {
		for _, msg := range validation.IsDNS1123Subdomain(s.Spec.Group) {
			errs = append(errs, field.Invalid(spec.Child("group"), s.Spec.Group, msg))
		}
	}
	for _, msg := range validation.IsDNS1035Label(s.Spec.Version) {
		errs = append(errs, field.Invalid(spec.Child("version"), s.Spec.Version, msg))
	}
	if p := s.Spec.GroupPriorityMinimum; p <= 0 || p > 20000 {
		errs = append(errs, field.Invalid(spec.Child("groupPriorityMinimum"), p, "must be positive and less than 20000"))
	}
	if p := s.Spec.VersionPriority; p <= 0 || p > 1000 {
		errs = append(errs, field.Invalid(spec.Child("versionPriority"), p, "must be positive and less than 1000"))
	}
	errs = append(errs, validateStatus(s)...)
	ref := s.Spec.Service
	if ref == nil {
		if len(s.Spec.CABundle) > 0 {
			errs = append(errs, field.Invalid(spec.Child("caBundle"), fmt.Sprintf("%d bytes", len(s.Spec.CABundle)), "local APIServices may not have a caBundle"))
		}
		if s.Spec.InsecureSkipTLSVerify {
			errs = append(errs, field.Invalid(spec.Child("insecureSkipTLSVerify"), true, "local APIServices may not have insecureSkipTLSVerify"))
		}
		return errs
	}
	if ref.Namespace == "" {
		errs = append(errs, field.Required(spec.Child("service", "namespace"), ""))
	}
	if ref.Name == "" {
		errs = append(errs, field.Required(spec.Child("service", "name"), ""))
	}
	if port := ptr.Deref(ref.Port, 443); port < 1 || port > 65535 {
		errs = append(errs, field.Invalid(spec.Child("service", "port"), port, "port is not valid: "+strings.Join(validation.IsValidPortNum(int(port)), ", ")))
	}
	if s.Spec.InsecureSkipTLSVerify && len(s.Spec.CABundle) > 0 {
		errs = append(errs, field.Invalid(spec.Child("insecureSkipTLSVerify"), true, "may not be true if caBundle is present"))
	}
	return errs
}

func validateStatus(s *apiregistrationv1.APIService) field.ErrorList {
	var errs field.ErrorList
	for i, c := range s.Status.Conditions {
		switch c.Status {
		case apiregistrationv1.ConditionTrue, apiregistrationv1.ConditionFalse, apiregistrationv1.ConditionUnknown:
		default:
			errs = append(errs, field.NotSupported(field.NewPath("status", "conditions").Index(i).Child("status"), c.Status, []string{"True", "False", "Unknown"}))
		}
	}
	return errs
}
