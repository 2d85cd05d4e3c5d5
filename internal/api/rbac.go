package api

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/orch-dev/orch/internal/api/auth"
	"github.com/orch-dev/orch/internal/api/auth/rbac"
	"github.com/orch-dev/orch/internal/api/registry"
	rbacv1 "k8s.io/api/rbac/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/component-helpers/auth/rbac/validation"
)

// rbacKind feeds one RBAC resource's watch into the index.
type rbacKind struct {
	index *rbac.Index
	kind  string
}

func (k rbacKind) Replace(objs []runtime.Object) { k.index.Replace(k.kind, objs) }
func (k rbacKind) Set(obj runtime.Object)        { k.index.Set(obj) }
func (k rbacKind) Delete(obj runtime.Object)     { k.index.Delete(obj) }

// followRBAC keeps the authorizer's index current until ctx ends.
func (s *Server) followRBAC(ctx context.Context) {
	for _, kind := range rbac.Kinds {
		go follow(ctx, s.storage(rbacv1.GroupName, kind), rbacKind{s.rbac, kind}, s.log)
	}
}

// bootstrapRBAC reconciles Kubernetes' bootstrap policy as kube-apiserver
// does at each start: missing roles, rules, selectors and subjects are
// added, labels and annotations the user set win, nothing the user added
// is removed, and objects annotated autoupdate=false are left be.
func (s *Server) bootstrapRBAC(ctx context.Context) error {
	roles := s.storage(rbacv1.GroupName, "clusterroles")
	for _, want := range rbac.ClusterRoles() {
		err := reconcile(ctx, s.log, roles, &want, func(cur runtime.Object) (runtime.Object, bool) {
			have := cur.(*rbacv1.ClusterRole).DeepCopy()
			changed := mergeMeta(&have.ObjectMeta, want.ObjectMeta)
			if want.AggregationRule != nil {
				// The aggregation loop keeps its rules: only selectors are added.
				if have.AggregationRule == nil {
					have.AggregationRule, changed = &rbacv1.AggregationRule{}, true
				}
				for _, sel := range want.AggregationRule.ClusterRoleSelectors {
					if !slices.ContainsFunc(have.AggregationRule.ClusterRoleSelectors, func(h metav1.LabelSelector) bool { return apiequality.Semantic.DeepEqual(h, sel) }) {
						have.AggregationRule.ClusterRoleSelectors = append(have.AggregationRule.ClusterRoleSelectors, sel)
						changed = true
					}
				}
				return have, changed
			}
			if ok, missing := validation.Covers(have.Rules, want.Rules); !ok {
				have.Rules, changed = append(have.Rules, missing...), true
			}
			return have, changed
		})
		if err != nil {
			return fmt.Errorf("bootstrap clusterrole %s: %w", want.Name, err)
		}
	}
	bindings := s.storage(rbacv1.GroupName, "clusterrolebindings")
	for _, want := range rbac.ClusterRoleBindings() {
		err := reconcile(ctx, s.log, bindings, &want, func(cur runtime.Object) (runtime.Object, bool) {
			have := cur.(*rbacv1.ClusterRoleBinding).DeepCopy()
			if have.RoleRef != want.RoleRef {
				return nil, true // immutable: made again
			}
			changed := mergeMeta(&have.ObjectMeta, want.ObjectMeta)
			for _, sub := range want.Subjects {
				if !slices.Contains(have.Subjects, sub) {
					have.Subjects, changed = append(have.Subjects, sub), true
				}
			}
			return have, changed
		})
		if err != nil {
			return fmt.Errorf("bootstrap clusterrolebinding %s: %w", want.Name, err)
		}
	}
	return nil
}

// reconcile creates want in st if it is missing, or writes what merge
// makes of the stored one when it changed something, through the
// registry's update (retried over concurrent writes); merge returning nil
// means the stored one must be deleted and want created (a binding's
// roleRef cannot change). An object annotated autoupdate=false is not
// touched.
func reconcile(ctx context.Context, log *slog.Logger, st *registry.Storage, want runtime.Object, merge func(cur runtime.Object) (runtime.Object, bool)) error {
	name := metaName(want)
	var updated, recreate bool
	var uid types.UID
	_, _, err := st.Update(ctx, "", name, func(_ context.Context, cur runtime.Object) (runtime.Object, error) {
		updated, recreate = false, false
		if cur == nil {
			return nil, apierrors.NewNotFound(st.Resource.GroupResource(), name)
		}
		next, changed := merge(cur)
		switch {
		case !changed:
			return cur, nil
		case cur.(metav1.Object).GetAnnotations()[rbac.AutoUpdateAnnotation] == "false":
			log.Warn("bootstrap RBAC: not updating what is annotated "+rbac.AutoUpdateAnnotation+"=false", "resource", st.Resource.Plural, "name", name)
			return cur, nil
		case next == nil:
			recreate, uid = true, cur.(metav1.Object).GetUID()
			return cur, nil
		}
		updated = true
		setResourceVersion(next, "")
		return next, nil
	}, registry.UpdateOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return err
	case recreate:
		if _, err := st.Delete(ctx, "", name, &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}, registry.WriteOptions{}); err != nil {
			return err
		}
	default:
		if updated {
			log.Info("bootstrap RBAC: updated", "resource", st.Resource.Plural, "name", name)
		}
		return nil
	}
	log.Info("bootstrap RBAC: created", "resource", st.Resource.Plural, "name", name)
	_, err = st.Create(ctx, want, registry.WriteOptions{})
	return err
}

// mergeMeta adds want's labels and annotations that have is missing
// (what the user set wins, as Kubernetes' reconciliation merges).
func mergeMeta(have *metav1.ObjectMeta, want metav1.ObjectMeta) bool {
	changed := false
	for _, m := range []struct {
		have *map[string]string
		want map[string]string
	}{{&have.Labels, want.Labels}, {&have.Annotations, want.Annotations}} {
		for k, v := range m.want {
			if _, ok := (*m.have)[k]; !ok {
				if *m.have == nil {
					*m.have = map[string]string{}
				}
				(*m.have)[k], changed = v, true
			}
		}
	}
	return changed
}

// escalation is Kubernetes' RBAC escalation prevention, as admission of
// roles and bindings: a user may write a role only with rules they hold
// themselves (or with the escalate verb on it), and bind a role only if
// they hold its rules (or the bind verb on it). An aggregated ClusterRole
// can gather any rule, so writing one takes every permission.
func (s *Server) escalation(ctx context.Context, obj, old runtime.Object) error {
	u, ok := auth.UserFrom(ctx)
	if !ok || auth.Privileged(u) {
		return nil // the server's own writes, and the privileged
	}
	switch o := obj.(type) {
	case *rbacv1.Role:
		if old != nil && apiequality.Semantic.DeepEqual(o.Rules, old.(*rbacv1.Role).Rules) {
			return nil
		}
		return s.confirmRole(ctx, u, "roles", o.Namespace, o.Name, o.Rules)
	case *rbacv1.ClusterRole:
		if old != nil {
			prev := old.(*rbacv1.ClusterRole)
			if apiequality.Semantic.DeepEqual(o.Rules, prev.Rules) && apiequality.Semantic.DeepEqual(o.AggregationRule, prev.AggregationRule) {
				return nil
			}
		}
		rules := o.Rules
		if o.AggregationRule != nil {
			rules = rbac.Everything
		}
		return s.confirmRole(ctx, u, "clusterroles", "", o.Name, rules)
	case *rbacv1.RoleBinding:
		if old != nil && apiequality.Semantic.DeepEqual(o.Subjects, old.(*rbacv1.RoleBinding).Subjects) {
			return nil
		}
		return s.confirmBind(ctx, u, "rolebindings", o.Namespace, o.Name, o.RoleRef)
	case *rbacv1.ClusterRoleBinding:
		if old != nil && apiequality.Semantic.DeepEqual(o.Subjects, old.(*rbacv1.ClusterRoleBinding).Subjects) {
			return nil
		}
		return s.confirmBind(ctx, u, "clusterrolebindings", "", o.Name, o.RoleRef)
	}
	return nil
}

func (s *Server) confirmRole(ctx context.Context, u auth.User, resource, namespace, name string, rules []rbacv1.PolicyRule) error {
	if s.authz.Authorize(ctx, u, auth.Attributes{Verb: "escalate", Group: rbacv1.GroupName, Resource: resource,
		Namespace: namespace, Name: name, IsResource: true}) == nil {
		return nil
	}
	return s.confirmHeld(ctx, u, schema.GroupResource{Group: rbacv1.GroupName, Resource: resource}, namespace, name, rules)
}

func (s *Server) confirmBind(ctx context.Context, u auth.User, resource, namespace, name string, ref rbacv1.RoleRef) error {
	gr := schema.GroupResource{Group: rbacv1.GroupName, Resource: resource}
	roleResource := "clusterroles"
	if ref.Kind == "Role" {
		roleResource = "roles"
	}
	if s.authz.Authorize(ctx, u, auth.Attributes{Verb: "bind", Group: rbacv1.GroupName, Resource: roleResource,
		Namespace: namespace, Name: ref.Name, IsResource: true}) == nil {
		return nil
	}
	rules, found := s.rbac.RefRules(namespace, ref)
	if !found {
		return apierrors.NewForbidden(gr, name, fmt.Errorf("user %q cannot bind %s %q: it does not exist (and binding it needs the bind verb on it)",
			u.Name, strings.ToLower(ref.Kind), ref.Name))
	}
	return s.confirmHeld(ctx, u, gr, namespace, name, rules)
}

// confirmHeld refuses unless u holds every one of rules in namespace.
func (s *Server) confirmHeld(ctx context.Context, u auth.User, gr schema.GroupResource, namespace, name string, rules []rbacv1.PolicyRule) error {
	held, _, err := s.rbac.RulesFor(ctx, u, namespace)
	if err != nil {
		return apierrors.NewForbidden(gr, name, err)
	}
	if ok, missing := validation.Covers(held, rules); !ok {
		lines := make([]string, 0, len(missing))
		for _, r := range missing {
			lines = append(lines, compact(r))
		}
		return apierrors.NewForbidden(gr, name, fmt.Errorf("user %q (groups=%q) is attempting to grant RBAC permissions not currently held:\n%s",
			u.Name, u.Groups, strings.Join(lines, "\n")))
	}
	return nil
}

// compact shows a rule as Kubernetes' escalation errors do.
func compact(r rbacv1.PolicyRule) string {
	var parts []string
	add := func(name string, v []string) {
		if len(v) > 0 {
			parts = append(parts, fmt.Sprintf("%s:%q", name, v))
		}
	}
	add("APIGroups", r.APIGroups)
	add("Resources", r.Resources)
	add("ResourceNames", r.ResourceNames)
	add("NonResourceURLs", r.NonResourceURLs)
	add("Verbs", r.Verbs)
	return "{" + strings.Join(parts, ", ") + "}"
}
