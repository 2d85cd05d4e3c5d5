package api_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api/apitest"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

const replicaPolicies = `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: max-replicas}
spec:
  failurePolicy: Fail
  paramKind: {apiVersion: v1, kind: ConfigMap}
  matchConstraints:
    resourceRules:
    - apiGroups: [apps]
      apiVersions: [v1]
      operations: [CREATE, UPDATE]
      resources: [deployments]
  variables:
  - name: limit
    expression: "int(params.data.maxReplicas)"
  validations:
  - expression: "object.spec.replicas <= variables.limit"
    messageExpression: "'replicas must be at most ' + string(variables.limit)"
    reason: Forbidden
  - expression: "!has(object.metadata.labels) || !('forbidden' in object.metadata.labels)"
---
apiVersion: v1
kind: ConfigMap
metadata: {name: replica-limit, namespace: default}
data: {maxReplicas: "3"}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: max-replicas-default}
spec:
  policyName: max-replicas
  validationActions: [Deny]
  paramRef: {name: replica-limit, namespace: default, parameterNotFoundAction: Deny}
  matchResources:
    namespaceSelector:
      matchLabels: {kubernetes.io/metadata.name: default}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: named-images}
spec:
  matchConstraints:
    resourceRules:
    - apiGroups: [apps]
      apiVersions: [v1]
      operations: [CREATE]
      resources: [deployments]
  validations:
  - expression: "object.spec.template.spec.containers.all(c, c.image.contains(':'))"
    message: "images must carry a tag"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: named-images-warn}
spec:
  policyName: named-images
  validationActions: [Warn, Audit]
`

// TestValidatingAdmissionPolicies drives policies as cluster admins use
// them, with stock kubectl: a policy with a ConfigMap param, variables and
// a messageExpression denying, a Warn binding warning, a binding without
// its param denying, and bad policies refused at their paths.
func TestValidatingAdmissionPolicies(t *testing.T) {
	srv := apitest.Start(t)
	ctx := context.Background()
	c := srv.Client
	kubectl := apitest.NewKubectl(t, srv.Kubeconfig)
	f := filepath.Join(t.TempDir(), "policies.yaml")
	write(t, f, replicaPolicies)
	kubectl.Run("apply", "-f", f)

	// Policies take effect once the server has read them.
	deadline := time.Now().Add(15 * time.Second)
	for {
		out, err := kubectl.Try("create", "deployment", "big", "--image=busybox:1", "--replicas=5", "--dry-run=server")
		if err != nil && strings.Contains(out, "ValidatingAdmissionPolicy 'max-replicas' with binding 'max-replicas-default' denied request: replicas must be at most 3") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the policy did not deny: %v\n%s", err, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := c.AppsV1().Deployments("default").Get(ctx, "big", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a denied deployment was stored: %v", err)
	}
	t.Run("status says the policy was read", func(t *testing.T) {
		deadline := time.Now().Add(10 * time.Second)
		for {
			p, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, "max-replicas", metav1.GetOptions{})
			if err == nil && p.Status.ObservedGeneration == p.Generation && p.Status.TypeChecking != nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("status: %+v (%v)", p.Status, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	t.Run("type checking against the matched kinds' schemas", func(t *testing.T) {
		p := &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: "confused"},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
				MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionregistrationv1.RuleWithOperations{Operations: []admissionregistrationv1.OperationType{"CREATE"},
						Rule: admissionregistrationv1.Rule{APIGroups: []string{"apps"}, APIVersions: []string{"v1"}, Resources: []string{"deployments"}}}}}},
				Validations: []admissionregistrationv1.Validation{
					{Expression: "object.spec.replicas > '1'", MessageExpression: "'wants more than ' + object.spec.replicas"},
					{Expression: "object.spec.replicas > 1"},
				}}}
		if _, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			got, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, "confused", metav1.GetOptions{})
			if err == nil && got.Status.TypeChecking != nil {
				w := got.Status.TypeChecking.ExpressionWarnings
				if len(w) != 2 || w[0].FieldRef != "spec.validations[0].expression" || !strings.Contains(w[0].Warning, "found no matching overload for '_>_' applied to '(int, string)'") ||
					w[1].FieldRef != "spec.validations[0].messageExpression" || !strings.Contains(w[1].Warning, "found no matching overload for '_+_' applied to '(string, int)'") {
					t.Fatalf("warnings: %+v", w)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("not type checked: %v %v", got, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	t.Run("reason sets the code", func(t *testing.T) {
		d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "big"}, Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](5),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "big"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "big"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox:1"}}}}}}
		if _, err := c.AppsV1().Deployments("default").Create(ctx, d, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
			t.Fatalf("create: %v, want the validation's reason Forbidden", err)
		}
	})
	t.Run("allowed, and warned by the Warn binding", func(t *testing.T) {
		out := kubectl.Run("create", "deployment", "small", "--image=busybox", "--replicas=2")
		if !strings.Contains(out, "Validation failed for ValidatingAdmissionPolicy 'named-images' with binding 'named-images-warn': images must carry a tag") {
			t.Fatalf("no warning:\n%s", out)
		}
	})
	t.Run("default message names the expression", func(t *testing.T) {
		kubectl.Run("label", "deployment", "small", "ok=yes")
		out, err := kubectl.Try("label", "deployment", "small", "forbidden=yes")
		if err == nil || !strings.Contains(out, "failed expression: !has(object.metadata.labels) || !('forbidden' in object.metadata.labels)") {
			t.Fatalf("kubectl label: %v\n%s", err, out)
		}
	})
	t.Run("the param changes the limit", func(t *testing.T) {
		kubectl.Run("patch", "configmap", "replica-limit", "-p", `{"data":{"maxReplicas":"10"}}`)
		// (The scale subresource is not deployments: the policy does not see it.)
		kubectl.Run("patch", "deployment", "small", "-p", `{"spec":{"replicas":8}}`)
	})
	t.Run("a missing param denies", func(t *testing.T) {
		kubectl.Run("delete", "configmap", "replica-limit")
		out, err := kubectl.Try("patch", "deployment", "small", "-p", `{"spec":{"replicas":1}}`)
		if err == nil || !strings.Contains(out, "failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction") {
			t.Fatalf("kubectl patch: %v\n%s", err, out)
		}
	})
	t.Run("other namespaces are not bound", func(t *testing.T) {
		kubectl.Run("create", "namespace", "free")
		kubectl.Run("-n", "free", "create", "deployment", "big", "--image=busybox:1", "--replicas=9")
	})
	t.Run("bad policies are refused at their paths", func(t *testing.T) {
		for _, tc := range []struct{ name, edit, want string }{
			{"does not compile", `object.spec.replicas <=`, "spec.validations[0].expression"},
			{"not a bool", `object.spec.replicas`, "spec.validations[0].expression"},
			{"params without paramKind", `object.spec.replicas <= params.max`, "spec.validations[0].expression"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				p := &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: "bad"},
					Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
						MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
							RuleWithOperations: admissionregistrationv1.RuleWithOperations{Operations: []admissionregistrationv1.OperationType{"CREATE"},
								Rule: admissionregistrationv1.Rule{APIGroups: []string{"apps"}, APIVersions: []string{"v1"}, Resources: []string{"deployments"}}}}}},
						Validations: []admissionregistrationv1.Validation{{Expression: tc.edit}}}}
				_, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, p, metav1.CreateOptions{})
				if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("create: %v, want invalid %s", err, tc.want)
				}
			})
		}
		b := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: "bad"},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: "max-replicas",
				ValidationActions: []admissionregistrationv1.ValidationAction{"Deny", "Warn"}}}
		if _, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, b, metav1.CreateOptions{}); !apierrors.IsInvalid(err) ||
			!strings.Contains(err.Error(), "spec.validationActions") {
			t.Fatalf("binding with Deny and Warn: %v", err)
		}
	})
	t.Run("a binding of a missing policy binds nothing", func(t *testing.T) {
		kubectl.Run("delete", "validatingadmissionpolicybinding", "max-replicas-default")
		b := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: "dangling"},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: "no-such-policy", ValidationActions: []admissionregistrationv1.ValidationAction{"Deny"}}}
		if _, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(15 * time.Second)
		for {
			if _, err := kubectl.Try("create", "deployment", "huge", "--image=busybox:1", "--replicas=50", "--dry-run=server"); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("still denied after the binding was deleted")
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
}
