package api

import (
	"context"
	"fmt"

	"github.com/orch-dev/orch/internal/api/auth"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// answerReview answers the review APIs: whether the caller, or (for
// those allowed to ask) another user, may do something; what the caller
// may do in a namespace; who the caller is. kubectl auth can-i, can-i
// --list and whoami ask these.
func (s *Server) answerReview(ctx context.Context, obj runtime.Object) (runtime.Object, error) {
	u, ok := auth.UserFrom(ctx)
	if !ok {
		return nil, fmt.Errorf("review without a user")
	}
	switch r := obj.(type) {
	case *authorizationv1.SelfSubjectAccessReview:
		r.Status = s.access(ctx, u, r.Spec.ResourceAttributes, r.Spec.NonResourceAttributes)
	case *authorizationv1.SubjectAccessReview:
		r.Status = s.access(ctx, subject(r.Spec), r.Spec.ResourceAttributes, r.Spec.NonResourceAttributes)
	case *authorizationv1.LocalSubjectAccessReview:
		r.Status = s.access(ctx, subject(r.Spec), r.Spec.ResourceAttributes, r.Spec.NonResourceAttributes)
	case *authorizationv1.SelfSubjectRulesReview:
		r.Status = s.rules(ctx, u, r.Spec.Namespace)
	case *authenticationv1.SelfSubjectReview:
		r.Status.UserInfo = userInfo(u)
	case *authenticationv1.TokenReview:
		r.Status = s.reviewToken(ctx, r.Spec)
	default:
		return nil, fmt.Errorf("no review of %T", obj)
	}
	return obj, nil
}

// subject is the user a SubjectAccessReview asks about, exactly as given
// (Kubernetes adds no groups to it).
func subject(spec authorizationv1.SubjectAccessReviewSpec) auth.User {
	u := auth.User{Name: spec.User, UID: spec.UID, Groups: spec.Groups}
	for k, v := range spec.Extra {
		if u.Extra == nil {
			u.Extra = map[string][]string{}
		}
		u.Extra[k] = v
	}
	return u
}

func (s *Server) access(ctx context.Context, u auth.User, res *authorizationv1.ResourceAttributes, nonRes *authorizationv1.NonResourceAttributes) authorizationv1.SubjectAccessReviewStatus {
	var a auth.Attributes
	if res != nil {
		a = auth.Attributes{Verb: res.Verb, Group: res.Group, Namespace: res.Namespace, Resource: res.Resource,
			Subresource: res.Subresource, Name: res.Name, IsResource: true}
		if res.FieldSelector != nil {
			a.FieldSelector = res.FieldSelector.RawSelector
		}
	} else {
		a = auth.Attributes{Verb: nonRes.Verb, Path: nonRes.Path}
	}
	d, why := s.authz.Decide(ctx, u, a)
	return authorizationv1.SubjectAccessReviewStatus{Allowed: d == auth.Allow, Denied: d == auth.Deny, Reason: why}
}

// rules lists what RBAC grants u in namespace, as SelfSubjectRulesReview
// does; what the node authorizer grants is not a rule list, so a node's
// answer is incomplete, as in Kubernetes.
func (s *Server) rules(ctx context.Context, u auth.User, namespace string) authorizationv1.SubjectRulesReviewStatus {
	var st authorizationv1.SubjectRulesReviewStatus
	rules, complete, err := s.rbac.RulesFor(ctx, u, namespace)
	if err != nil {
		st.EvaluationError = err.Error()
	}
	st.Incomplete = !complete || err != nil || u.InGroup(auth.GroupNodes)
	for _, r := range rules {
		if len(r.NonResourceURLs) > 0 {
			st.NonResourceRules = append(st.NonResourceRules, authorizationv1.NonResourceRule{Verbs: r.Verbs, NonResourceURLs: r.NonResourceURLs})
			continue
		}
		st.ResourceRules = append(st.ResourceRules, authorizationv1.ResourceRule{Verbs: r.Verbs, APIGroups: r.APIGroups,
			Resources: r.Resources, ResourceNames: r.ResourceNames})
	}
	if st.ResourceRules == nil {
		st.ResourceRules = []authorizationv1.ResourceRule{}
	}
	if st.NonResourceRules == nil {
		st.NonResourceRules = []authorizationv1.NonResourceRule{}
	}
	return st
}

// reviewToken says who a token is, for one of the audiences asked (the
// API's when none are), as a TokenReview answers: never an error, only
// unauthenticated with the reason.
func (s *Server) reviewToken(ctx context.Context, spec authenticationv1.TokenReviewSpec) authenticationv1.TokenReviewStatus {
	u, audiences, err := s.authn.AuthenticateToken(ctx, spec.Token, spec.Audiences)
	if err != nil {
		return authenticationv1.TokenReviewStatus{Error: err.Error()}
	}
	return authenticationv1.TokenReviewStatus{Authenticated: true, Audiences: audiences, User: userInfo(u)}
}

func userInfo(u auth.User) authenticationv1.UserInfo {
	info := authenticationv1.UserInfo{Username: u.Name, UID: u.UID, Groups: u.Groups}
	for k, v := range u.Extra {
		if info.Extra == nil {
			info.Extra = map[string]authenticationv1.ExtraValue{}
		}
		info.Extra[k] = v
	}
	return info
}
