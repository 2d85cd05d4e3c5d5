package admission

import (
	"context"
	"testing"

	"github.com/orch-dev/orch/internal/api/resources"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
)

var (
	pods       = &resources.Resource{GroupVersionKind: resources.GVK("", "Pod"), Plural: "pods", Namespaced: true}
	nodes      = &resources.Resource{GroupVersionKind: resources.GVK("", "Node"), Plural: "nodes"}
	namespaces = &resources.Resource{GroupVersionKind: resources.GVK("", "Namespace"), Plural: "namespaces"}
)

// TestRuleMatches: rules match as Kubernetes matches them — "pods" is the
// main resource only, "pods/*" its subresources, "*/status" every status,
// "*/*" everything, and scope and operations narrow them.
func TestRuleMatches(t *testing.T) {
	rule := func(ops []admissionregistrationv1.OperationType, res []string, scope admissionregistrationv1.ScopeType) admissionregistrationv1.RuleWithOperations {
		return admissionregistrationv1.RuleWithOperations{Operations: ops,
			Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: res, Scope: ptr.To(scope)}}
	}
	create := []admissionregistrationv1.OperationType{admissionregistrationv1.Create}
	all := []admissionregistrationv1.OperationType{admissionregistrationv1.OperationAll}
	for _, tc := range []struct {
		name string
		rule admissionregistrationv1.RuleWithOperations
		a    Attributes
		want bool
	}{
		{"resource", rule(create, []string{"pods"}, "*"), Attributes{Resource: pods, Operation: Create}, true},
		{"other operation", rule(create, []string{"pods"}, "*"), Attributes{Resource: pods, Operation: Update}, false},
		{"any operation", rule(all, []string{"pods"}, "*"), Attributes{Resource: pods, Operation: Delete}, true},
		{"resource is not its subresource", rule(all, []string{"pods"}, "*"), Attributes{Resource: pods, Operation: Update, Subresource: "status"}, false},
		{"resource/*", rule(all, []string{"pods/*"}, "*"), Attributes{Resource: pods, Operation: Connect, Subresource: "exec"}, true},
		{"resource/* is not the resource", rule(all, []string{"pods/*"}, "*"), Attributes{Resource: pods, Operation: Create}, false},
		{"*/status", rule(all, []string{"*/status"}, "*"), Attributes{Resource: nodes, Operation: Update, Subresource: "status"}, true},
		{"* is main resources", rule(all, []string{"*"}, "*"), Attributes{Resource: nodes, Operation: Update, Subresource: "status"}, false},
		{"*/*", rule(all, []string{"*/*"}, "*"), Attributes{Resource: pods, Operation: Connect, Subresource: "attach"}, true},
		{"named subresource", rule(all, []string{"pods/attach"}, "*"), Attributes{Resource: pods, Operation: Connect, Subresource: "attach"}, true},
		{"cluster scope", rule(all, []string{"*"}, admissionregistrationv1.ClusterScope), Attributes{Resource: pods, Operation: Create}, false},
		{"namespaced scope", rule(all, []string{"*"}, admissionregistrationv1.NamespacedScope), Attributes{Resource: nodes, Operation: Create}, false},
		{"other group", admissionregistrationv1.RuleWithOperations{Operations: all, Rule: admissionregistrationv1.Rule{APIGroups: []string{"apps"},
			APIVersions: []string{"*"}, Resources: []string{"*"}}}, Attributes{Resource: pods, Operation: Create}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := RuleMatches(tc.rule, &tc.a); got != tc.want {
				t.Fatalf("RuleMatches = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestSelectorsMatch: a namespace selector reads the request's
// namespace's labels, a Namespace's own, and never skips other
// cluster-scoped kinds; an object selector matches the new or the old
// object.
func TestSelectorsMatch(t *testing.T) {
	nsLabels := func(_ context.Context, name string) (map[string]string, error) {
		return map[string]string{"env": name}, nil
	}
	prod := labels.SelectorFromSet(labels.Set{"env": "prod"})
	obj := func(l map[string]string) *corev1.Pod { return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: l}} }
	for _, tc := range []struct {
		name          string
		a             Attributes
		nsSel, objSel labels.Selector
		want          bool
	}{
		{"namespace labels", Attributes{Resource: pods, Namespace: "prod", Object: obj(nil)}, prod, labels.Everything(), true},
		{"other namespace", Attributes{Resource: pods, Namespace: "dev", Object: obj(nil)}, prod, labels.Everything(), false},
		{"a namespace by its own labels", Attributes{Resource: namespaces, Name: "x", Object: &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"env": "prod"}}}}, prod, labels.Everything(), true},
		{"cluster-scoped kinds always", Attributes{Resource: nodes, Name: "n", Object: obj(nil)}, prod, labels.Everything(), true},
		{"object selector on the new object", Attributes{Resource: pods, Namespace: "prod", Object: obj(map[string]string{"env": "prod"})}, labels.Everything(), prod, true},
		{"object selector on the old object", Attributes{Resource: pods, Namespace: "prod", Object: obj(nil), OldObject: obj(map[string]string{"env": "prod"})}, labels.Everything(), prod, true},
		{"object selector on neither", Attributes{Resource: pods, Namespace: "prod", Object: obj(nil)}, labels.Everything(), prod, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := SelectorsMatch(context.Background(), &tc.a, tc.nsSel, tc.objSel, nsLabels)
			if err != nil || got != tc.want {
				t.Fatalf("SelectorsMatch = %v, %v, want %v", got, err, tc.want)
			}
		})
	}
}
