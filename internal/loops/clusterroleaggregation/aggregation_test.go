package clusterroleaggregation

import (
	"context"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/loops/controller"
	"github.com/orch-dev/orch/internal/loops/controllertest"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var rolesGVR = schema.GroupVersionResource{Group: rbacv1.GroupName, Version: "v1", Resource: "clusterroles"}

func labelled(name string, labels map[string]string, rules ...rbacv1.PolicyRule) *rbacv1.ClusterRole {
	return &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Rules: rules}
}

func aggregating(name, label string) *rbacv1.ClusterRole {
	return &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, AggregationRule: &rbacv1.AggregationRule{
		ClusterRoleSelectors: []metav1.LabelSelector{{MatchLabels: map[string]string{label: "true"}}}}}
}

func read(resource string) rbacv1.PolicyRule {
	return rbacv1.PolicyRule{Verbs: []string{"get", "list", "watch"}, APIGroups: []string{""}, Resources: []string{resource}}
}

const toView, toEdit = "rbac.authorization.k8s.io/aggregate-to-view", "rbac.authorization.k8s.io/aggregate-to-edit"

func start(t *testing.T, objs ...runtime.Object) (*controllertest.Fake, *Controller) {
	f := controllertest.New(t, objs...)
	c, err := New(f.Client, f.Informers, controller.Env{}.WithDefaults())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.queue.ShutDown)
	f.Start()
	return f, c
}

// eventually polls cond for up to 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func rulesOf(t *testing.T, f *controllertest.Fake, name string) []rbacv1.PolicyRule {
	t.Helper()
	return f.Get(rolesGVR, "", name).(*rbacv1.ClusterRole).Rules
}

// TestAggregation: an aggregated role holds the rules of the roles its
// selectors match, in their names' order and each rule once, not its
// own; and follows them as they change, as Kubernetes' controller does.
func TestAggregation(t *testing.T) {
	f, c := start(t, aggregating("view", toView),
		labelled("b-pods", map[string]string{toView: "true"}, read("pods"), read("services")),
		labelled("a-maps", map[string]string{toView: "true"}, read("configmaps"), read("pods")),
		labelled("secrets", nil, read("secrets")))
	ctx := context.Background()
	if err := c.sync(ctx, "view"); err != nil {
		t.Fatal(err)
	}
	got := rulesOf(t, f, "view")
	if len(got) != 3 || got[0].Resources[0] != "configmaps" || got[1].Resources[0] != "pods" || got[2].Resources[0] != "services" {
		t.Fatalf("view's rules: %+v, want configmaps, pods, services", got)
	}
	// A role labelled later adds its rules; one unlabelled takes them away.
	secrets := labelled("secrets", map[string]string{toView: "true"}, read("secrets"))
	if _, err := f.Client.ClusterRoles().Update(ctx, secrets, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "secrets in the informer", func() bool {
		r, err := c.roles.Get("secrets")
		return err == nil && r.Labels[toView] == "true"
	})
	if err := c.sync(ctx, "view"); err != nil {
		t.Fatal(err)
	}
	if got := rulesOf(t, f, "view"); len(got) != 4 {
		t.Fatalf("after labelling secrets: %d rules, want 4", len(got))
	}
	if err := f.Client.ClusterRoles().Delete(ctx, "b-pods", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b-pods gone from the informer", func() bool { _, err := c.roles.Get("b-pods"); return err != nil })
	if err := c.sync(ctx, "view"); err != nil {
		t.Fatal(err)
	}
	if got := rulesOf(t, f, "view"); len(got) != 3 {
		t.Fatalf("after deleting b-pods: %+v, want configmaps, pods, secrets", got)
	}
}

// TestChained: edit is aggregated into admin through its label, as
// Kubernetes' bootstrap roles are; the loop settles admin once edit has
// its rules.
func TestChained(t *testing.T) {
	edit := aggregating("edit", toEdit)
	edit.Labels = map[string]string{"rbac.authorization.k8s.io/aggregate-to-admin": "true"}
	f, c := start(t, aggregating("admin", "rbac.authorization.k8s.io/aggregate-to-admin"), edit,
		labelled("system:aggregate-to-edit", map[string]string{toEdit: "true"}, read("secrets")))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx, 1); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	eventually(t, "admin to gather edit's rules", func() bool {
		r, ok := f.Get(rolesGVR, "", "admin").(*rbacv1.ClusterRole)
		return ok && len(r.Rules) == 1 && r.Rules[0].Resources[0] == "secrets"
	})
}
