// Package authorization describes the review kinds of the
// authorization.k8s.io and authentication.k8s.io API groups: questions a
// client asks the server (may I, may they, what may I, who am I, who is
// this token) that are
// answered, never stored. The answers are the API server's to give; the
// descriptions take them as a function.
package authorization

import (
	"context"

	"github.com/orch-dev/orch/internal/api/resources"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Answer answers one review: obj with its status filled in.
type Answer func(ctx context.Context, obj runtime.Object) (runtime.Object, error)

// Resources describes the review kinds, answered by answer.
func Resources(answer Answer) []*resources.Resource {
	const authz, authn = authorizationv1.GroupName, authenticationv1.GroupName
	return []*resources.Resource{
		resources.Reviewed[authorizationv1.SelfSubjectAccessReview](&resources.Resource{
			GroupVersionKind: resources.GVK(authz, "SelfSubjectAccessReview"), Plural: "selfsubjectaccessreviews", Singular: "selfsubjectaccessreview",
			Validate: resources.TypedValidate(func(r *authorizationv1.SelfSubjectAccessReview) field.ErrorList {
				return validateAttributes(r.Spec.ResourceAttributes, r.Spec.NonResourceAttributes)
			}),
		}, answer),
		resources.Reviewed[authorizationv1.SelfSubjectRulesReview](&resources.Resource{
			GroupVersionKind: resources.GVK(authz, "SelfSubjectRulesReview"), Plural: "selfsubjectrulesreviews", Singular: "selfsubjectrulesreview",
		}, answer),
		resources.Reviewed[authorizationv1.SubjectAccessReview](&resources.Resource{
			GroupVersionKind: resources.GVK(authz, "SubjectAccessReview"), Plural: "subjectaccessreviews", Singular: "subjectaccessreview",
			Validate: resources.TypedValidate(func(r *authorizationv1.SubjectAccessReview) field.ErrorList {
				return validateSubject(r.Spec)
			}),
		}, answer),
		resources.Reviewed[authorizationv1.LocalSubjectAccessReview](&resources.Resource{
			GroupVersionKind: resources.GVK(authz, "LocalSubjectAccessReview"), Plural: "localsubjectaccessreviews", Singular: "localsubjectaccessreview",
			Namespaced: true,
			Validate: resources.TypedValidate(func(r *authorizationv1.LocalSubjectAccessReview) field.ErrorList {
				errs := validateSubject(r.Spec)
				if r.Spec.NonResourceAttributes != nil {
					errs = append(errs, field.Invalid(specPath.Child("nonResourceAttributes"), r.Spec.NonResourceAttributes, "disallowed on this kind of request"))
				}
				if a := r.Spec.ResourceAttributes; a != nil && a.Namespace != r.Namespace {
					errs = append(errs, field.Invalid(specPath.Child("resourceAttributes", "namespace"), a.Namespace, "must match metadata.namespace"))
				}
				return errs
			}),
		}, answer),
		resources.Reviewed[authenticationv1.SelfSubjectReview](&resources.Resource{
			GroupVersionKind: resources.GVK(authn, "SelfSubjectReview"), Plural: "selfsubjectreviews", Singular: "selfsubjectreview",
		}, answer),
		resources.Reviewed[authenticationv1.TokenReview](&resources.Resource{
			GroupVersionKind: resources.GVK(authn, "TokenReview"), Plural: "tokenreviews", Singular: "tokenreview",
			Validate: resources.TypedValidate(func(r *authenticationv1.TokenReview) field.ErrorList {
				if r.Spec.Token == "" {
					return field.ErrorList{field.Required(specPath.Child("token"), "token is required for TokenReview in authentication")}
				}
				return nil
			}),
		}, answer),
	}
}

var specPath = field.NewPath("spec")

// validateAttributes is Kubernetes': a review asks about a resource or a
// URL, exactly one.
func validateAttributes(res *authorizationv1.ResourceAttributes, nonRes *authorizationv1.NonResourceAttributes) field.ErrorList {
	if (res == nil) == (nonRes == nil) {
		return field.ErrorList{field.Invalid(specPath.Child("resourceAttributes"), res, "exactly one of nonResourceAttributes or resourceAttributes must be specified")}
	}
	return nil
}

func validateSubject(spec authorizationv1.SubjectAccessReviewSpec) field.ErrorList {
	errs := validateAttributes(spec.ResourceAttributes, spec.NonResourceAttributes)
	if spec.User == "" && len(spec.Groups) == 0 {
		errs = append(errs, field.Invalid(specPath.Child("user"), spec.User, "at least one of user or group must be specified"))
	}
	return errs
}
