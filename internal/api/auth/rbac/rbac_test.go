package rbac

import (
	"context"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api/auth"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

func res(verb, group, resource, sub, ns, name string) auth.Attributes {
	return auth.Attributes{Verb: verb, Group: group, Resource: resource, Subresource: sub, Namespace: ns, Name: name, IsResource: true}
}

// TestAllows: one rule against one request, with Kubernetes' semantics
// for each field (rbac/v1 evaluation helpers).
func TestAllows(t *testing.T) {
	pods := rbacv1.PolicyRule{Verbs: []string{"get", "list"}, APIGroups: []string{""}, Resources: []string{"pods"}}
	for _, tc := range []struct {
		name string
		rule rbacv1.PolicyRule
		a    auth.Attributes
		want bool
	}{
		{"verb and resource", pods, res("get", "", "pods", "", "default", "web"), true},
		{"another verb", pods, res("delete", "", "pods", "", "default", "web"), false},
		{"another group", pods, res("get", "apps", "pods", "", "default", "web"), false},
		{"a subresource is not its resource", pods, res("get", "", "pods", "log", "default", "web"), false},
		{"the subresource named", rbacv1.PolicyRule{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"pods/log"}}, res("get", "", "pods", "log", "default", "web"), true},
		{"nor the resource its subresource", rbacv1.PolicyRule{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"pods/log"}}, res("get", "", "pods", "", "default", "web"), false},
		{"*/sub is any resource's sub", rbacv1.PolicyRule{Verbs: []string{"update"}, APIGroups: []string{"*"}, Resources: []string{"*/status"}}, res("update", "apps", "deployments", "status", "default", "web"), true},
		{"*/sub is not the resource", rbacv1.PolicyRule{Verbs: []string{"update"}, APIGroups: []string{"*"}, Resources: []string{"*/status"}}, res("update", "apps", "deployments", "", "default", "web"), false},
		{"* is everything", rbacv1.PolicyRule{Verbs: []string{"*"}, APIGroups: []string{"*"}, Resources: []string{"*"}}, res("escalate", "rbac.authorization.k8s.io", "roles", "", "x", "y"), true},
		{"* resource covers subresources", rbacv1.PolicyRule{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"*"}}, res("get", "", "pods", "exec", "d", "w"), true},
		{"resourceNames allow the named", rbacv1.PolicyRule{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{"app"}}, res("get", "", "configmaps", "", "d", "app"), true},
		{"resourceNames refuse others", rbacv1.PolicyRule{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{"app"}}, res("get", "", "configmaps", "", "d", "db"), false},
		{"resourceNames refuse a list", rbacv1.PolicyRule{Verbs: []string{"list"}, APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{"app"}}, res("list", "", "configmaps", "", "d", ""), false},
		{"a URL", rbacv1.PolicyRule{Verbs: []string{"get"}, NonResourceURLs: []string{"/healthz"}}, auth.Attributes{Verb: "get", Path: "/healthz"}, true},
		{"a URL prefix", rbacv1.PolicyRule{Verbs: []string{"get"}, NonResourceURLs: []string{"/apis/*"}}, auth.Attributes{Verb: "get", Path: "/apis/apps/v1"}, true},
		{"not a longer URL", rbacv1.PolicyRule{Verbs: []string{"get"}, NonResourceURLs: []string{"/healthz"}}, auth.Attributes{Verb: "get", Path: "/healthz/etcd"}, false},
		{"a URL rule is no resource rule", rbacv1.PolicyRule{Verbs: []string{"*"}, NonResourceURLs: []string{"*"}}, res("get", "", "pods", "", "d", "w"), false},
		{"a resource rule is no URL rule", rbacv1.PolicyRule{Verbs: []string{"*"}, APIGroups: []string{"*"}, Resources: []string{"*"}}, auth.Attributes{Verb: "get", Path: "/metrics"}, false},
	} {
		if got := Allows(tc.rule, tc.a); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
		// The compiled table Decide uses says the same, alone and among
		// rules that grant something else.
		other := rbacv1.PolicyRule{Verbs: []string{"watch"}, APIGroups: []string{"batch"}, Resources: []string{"jobs"}, ResourceNames: []string{"nightly"}}
		for _, rules := range [][]rbacv1.PolicyRule{{tc.rule}, {other, tc.rule, other}} {
			if got := compile(rules).allows(tc.a); got != tc.want {
				t.Errorf("%s, compiled from %d rules: %v, want %v", tc.name, len(rules), got, tc.want)
			}
		}
	}
}

// loaded is an index with the bootstrap policy and objs.
func loaded(t testing.TB, objs ...runtime.Object) *Index {
	t.Helper()
	x := NewIndex(time.Second)
	byKind := map[string][]runtime.Object{}
	for _, r := range ClusterRoles() {
		byKind["clusterroles"] = append(byKind["clusterroles"], &r)
	}
	for _, b := range ClusterRoleBindings() {
		byKind["clusterrolebindings"] = append(byKind["clusterrolebindings"], &b)
	}
	for _, o := range objs {
		byKind[kindOf(o)] = append(byKind[kindOf(o)], o)
	}
	for _, kind := range Kinds {
		x.Replace(kind, byKind[kind])
	}
	return x
}

func kindOf(o runtime.Object) string {
	switch o.(type) {
	case *rbacv1.Role:
		return "roles"
	case *rbacv1.ClusterRole:
		return "clusterroles"
	case *rbacv1.RoleBinding:
		return "rolebindings"
	}
	return "clusterrolebindings"
}

func allowed(x *Index, u auth.User, a auth.Attributes) bool {
	d, _ := x.Decide(context.Background(), u, a)
	return d == auth.Allow
}

var (
	alice = auth.User{Name: "alice", Groups: []string{auth.GroupAuthenticated}}
	proxy = auth.User{Name: "system:kube-proxy", Groups: []string{auth.GroupAuthenticated}}
)

// TestBootstrapPolicy: what Kubernetes' default policy gives every user
// (discovery, the self reviews) and the nodes' service proxy
// (system:node-proxier), and nothing more.
func TestBootstrapPolicy(t *testing.T) {
	x := loaded(t)
	anonymous := auth.User{Name: auth.Anonymous, Groups: []string{auth.GroupUnauthenticated}}
	for _, tc := range []struct {
		name  string
		u     auth.User
		a     auth.Attributes
		allow bool
	}{
		{"anyone may discover", alice, auth.Attributes{Verb: "get", Path: "/apis/apps/v1"}, true},
		{"and read the OpenAPI", alice, auth.Attributes{Verb: "get", Path: "/openapi/v3"}, true},
		{"and ask what they may do", alice, res("create", "authorization.k8s.io", "selfsubjectaccessreviews", "", "", ""), true},
		{"and who they are", alice, res("create", "authentication.k8s.io", "selfsubjectreviews", "", "", ""), true},
		{"but not about others", alice, res("create", "authorization.k8s.io", "subjectaccessreviews", "", "", ""), false},
		{"nor list pods", alice, res("list", "", "pods", "", "default", ""), false},
		{"the anonymous may read the version", anonymous, auth.Attributes{Verb: "get", Path: "/version"}, true},
		{"but not discover", anonymous, auth.Attributes{Verb: "get", Path: "/api"}, false},
		{"masters by their binding", auth.User{Name: "admin", Groups: []string{auth.GroupMasters}}, res("delete", "", "nodes", "", "", "n1"), true},
		{"proxy lists services", proxy, res("list", "", "services", "", "", ""), true},
		{"proxy watches endpointslices", proxy, res("watch", "discovery.k8s.io", "endpointslices", "", "", ""), true},
		{"proxy lists nodes", proxy, res("list", "", "nodes", "", "", ""), true},
		{"proxy gets endpoints", proxy, res("get", "", "endpoints", "", "default", "web"), true},
		{"proxy creates events", proxy, res("create", "", "events", "", "default", ""), true},
		{"proxy may not update a node", proxy, res("update", "", "nodes", "", "", "n1"), false},
		{"nor read a node's status", proxy, res("get", "", "nodes", "status", "", "n1"), false},
		{"nor delete a service", proxy, res("delete", "", "services", "", "default", "web"), false},
		{"nor read secrets", proxy, res("get", "", "secrets", "", "default", "db"), false},
		// The nodes' NetworkPolicy engine shares the proxy's identity and
		// reads every pod, namespace and policy (kube-router's rights in
		// k3s), and writes none.
		{"proxy lists pods for network policies", proxy, res("list", "", "pods", "", "", ""), true},
		{"and watches namespaces", proxy, res("watch", "", "namespaces", "", "", ""), true},
		{"and network policies", proxy, res("watch", "networking.k8s.io", "networkpolicies", "", "", ""), true},
		{"but may not delete a pod", proxy, res("delete", "", "pods", "", "default", "web-1"), false},
		{"nor exec into one", proxy, res("create", "", "pods", "exec", "default", "web-1"), false},
		{"nor change a policy", proxy, res("update", "networking.k8s.io", "networkpolicies", "", "default", "deny"), false},
		{"no one is the proxy by group", auth.User{Name: "mallory", Groups: []string{"system:kube-proxy"}}, res("list", "", "nodes", "", "", ""), false},
	} {
		if got := allowed(x, tc.u, tc.a); got != tc.allow {
			t.Errorf("%s: allowed %v, want %v", tc.name, got, tc.allow)
		}
	}
}

// roleBinding is a RoleBinding in the namespace team.
func roleBinding(name, kind, role string, subjects ...rbacv1.Subject) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: kind, Name: role}, Subjects: subjects}
}

func user(name string) rbacv1.Subject {
	return rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: name}
}

// TestBindings: a binding grants its role's rules to its subjects, a
// RoleBinding only in its namespace, and the index follows roles and
// bindings as they change.
func TestBindings(t *testing.T) {
	reader := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "pod-reader"},
		Rules: []rbacv1.PolicyRule{{Verbs: []string{"get", "list"}, APIGroups: []string{""}, Resources: []string{"pods"}}}}
	x := loaded(t, reader)
	listTeam, listOther := res("list", "", "pods", "", "team", ""), res("list", "", "pods", "", "other", "")
	step := func(what string, u auth.User, a auth.Attributes, want bool) {
		t.Helper()
		if got := allowed(x, u, a); got != want {
			t.Errorf("%s: allowed %v, want %v", what, got, want)
		}
	}
	step("before any binding", alice, listTeam, false)
	x.Set(roleBinding("alice-reads", "Role", "pod-reader", user("alice")))
	step("bound in team", alice, listTeam, true)
	step("not in another namespace", alice, listOther, false)
	step("not across namespaces", alice, res("list", "", "pods", "", "", ""), false)
	step("not bob", auth.User{Name: "bob", Groups: []string{auth.GroupAuthenticated}}, listTeam, false)
	x.Set(&rbacv1.Role{ObjectMeta: reader.ObjectMeta, Rules: []rbacv1.PolicyRule{{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"pods"}}}})
	step("the role narrowed", alice, listTeam, false)
	x.Set(reader)
	x.Delete(roleBinding("alice-reads", "", ""))
	step("the binding gone", alice, listTeam, false)

	// A ClusterRole bound in one namespace grants its resource rules there.
	x.Set(roleBinding("devs-view", "ClusterRole", "view", rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "devs"}))
	x.Set(&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "view"}, Rules: []rbacv1.PolicyRule{
		{Verbs: []string{"list"}, APIGroups: []string{""}, Resources: []string{"pods"}}, {Verbs: []string{"get"}, NonResourceURLs: []string{"/metrics"}}}})
	dev := auth.User{Name: "carol", Groups: []string{"devs", auth.GroupAuthenticated}}
	step("a group's ClusterRole in its namespace", dev, listTeam, true)
	step("not elsewhere", dev, listOther, false)
	step("a RoleBinding grants no URL", dev, auth.Attributes{Verb: "get", Path: "/metrics"}, false)

	// A service account by kind, its namespace defaulted from the binding.
	sa := auth.User{Name: "system:serviceaccount:team:builder", Groups: []string{"system:serviceaccounts", "system:serviceaccounts:team", auth.GroupAuthenticated}}
	x.Set(roleBinding("builder", "Role", "pod-reader", rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: "builder"}))
	step("a service account", sa, listTeam, true)
	step("a namesake in another namespace is not it", auth.User{Name: "system:serviceaccount:other:builder"}, listTeam, false)

	// Bound to a role that is not there yet: nothing, then its rules.
	x.Set(&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "ops"}, RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "node-admin"},
		Subjects: []rbacv1.Subject{user("alice")}})
	deleteNode := res("delete", "", "nodes", "", "", "n1")
	step("a binding before its role", alice, deleteNode, false)
	if _, complete, _ := x.RulesFor(context.Background(), alice, ""); complete {
		t.Error("rules of a binding to a missing role: complete, want incomplete")
	}
	x.Set(&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "node-admin"}, Rules: []rbacv1.PolicyRule{{Verbs: []string{"*"}, APIGroups: []string{""}, Resources: []string{"nodes"}}}})
	step("its role made", alice, deleteNode, true)
	step("a cluster binding applies in every namespace too", alice, res("delete", "", "nodes", "", "team", "n1"), true)
}

// TestNotLoaded: before every kind is loaded the index refuses (after
// waiting), rather than deciding on half the bindings.
func TestNotLoaded(t *testing.T) {
	x := NewIndex(10 * time.Millisecond)
	x.Replace("clusterroles", nil)
	d, why := x.Decide(context.Background(), alice, auth.Attributes{Verb: "get", Path: "/api"})
	if d != auth.NoOpinion || why == "" {
		t.Fatalf("decision %v %q, want NoOpinion with a reason", d, why)
	}
}
