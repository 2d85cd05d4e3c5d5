package api_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api/apitest"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const mutatingPolicies = `apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata: {name: label-configmaps}
spec:
  matchConstraints:
    resourceRules:
    - apiGroups: [""]
      apiVersions: [v1]
      operations: [CREATE]
      resources: [configmaps]
  matchConditions:
  - name: not-system
    expression: "!object.metadata.name.startsWith('kube-')"
  mutations:
  - patchType: ApplyConfiguration
    applyConfiguration:
      expression: >
        Object{metadata: Object.metadata{labels: {"mutated-by": "policy"}}}
  - patchType: JSONPatch
    jsonPatch:
      expression: >
        [JSONPatch{op: "add", path: "/data/stamp", value: "from-" + object.metadata.name}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata: {name: label-configmaps}
spec:
  policyName: label-configmaps
  matchResources:
    namespaceSelector:
      matchLabels: {mutate: "yes"}
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata: {name: default-replicas}
spec:
  matchConstraints:
    resourceRules:
    - apiGroups: [apps]
      apiVersions: [v1]
      operations: [CREATE]
      resources: [deployments]
  mutations:
  - patchType: ApplyConfiguration
    applyConfiguration:
      expression: >
        Object{spec: Object.spec{template: Object.spec.template{spec: Object.spec.template.spec{
          containers: object.spec.template.spec.containers.map(c, Object.spec.template.spec.containers{name: c.name, imagePullPolicy: "IfNotPresent"})}}}}
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata: {name: default-replicas}
spec:
  policyName: default-replicas
`

// TestMutatingAdmissionPolicies: apply configurations and JSON patches in
// CEL change objects as they are created, as on Kubernetes 1.37, and bad
// policies are refused at their paths.
func TestMutatingAdmissionPolicies(t *testing.T) {
	srv := apitest.Start(t)
	ctx := context.Background()
	c := srv.Client
	kubectl := apitest.NewKubectl(t, srv.Kubeconfig)
	kubectl.Run("create", "namespace", "mutated")
	kubectl.Run("label", "namespace", "mutated", "mutate=yes")
	f := filepath.Join(t.TempDir(), "policies.yaml")
	write(t, f, mutatingPolicies)
	kubectl.Run("apply", "-f", f)

	deadline := time.Now().Add(15 * time.Second)
	var cm *corev1.ConfigMap
	for {
		var err error
		cm, err = c.CoreV1().ConfigMaps("mutated").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings"}, Data: map[string]string{"a": "b"}},
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			t.Fatal(err)
		}
		if cm.Labels["mutated-by"] == "policy" || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	kubectl.Run("-n", "mutated", "create", "configmap", "settings", "--from-literal=a=b")
	cm, err := c.CoreV1().ConfigMaps("mutated").Get(ctx, "settings", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cm.Labels["mutated-by"] != "policy" || cm.Data["stamp"] != "from-settings" || cm.Data["a"] != "b" {
		t.Fatalf("mutated configmap: labels %v data %v", cm.Labels, cm.Data)
	}
	t.Run("match conditions and bindings pick the objects", func(t *testing.T) {
		kubectl.Run("-n", "mutated", "create", "configmap", "kube-skip", "--from-literal=a=b")
		kubectl.Run("create", "configmap", "elsewhere", "--from-literal=a=b")
		for ns, name := range map[string]string{"mutated": "kube-skip", "default": "elsewhere"} {
			got, err := c.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil || got.Labels["mutated-by"] != "" {
				t.Fatalf("%s/%s: %v %v", ns, name, got.Labels, err)
			}
		}
	})
	t.Run("apply configuration over a list merged by key", func(t *testing.T) {
		kubectl.Run("create", "deployment", "web", "--image=busybox:latest")
		out := kubectl.Run("get", "deployment", "web", "-o", "jsonpath={.spec.template.spec.containers[0].imagePullPolicy} {.spec.template.spec.containers[0].image}")
		if out != "IfNotPresent busybox:latest" {
			t.Fatalf("container after mutation: %q", out)
		}
	})
	t.Run("bad policies are refused at their paths", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			mut  admissionregistrationv1.Mutation
			want string
		}{
			{"does not compile", admissionregistrationv1.Mutation{PatchType: admissionregistrationv1.PatchTypeApplyConfiguration,
				ApplyConfiguration: &admissionregistrationv1.ApplyConfiguration{Expression: "Object{"}}, "spec.mutations[0].applyConfiguration.expression"},
			{"not a patch", admissionregistrationv1.Mutation{PatchType: admissionregistrationv1.PatchTypeJSONPatch,
				JSONPatch: &admissionregistrationv1.JSONPatch{Expression: "'a string'"}}, "spec.mutations[0].jsonPatch.expression"},
			{"no expression", admissionregistrationv1.Mutation{PatchType: admissionregistrationv1.PatchTypeJSONPatch}, "spec.mutations[0].jsonPatch.expression"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				p := &admissionregistrationv1.MutatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: "bad"},
					Spec: admissionregistrationv1.MutatingAdmissionPolicySpec{
						MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
							RuleWithOperations: admissionregistrationv1.RuleWithOperations{Operations: []admissionregistrationv1.OperationType{"CREATE"},
								Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}}}}}},
						Mutations: []admissionregistrationv1.Mutation{tc.mut}}}
				_, err := c.AdmissionregistrationV1().MutatingAdmissionPolicies().Create(ctx, p, metav1.CreateOptions{})
				if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("create: %v, want invalid %s", err, tc.want)
				}
			})
		}
	})
}
