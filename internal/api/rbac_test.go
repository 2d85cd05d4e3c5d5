package api_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api"
	"github.com/orch-dev/orch/internal/api/apitest"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// startWithTokens is a server whose token file holds alice (group devs)
// and bob, as `--token-auth-file` users.
func startWithTokens(t *testing.T) *testServer {
	t.Helper()
	tokens := filepath.Join(t.TempDir(), "tokens.csv")
	if err := os.WriteFile(tokens, []byte("alice-token,alice,1001,\"devs\"\nbob-token,bob,1002\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return startServerWith(t, "", 0, func(c *api.Config) { c.TokenAuthFile = tokens })
}

// tokenUser is a kubeconfig and a clientset for the token's user, as a
// user given a token would write one.
func tokenUser(t *testing.T, ts *testServer, token string) (string, kubernetes.Interface) {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(ts.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.AuthInfos = map[string]*clientcmdapi.AuthInfo{"user": {Token: token}}
	for _, c := range cfg.Contexts {
		c.AuthInfo = "user"
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	rc.QPS, rc.Burst = -1, 0
	return path, kubernetes.NewForConfigOrDie(rc)
}

// canI asks whether c's user may do verb on resource in the namespace team.
func canI(ctx context.Context, t *testing.T, c kubernetes.Interface, verb, resource string) bool {
	t.Helper()
	resource, group, _ := strings.Cut(resource, ".") // as kubectl takes roles.rbac.authorization.k8s.io
	r, err := c.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
		ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: verb, Group: group, Resource: resource, Namespace: "team"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return r.Status.Allowed
}

// within polls cond every 10 ms for up to d, and says how long it took.
func within(t *testing.T, what string, d time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// TestRBACWithKubectl: a --token-auth-file user driven with stock kubectl
// is governed by RBAC as in Kubernetes: forbidden with Kubernetes'
// message, allowed within a second of a RoleBinding and refused again
// within a second of its deletion; kubectl auth whoami, can-i and
// can-i --list answer; a user may grant only what they hold (or may
// escalate or bind); impersonation takes the impersonate verb.
func TestRBACWithKubectl(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kubectl")
	}
	ts := startWithTokens(t)
	ctx := context.Background()
	admin := newKubectl(t, ts)
	alicePath, alice := tokenUser(t, ts, "alice-token")
	_, bob := tokenUser(t, ts, "bob-token")
	ak := kubectl{apitest.NewKubectl(t, alicePath)}

	admin.run("create", "namespace", "team")
	admin.run("create", "role", "pod-reader", "--verb=get,list,watch", "--resource=pods", "-n", "team")

	if out := ak.run("auth", "whoami"); !strings.Contains(out, "alice") || !strings.Contains(out, "[devs system:authenticated]") {
		t.Errorf("whoami: %s", out)
	}
	out, err := ak.try("get", "pods", "-n", "team")
	if err == nil || !strings.Contains(out, `pods is forbidden: User "alice" cannot list resource "pods" in API group "" in the namespace "team"`) {
		t.Errorf("unbound alice lists pods: %v %s", err, out)
	}
	if out, _ := ak.try("auth", "can-i", "list", "pods", "-n", "team"); strings.TrimSpace(out) != "no" {
		t.Errorf("can-i before the binding: %q", out)
	}

	admin.run("create", "rolebinding", "alice-reads", "--role=pod-reader", "--user=alice", "-n", "team")
	took := within(t, "alice allowed after the binding", time.Second, func() bool { return canI(ctx, t, alice, "list", "pods") })
	t.Logf("allowed %s after the RoleBinding was created", took)
	ak.run("get", "pods", "-n", "team")
	if out := ak.run("auth", "can-i", "--list", "-n", "team"); !strings.Contains(out, "pods ") || !strings.Contains(out, "[get list watch]") {
		t.Errorf("can-i --list: %s", out)
	}
	if out, err := ak.try("get", "pods", "-n", "default"); err == nil {
		t.Errorf("alice lists pods outside team: %s", out)
	}
	if out, err := ak.try("delete", "pod", "x", "-n", "team"); err == nil || !strings.Contains(out, "forbidden") {
		t.Errorf("alice deletes with a reader's role: %v %s", err, out)
	}
	admin.run("delete", "rolebinding", "alice-reads", "-n", "team")
	took = within(t, "alice refused after the binding's deletion", time.Second, func() bool { return !canI(ctx, t, alice, "list", "pods") })
	t.Logf("refused %s after the RoleBinding was deleted", took)

	// Escalation: alice manages roles and bindings in team, and holds
	// only the pod reader's rules besides.
	admin.run("create", "role", "rbac-manager", "--verb=create,get,list,update,delete", "--resource=roles.rbac.authorization.k8s.io,rolebindings.rbac.authorization.k8s.io", "-n", "team")
	admin.run("create", "rolebinding", "alice-manages", "--role=rbac-manager", "--user=alice", "-n", "team")
	admin.run("create", "rolebinding", "alice-reads", "--role=pod-reader", "--user=alice", "-n", "team")
	within(t, "alice's roles", time.Second, func() bool { return canI(ctx, t, alice, "create", "roles.rbac.authorization.k8s.io") })
	ak.run("create", "role", "pods-get", "--verb=get", "--resource=pods", "-n", "team")
	out, err = ak.try("create", "role", "secrets-get", "--verb=get", "--resource=secrets", "-n", "team")
	if err == nil || !strings.Contains(out, "is attempting to grant RBAC permissions not currently held") || !strings.Contains(out, `Resources:["secrets"]`) {
		t.Errorf("alice grants secrets she cannot read: %v %s", err, out)
	}
	out, err = ak.try("create", "rolebinding", "bob-admin", "--clusterrole=cluster-admin", "--user=bob", "-n", "team")
	if err == nil || !strings.Contains(out, "is attempting to grant RBAC permissions not currently held") {
		t.Errorf("alice binds cluster-admin: %v %s", err, out)
	}
	out, err = ak.try("create", "rolebinding", "bob-ghost", "--role=no-such-role", "--user=bob", "-n", "team")
	if err == nil || !strings.Contains(out, "forbidden") {
		t.Errorf("alice binds a role that is not there: %v %s", err, out)
	}
	ak.run("create", "rolebinding", "bob-reads", "--role=pod-reader", "--user=bob", "-n", "team")
	within(t, "bob reading through alice's binding", time.Second, func() bool { return canI(ctx, t, bob, "list", "pods") })
	// With escalate she may write any role; with bind, bind the one named.
	admin.run("create", "role", "escalator", "--verb=escalate", "--resource=roles.rbac.authorization.k8s.io", "-n", "team")
	admin.run("create", "rolebinding", "alice-escalates", "--role=escalator", "--user=alice", "-n", "team")
	within(t, "alice may escalate", time.Second, func() bool { return canI(ctx, t, alice, "escalate", "roles.rbac.authorization.k8s.io") })
	ak.run("create", "role", "secrets-get", "--verb=get", "--resource=secrets", "-n", "team")
	admin.run("create", "role", "binder", "--verb=bind", "--resource=clusterroles.rbac.authorization.k8s.io", "--resource-name=cluster-admin", "-n", "team")
	admin.run("create", "rolebinding", "alice-binds", "--role=binder", "--user=alice", "-n", "team")
	within(t, "alice binding cluster-admin once she may bind it", 3*time.Second, func() bool {
		_, err := ak.try("create", "rolebinding", "bob-admin", "--clusterrole=cluster-admin", "--user=bob", "-n", "team")
		return err == nil
	})

	// Impersonation: refused without the verb, allowed with it.
	out, err = ak.try("get", "pods", "-n", "team", "--as=bob")
	if err == nil || !strings.Contains(out, `cannot impersonate resource "users"`) {
		t.Errorf("alice as bob without impersonate: %v %s", err, out)
	}
	if out := admin.run("auth", "can-i", "list", "pods", "-n", "team", "--as=alice"); strings.TrimSpace(out) != "yes" {
		t.Errorf("admin asking as alice: %q", out)
	}
	admin.run("create", "clusterrole", "impersonate-bob", "--verb=impersonate", "--resource=users", "--resource-name=bob")
	admin.run("create", "clusterrolebinding", "alice-impersonates-bob", "--clusterrole=impersonate-bob", "--user=alice")
	within(t, "alice may impersonate bob", time.Second, func() bool {
		_, err := ak.try("get", "pods", "-n", "team", "--as=bob")
		return err == nil
	})
	if out, err := ak.try("get", "pods", "-n", "team", "--as=carol"); err == nil {
		t.Errorf("alice impersonates carol: %s", out)
	}

	// SubjectAccessReview is for those allowed to ask about others.
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: "bob",
		ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "list", Resource: "pods", Namespace: "team"}}}
	if _, err := alice.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("alice asks about bob: %v, want forbidden", err)
	}
	got, err := ts.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	if err != nil || !got.Status.Allowed {
		t.Errorf("admin asks whether bob may list pods in team: %v %+v", err, got)
	}
}

// TestRBACBadInput: malformed roles, bindings and reviews are 422s with
// the field Kubernetes names (unknown verbs are fine, as in Kubernetes);
// a binding's role cannot be changed.
func TestRBACBadInput(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	rbac := ts.client.RbacV1()
	for _, tc := range []struct {
		name string
		err  error
		path string
	}{
		{"rule without verbs", func() error {
			_, err := rbac.Roles("default").Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "r"},
				Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}}}}, metav1.CreateOptions{})
			return err
		}(), "rules[0].verbs"},
		{"binding to a Role of another group", func() error {
			_, err := rbac.RoleBindings("default").Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "b"},
				RoleRef: rbacv1.RoleRef{APIGroup: "example.com", Kind: "Role", Name: "r"}}, metav1.CreateOptions{})
			return err
		}(), "roleRef.apiGroup"},
		{"review of both kinds", func() error {
			_, err := ts.client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
				ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "get"}, NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/", Verb: "get"}}}, metav1.CreateOptions{})
			return err
		}(), "spec.resourceAttributes"},
		{"review about nobody", func() error {
			_, err := ts.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "get"}}}, metav1.CreateOptions{})
			return err
		}(), "spec.user"},
	} {
		var status apierrors.APIStatus
		if !apierrors.IsInvalid(tc.err) || !errors.As(tc.err, &status) || !strings.Contains(status.Status().Message, tc.path) {
			t.Errorf("%s: %v, want 422 at %s", tc.name, tc.err, tc.path)
		}
	}
	if _, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "odd-verbs"},
		Rules: []rbacv1.PolicyRule{{Verbs: []string{"frobnicate"}, APIGroups: []string{"example.com"}, Resources: []string{"widgets"}}}}, metav1.CreateOptions{}); err != nil {
		t.Errorf("a rule of a verb Kubernetes does not know: %v", err)
	}
	b, err := rbac.RoleBindings("default").Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "b"},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b.RoleRef.Name = "admin"
	if _, err := rbac.RoleBindings("default").Update(ctx, b, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "cannot change roleRef") {
		t.Errorf("changing a binding's role: %v", err)
	}
	// Reviews are questions: nothing to get, list or delete.
	if code, _ := ts.as(t, "admin", "system:masters").do("GET", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", "", ""); code != 405 {
		t.Errorf("GET of reviews: %d, want 405", code)
	}
}

// TestRBACResourceNamesInFieldSelector: a Role limited to resourceNames
// lets its subject list and watch those objects by name
// (fieldSelector metadata.name=NAME, as an informer of one object asks),
// and nothing else, as Kubernetes names the request after the selector;
// aggregated API servers read kube-system/extension-apiserver-authentication
// this way with the extension-apiserver-authentication-reader Role.
func TestRBACResourceNamesInFieldSelector(t *testing.T) {
	ts := startWithTokens(t)
	ctx := context.Background()
	_, bob := tokenUser(t, ts, "bob-token")
	if _, err := ts.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"settings", "other"} {
		if _, err := ts.client.CoreV1().ConfigMaps("team").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	rbac := ts.client.RbacV1()
	if _, err := rbac.Roles("team").Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "settings-reader"},
		Rules: []rbacv1.PolicyRule{{Verbs: []string{"get", "list", "watch", "deletecollection"}, APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{"settings"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.RoleBindings("team").Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "bob-reads-settings"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "settings-reader"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "bob"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cms := bob.CoreV1().ConfigMaps("team")
	byName := metav1.ListOptions{FieldSelector: "metadata.name=settings"}
	within(t, "bob gets settings after the binding", time.Second, func() bool {
		_, err := cms.Get(ctx, "settings", metav1.GetOptions{})
		return err == nil
	})
	if l, err := cms.List(ctx, byName); err != nil || len(l.Items) != 1 || l.Items[0].Name != "settings" {
		t.Errorf("list by the allowed name: %v %v", l, err)
	}
	w, err := cms.Watch(ctx, metav1.ListOptions{FieldSelector: byName.FieldSelector, ResourceVersion: "0"})
	if err != nil {
		t.Fatalf("watch by the allowed name: %v", err)
	}
	select {
	case ev := <-w.ResultChan():
		if cm, ok := ev.Object.(*corev1.ConfigMap); !ok || cm.Name != "settings" {
			t.Errorf("watch by the allowed name: %v %#v", ev.Type, ev.Object)
		}
	case <-time.After(5 * time.Second):
		t.Error("watch by the allowed name: no event")
	}
	w.Stop()
	for _, tc := range []struct {
		opts    metav1.ListOptions
		message string
	}{
		{metav1.ListOptions{}, `configmaps is forbidden: User "bob" cannot list resource "configmaps"`},
		{metav1.ListOptions{FieldSelector: "metadata.name=other"}, `configmaps "other" is forbidden: User "bob" cannot list resource "configmaps"`},
		{metav1.ListOptions{FieldSelector: "metadata.name!=other"}, `configmaps is forbidden`},
		{metav1.ListOptions{FieldSelector: "metadata.namespace=team"}, `configmaps is forbidden`},
	} {
		if _, err := cms.List(ctx, tc.opts); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), tc.message) {
			t.Errorf("list %q: %v, want 403 %q", tc.opts.FieldSelector, err, tc.message)
		}
	}
	if _, err := cms.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=other"}); !apierrors.IsForbidden(err) {
		t.Errorf("watch of another name: %v, want 403", err)
	}
	if err := cms.DeleteCollection(ctx, metav1.DeleteOptions{}, byName); !apierrors.IsForbidden(err) {
		t.Errorf("deletecollection by the allowed name (Kubernetes does not name it): %v, want 403", err)
	}
}

// TestBootstrapPolicyReconciled: at each start the server puts back what
// is missing of Kubernetes' bootstrap policy, keeps what a user added,
// and leaves alone what is annotated autoupdate=false, as kube-apiserver.
func TestBootstrapPolicyReconciled(t *testing.T) {
	dir := t.TempDir()
	ts := startServer(t, dir)
	ctx := context.Background()
	roles, bindings := ts.client.RbacV1().ClusterRoles(), ts.client.RbacV1().ClusterRoleBindings()
	edit := func(name string, change func(*rbacv1.ClusterRole)) {
		t.Helper()
		r, err := roles.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		change(r)
		if _, err := roles.Update(ctx, r, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	extra := rbacv1.PolicyRule{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"configmaps"}}
	edit("system:discovery", func(r *rbacv1.ClusterRole) { r.Rules = nil })
	edit("system:basic-user", func(r *rbacv1.ClusterRole) { r.Rules = append(r.Rules, extra); r.Labels["team"] = "platform" })
	edit("system:public-info-viewer", func(r *rbacv1.ClusterRole) {
		r.Rules = r.Rules[:0]
		r.Annotations["rbac.authorization.kubernetes.io/autoupdate"] = "false"
	})
	if err := bindings.Delete(ctx, "cluster-admin", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	addr := ts.srv.Addr().String()
	ts.stop()
	ts = restartOn(t, dir, addr)
	roles, bindings = ts.client.RbacV1().ClusterRoles(), ts.client.RbacV1().ClusterRoleBindings()
	get := func(name string) *rbacv1.ClusterRole {
		t.Helper()
		r, err := roles.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// Put back as Kubernetes does: the missing rules broken down, one URL each.
	if r := get("system:discovery"); !slices.ContainsFunc(r.Rules, func(p rbacv1.PolicyRule) bool { return slices.Contains(p.NonResourceURLs, "/apis/*") }) {
		t.Errorf("system:discovery's rules not put back: %+v", r.Rules)
	}
	if r := get("system:basic-user"); len(r.Rules) != 3 || r.Labels["team"] != "platform" {
		t.Errorf("system:basic-user lost what the user added: %+v %v", r.Rules, r.Labels)
	}
	if r := get("system:public-info-viewer"); len(r.Rules) != 0 {
		t.Errorf("autoupdate=false role reconciled: %+v", r.Rules)
	}
	if b, err := bindings.Get(ctx, "cluster-admin", metav1.GetOptions{}); err != nil || b.Subjects[0].Name != "system:masters" {
		t.Errorf("cluster-admin binding not made again: %v %+v", err, b)
	}
}

// TestLoopsLeastPrivilege: the control loops' identity gets its role
// through RBAC, not everything: what Kubernetes' controllers hold between
// them, and none of impersonation, tokens, new Secrets, roles or
// bindings.
func TestLoopsLeastPrivilege(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	for _, tc := range []struct {
		verb, group, resource, sub string
		want                       bool
	}{
		{"create", "", "pods", "", true},
		{"create", "", "pods", "binding", true},
		{"delete", "", "secrets", "", true},
		{"update", "", "namespaces", "finalize", true},
		{"deletecollection", "apps", "deployments", "", true},
		{"escalate", "rbac.authorization.k8s.io", "clusterroles", "", true},
		{"create", "", "secrets", "", false},
		{"create", "", "serviceaccounts", "token", false},
		{"impersonate", "", "users", "", false},
		{"create", "rbac.authorization.k8s.io", "clusterrolebindings", "", false},
		{"bind", "rbac.authorization.k8s.io", "clusterroles", "", false},
		{"create", "rbac.authorization.k8s.io", "roles", "", false},
	} {
		r, err := ts.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: "system:orch-loops", Groups: []string{"system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: tc.verb, Group: tc.group, Resource: tc.resource, Subresource: tc.sub, Namespace: "default"}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if r.Status.Allowed != tc.want {
			t.Errorf("loops %s %s/%s/%s: allowed %v, want %v", tc.verb, tc.group, tc.resource, tc.sub, r.Status.Allowed, tc.want)
		}
	}
}
