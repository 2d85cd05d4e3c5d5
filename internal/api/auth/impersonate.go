package auth

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Impersonation headers, as Kubernetes names them (kubectl --as,
// --as-group, --as-uid, client-go's rest.ImpersonationConfig).
const (
	impersonateUser        = "Impersonate-User"
	impersonateGroup       = "Impersonate-Group"
	impersonateUID         = "Impersonate-Uid"
	impersonateExtraPrefix = "Impersonate-Extra-"
)

// Impersonate is Kubernetes' impersonation filter: a request carrying
// Impersonate-* headers runs as the identity they name, once the caller
// is authorized to impersonate each part of it (the verb impersonate on
// users or serviceaccounts, groups, uids and userextras). Without the
// headers it returns u unchanged; a caller that may not gets 403, and the
// headers are never ignored.
func Impersonate(ctx context.Context, authz *Authorizer, u User, h http.Header) (User, error) {
	name := h.Get(impersonateUser)
	groups := h.Values(impersonateGroup)
	uid := h.Get(impersonateUID)
	extra := map[string][]string{}
	for key, values := range h {
		if strings.HasPrefix(key, impersonateExtraPrefix) {
			extra[strings.ToLower(strings.TrimPrefix(key, impersonateExtraPrefix))] = values
		}
	}
	if name == "" && len(groups) == 0 && uid == "" && len(extra) == 0 {
		return u, nil
	}
	if name == "" {
		return u, apierrors.NewBadRequest("impersonating groups, a uid or extra fields requires impersonating a user (Impersonate-User)")
	}
	var checks []Attributes
	as := User{Name: name, UID: uid}
	if ns, sa, ok := serviceAccount(name); ok {
		checks = append(checks, Attributes{Verb: "impersonate", Resource: "serviceaccounts", Namespace: ns, Name: sa, IsResource: true})
		if len(groups) == 0 {
			groups = []string{GroupServiceAccounts, GroupServiceAccounts + ":" + ns}
		}
	} else {
		checks = append(checks, Attributes{Verb: "impersonate", Resource: "users", Name: name, IsResource: true})
	}
	for _, g := range groups {
		checks = append(checks, Attributes{Verb: "impersonate", Resource: "groups", Name: g, IsResource: true})
	}
	if uid != "" {
		checks = append(checks, Attributes{Verb: "impersonate", Group: "authentication.k8s.io", Resource: "uids", Name: uid, IsResource: true})
	}
	for key, values := range extra {
		for _, v := range values {
			checks = append(checks, Attributes{Verb: "impersonate", Group: "authentication.k8s.io", Resource: "userextras", Subresource: key, Name: v, IsResource: true})
		}
	}
	for _, a := range checks {
		if err := authz.Authorize(ctx, u, a); err != nil {
			resource := a.Resource
			if a.Subresource != "" {
				resource += "/" + a.Subresource
			}
			forbidden := apierrors.NewForbidden(schema.GroupResource{Group: a.Group, Resource: resource}, a.Name, err)
			forbidden.ErrStatus.Message = fmt.Sprintf("%s %q is forbidden: User %q cannot impersonate resource %q in API group %q%s",
				resource, a.Name, u.Name, resource, a.Group, InNamespace(a.Namespace))
			return u, forbidden
		}
	}
	as.Groups = groups
	if len(extra) > 0 {
		as.Extra = extra
	}
	// As Kubernetes: everyone but the anonymous user is authenticated.
	if name == Anonymous {
		if !as.InGroup(GroupUnauthenticated) {
			as.Groups = append(as.Groups, GroupUnauthenticated)
		}
	} else if !as.InGroup(GroupAuthenticated) {
		as.Groups = append(as.Groups, GroupAuthenticated)
	}
	return as, nil
}

// serviceAccount splits system:serviceaccount:<namespace>:<name>.
func serviceAccount(user string) (namespace, name string, ok bool) {
	rest, ok := strings.CutPrefix(user, ServiceAccountPrefix)
	if !ok {
		return "", "", false
	}
	namespace, name, ok = strings.Cut(rest, ":")
	return namespace, name, ok && namespace != "" && name != ""
}

// InNamespace is the end of Kubernetes' forbidden message: where the
// request was refused.
func InNamespace(ns string) string {
	if ns == "" {
		return " at the cluster scope"
	}
	return fmt.Sprintf(" in the namespace %q", ns)
}
