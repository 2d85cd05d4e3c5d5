package rbac

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/orch-dev/orch/internal/api/auth"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Index holds the cluster's roles and bindings for authorization. Bindings
// are indexed by subject, and each subject's rules in a namespace are
// compiled into a table on first use (until a role or binding changes),
// so deciding a request is a few map lookups per user and group,
// whatever the number of roles, bindings and rules.
type Index struct {
	mu           sync.RWMutex
	roles        map[roleKey][]rbacv1.PolicyRule
	clusterRoles map[string][]rbacv1.PolicyRule
	bindings     map[bindingKey]binding
	bySubject    map[string]map[bindingKey]struct{}
	// synced is closed once every kind has been loaded: a request
	// decided before would be refused for want of the bindings.
	synced   chan struct{}
	loaded   map[string]bool
	syncWait time.Duration
	// tables are the subjects' compiled rules, for Decide.
	tables tables
}

type roleKey struct{ namespace, name string }

// bindingKey is a RoleBinding's namespace and name; a ClusterRoleBinding's
// namespace is "".
type bindingKey struct{ namespace, name string }

type binding struct {
	ref      rbacv1.RoleRef
	subjects []string
}

// Kinds are the resources the index holds, and loads before it decides:
// each Replace of one counts.
var Kinds = []string{"roles", "clusterroles", "rolebindings", "clusterrolebindings"}

// NewIndex is an empty index; Decide waits up to syncWait for it to be
// loaded (Replace of every kind) before it refuses.
func NewIndex(syncWait time.Duration) *Index {
	return &Index{roles: map[roleKey][]rbacv1.PolicyRule{}, clusterRoles: map[string][]rbacv1.PolicyRule{},
		bindings: map[bindingKey]binding{}, bySubject: map[string]map[bindingKey]struct{}{},
		synced: make(chan struct{}), loaded: map[string]bool{}, syncWait: syncWait}
}

// Set adds or replaces a Role, ClusterRole, RoleBinding or ClusterRoleBinding.
func (x *Index) Set(obj runtime.Object) {
	x.mu.Lock()
	defer x.mu.Unlock()
	defer x.tables.clear()
	x.set(obj)
}

func (x *Index) set(obj runtime.Object) {
	switch o := obj.(type) {
	case *rbacv1.Role:
		x.roles[roleKey{o.Namespace, o.Name}] = o.Rules
	case *rbacv1.ClusterRole:
		x.clusterRoles[o.Name] = o.Rules
	case *rbacv1.RoleBinding:
		x.setBinding(bindingKey{o.Namespace, o.Name}, o.RoleRef, o.Subjects)
	case *rbacv1.ClusterRoleBinding:
		x.setBinding(bindingKey{"", o.Name}, o.RoleRef, o.Subjects)
	}
}

// Delete removes an object Set added.
func (x *Index) Delete(obj runtime.Object) {
	x.mu.Lock()
	defer x.mu.Unlock()
	defer x.tables.clear()
	switch o := obj.(type) {
	case *rbacv1.Role:
		delete(x.roles, roleKey{o.Namespace, o.Name})
	case *rbacv1.ClusterRole:
		delete(x.clusterRoles, o.Name)
	case *rbacv1.RoleBinding:
		x.deleteBinding(bindingKey{o.Namespace, o.Name})
	case *rbacv1.ClusterRoleBinding:
		x.deleteBinding(bindingKey{"", o.Name})
	}
}

// Replace sets the whole of one kind ("roles", "clusterroles",
// "rolebindings", "clusterrolebindings") to objs, as a fresh list of it.
func (x *Index) Replace(kind string, objs []runtime.Object) {
	x.mu.Lock()
	defer x.mu.Unlock()
	defer x.tables.clear()
	switch kind {
	case "roles":
		clear(x.roles)
	case "clusterroles":
		clear(x.clusterRoles)
	case "rolebindings", "clusterrolebindings":
		for k := range x.bindings {
			if (k.namespace == "") == (kind == "clusterrolebindings") {
				x.deleteBinding(k)
			}
		}
	default:
		panic(fmt.Sprintf("rbac index: no kind %q", kind))
	}
	for _, o := range objs {
		x.set(o)
	}
	if !x.loaded[kind] {
		x.loaded[kind] = true
		if len(x.loaded) == len(Kinds) {
			close(x.synced)
		}
	}
}

func (x *Index) setBinding(k bindingKey, ref rbacv1.RoleRef, subjects []rbacv1.Subject) {
	x.deleteBinding(k)
	b := binding{ref: ref}
	for _, s := range subjects {
		key, ok := subjectKey(s, k.namespace)
		if !ok {
			continue
		}
		b.subjects = append(b.subjects, key)
		if x.bySubject[key] == nil {
			x.bySubject[key] = map[bindingKey]struct{}{}
		}
		x.bySubject[key][k] = struct{}{}
	}
	x.bindings[k] = b
}

func (x *Index) deleteBinding(k bindingKey) {
	for _, key := range x.bindings[k].subjects {
		delete(x.bySubject[key], k)
		if len(x.bySubject[key]) == 0 {
			delete(x.bySubject, key)
		}
	}
	delete(x.bindings, k)
}

// rules is what a binding in namespace ("" for a ClusterRoleBinding) to
// ref grants: its role's rules, and whether the role is there (a binding
// may be made before its role).
func (x *Index) rules(namespace string, ref rbacv1.RoleRef) ([]rbacv1.PolicyRule, bool) {
	switch ref.Kind {
	case "ClusterRole":
		r, ok := x.clusterRoles[ref.Name]
		return r, ok
	case "Role":
		r, ok := x.roles[roleKey{namespace, ref.Name}]
		return r, ok && namespace != ""
	}
	return nil, false
}

// visit calls f with every binding of u that applies in namespace (""
// for the cluster scope: ClusterRoleBindings only), its role's rules and
// whether that role exists, until f returns false.
func (x *Index) visit(u auth.User, namespace string, f func(rules []rbacv1.PolicyRule, found, roleBinding bool) bool) {
	for _, key := range userKeys(u) {
		for k := range x.bySubject[key] {
			if k.namespace != "" && k.namespace != namespace {
				continue
			}
			rules, found := x.rules(k.namespace, x.bindings[k].ref)
			if !f(rules, found, k.namespace != "") {
				return
			}
		}
	}
}

// Decide implements auth.Rule: Allow when a rule bound to the user or one
// of its groups grants the request, NoOpinion otherwise, as Kubernetes'
// RBAC authorizer (which never denies).
func (x *Index) Decide(ctx context.Context, u auth.User, a auth.Attributes) (auth.Decision, string) {
	if err := x.waitSynced(ctx); err != nil {
		return auth.NoOpinion, err.Error()
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	namespace := a.Namespace
	if !a.IsResource {
		namespace = "" // non-resource URLs: ClusterRoleBindings only
	}
	if x.table("user:"+u.Name, namespace).allows(a) {
		return auth.Allow, ""
	}
	for _, g := range u.Groups {
		if x.table("group:"+g, namespace).allows(a) {
			return auth.Allow, ""
		}
	}
	return auth.NoOpinion, ""
}

func (x *Index) waitSynced(ctx context.Context) error {
	select {
	case <-x.synced:
		return nil
	default:
	}
	t := time.NewTimer(x.syncWait)
	defer t.Stop()
	select {
	case <-x.synced:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return fmt.Errorf("RBAC: the roles and bindings are not loaded yet")
	}
}

// RulesFor is every rule granted to u in namespace ("" for the cluster
// scope), with ok false when a binding names a role that is not there, as
// Kubernetes' rule resolver reports (SelfSubjectRulesReview's
// incomplete, the escalation check's evaluation error).
func (x *Index) RulesFor(ctx context.Context, u auth.User, namespace string) (rules []rbacv1.PolicyRule, ok bool, err error) {
	if err := x.waitSynced(ctx); err != nil {
		return nil, false, err
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	ok = true
	x.visit(u, namespace, func(r []rbacv1.PolicyRule, found, roleBinding bool) bool {
		ok = ok && found
		for _, rule := range r {
			if roleBinding && len(rule.NonResourceURLs) > 0 {
				continue // a RoleBinding grants no URLs
			}
			rules = append(rules, rule)
		}
		return true
	})
	return rules, ok, nil
}

// RefRules are the rules of the role ref names, as a binding in
// namespace ("" for a ClusterRoleBinding) would grant them, and whether
// that role exists.
func (x *Index) RefRules(namespace string, ref rbacv1.RoleRef) ([]rbacv1.PolicyRule, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.rules(namespace, ref)
}
