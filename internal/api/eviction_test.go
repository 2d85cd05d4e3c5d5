package api_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api/apitest"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestEvictionAdmission: the cluster's admission sees an eviction as a
// create of pods/eviction with the Eviction as its object, as Kubernetes
// sends it: a policy guarding a pod from eviction refuses it.
func TestEvictionAdmission(t *testing.T) {
	srv := apitest.Start(t)
	ctx := context.Background()
	c := srv.Client
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: "guard"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{Operations: []admissionregistrationv1.OperationType{"CREATE"},
					Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods/eviction"}}}}}},
			Validations: []admissionregistrationv1.Validation{{Expression: "object.metadata.name != 'guarded'", Message: "this pod stays"}}}}
	if _, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: "guard"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: "guard", ValidationActions: []admissionregistrationv1.ValidationAction{"Deny"}}}
	if _, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"guarded", "free"} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{NodeName: "n1", TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
		if _, err := c.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	evict := func(name string) error {
		return c.PolicyV1().Evictions("default").Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}})
	}
	// Policies take effect once the server has read them: asked with dry
	// runs (admitted as the real one) until then.
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		err := c.PolicyV1().Evictions("default").Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: "guarded", Namespace: "default"},
			DeleteOptions: &metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}})
		if apierrors.IsInvalid(err) && strings.Contains(err.Error(), "this pod stays") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the guarded pod's eviction: %v", err)
		}
	}
	if err := evict("guarded"); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "this pod stays") {
		t.Fatalf("the guarded pod's eviction: %v", err)
	}
	if p, err := c.CoreV1().Pods("default").Get(ctx, "guarded", metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
		t.Errorf("a refused eviction touched the pod: %v", err)
	}
	if err := evict("free"); err != nil {
		t.Errorf("another pod's eviction: %v", err)
	}
}
