// Package rbac is Kubernetes' RBAC authorizer: who may do what, decided
// from the Roles, ClusterRoles and their bindings held in an in-memory
// index that a watch keeps current, so a request costs map lookups of
// its user's and groups' bindings, never a read of the store. It also
// answers what a user may do (SelfSubjectRulesReview, the escalation
// check) and holds the bootstrap policy Kubernetes ships.
package rbac

import (
	"strings"

	"github.com/orch-dev/orch/internal/api/auth"
	rbacv1 "k8s.io/api/rbac/v1"
)

// The rule semantics below are Kubernetes' (rbac/v1 evaluation helpers):
// "*" matches any verb, group, resource or URL; "*/sub" any resource's
// subresource sub; a URL ending in "*" its prefix; resourceNames, when
// set, only requests that name one of them.

func has(set []string, v string) bool {
	for _, s := range set {
		if s == v || s == rbacv1.VerbAll {
			return true
		}
	}
	return false
}

func resourceMatches(r rbacv1.PolicyRule, resource, subresource string) bool {
	combined := resource
	if subresource != "" {
		combined += "/" + subresource
	}
	for _, rr := range r.Resources {
		switch {
		case rr == rbacv1.ResourceAll, rr == combined:
			return true
		case subresource != "" && rr == "*/"+subresource:
			return true
		}
	}
	return false
}

func nameMatches(r rbacv1.PolicyRule, name string) bool {
	if len(r.ResourceNames) == 0 {
		return true
	}
	for _, n := range r.ResourceNames {
		if n == name {
			return true
		}
	}
	return false
}

func urlMatches(r rbacv1.PolicyRule, path string) bool {
	for _, u := range r.NonResourceURLs {
		switch {
		case u == rbacv1.NonResourceAll, u == path:
			return true
		case strings.HasSuffix(u, "*") && strings.HasPrefix(path, strings.TrimSuffix(u, "*")):
			return true
		}
	}
	return false
}

// Allows reports whether rule r grants the request a.
func Allows(r rbacv1.PolicyRule, a auth.Attributes) bool {
	if !has(r.Verbs, a.Verb) {
		return false
	}
	if !a.IsResource {
		return urlMatches(r, a.Path)
	}
	return has(r.APIGroups, a.Group) && resourceMatches(r, a.Resource, a.Subresource) && nameMatches(r, a.Name)
}

// subjectKey names who a binding's subject is, in the shape a request's
// user is looked up by: a service account is the user it authenticates
// as, so one lookup finds bindings to it by either kind.
func subjectKey(s rbacv1.Subject, bindingNamespace string) (string, bool) {
	switch s.Kind {
	case rbacv1.UserKind:
		return "user:" + s.Name, true
	case rbacv1.GroupKind:
		return "group:" + s.Name, true
	case rbacv1.ServiceAccountKind:
		ns := s.Namespace
		if ns == "" {
			ns = bindingNamespace
		}
		return "user:" + auth.ServiceAccountPrefix + ns + ":" + s.Name, true
	}
	return "", false
}

// userKeys are the subject keys a user matches: its name and its groups.
func userKeys(u auth.User) []string {
	keys := make([]string, 0, 1+len(u.Groups))
	keys = append(keys, "user:"+u.Name)
	for _, g := range u.Groups {
		keys = append(keys, "group:"+g)
	}
	return keys
}
