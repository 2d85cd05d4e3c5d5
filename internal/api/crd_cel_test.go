package api_test

import (
	"path/filepath"
	"strings"
	"testing"
)

// gatesCRD carries CEL rules as current CRDs (Gateway API's among them)
// do: a cross-field rule, a messageExpression, a reason and fieldPath, a
// transition rule, and rules using Kubernetes' CEL libraries.
const gatesCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: gates.example.com}
spec:
  group: example.com
  scope: Namespaced
  names: {plural: gates, singular: gate, kind: Gate}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            x-kubernetes-validations:
            - rule: "self.minReplicas <= self.replicas"
              message: "minReplicas must not exceed replicas"
            - rule: "!has(self.url) || isURL(self.url) && url(self.url).getScheme() == 'https'"
              messageExpression: "'url must be https, not ' + self.url"
              reason: FieldValueForbidden
              fieldPath: ".url"
            - rule: "!has(self.memory) || quantity(self.memory).isLessThan(quantity('2Gi'))"
              message: "memory must be under 2Gi"
            properties:
              replicas: {type: integer}
              minReplicas: {type: integer}
              url: {type: string, maxLength: 256}
              memory: {type: string, maxLength: 32}
              cidr:
                type: string
                maxLength: 64
                x-kubernetes-validations:
                - rule: "isCIDR(self) && cidr(self).prefixLength() >= 16"
                  message: "cidr must be a /16 or smaller"
              mode:
                type: string
                maxLength: 16
                x-kubernetes-validations:
                - rule: "self == oldSelf"
                  message: "mode is immutable"
`

// TestCustomResourceCELRules: a definition's x-kubernetes-validations are
// evaluated on create and update as Kubernetes evaluates them, and rules
// that do not compile or cost too much refuse the definition.
func TestCustomResourceCELRules(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kubectl")
	}
	ts := startServer(t, "")
	k := newKubectl(t, ts)
	dir := t.TempDir()
	crd, gate := filepath.Join(dir, "crd.yaml"), filepath.Join(dir, "gate.yaml")
	write(t, crd, gatesCRD)
	if out := k.run("apply", "-f", crd); strings.Contains(out, "Warning") {
		t.Errorf("the rules are evaluated: no warning expected:\n%s", out)
	}
	k.run("wait", "--for", "condition=established", "--timeout=10s", "crd/gates.example.com")
	manifest := func(spec string) string {
		return "apiVersion: example.com/v1\nkind: Gate\nmetadata: {name: g1}\nspec: " + spec + "\n"
	}
	write(t, gate, manifest(`{replicas: 3, minReplicas: 1, url: "https://example.com/x", memory: 1Gi, cidr: 10.1.0.0/16, mode: fast}`))
	k.run("apply", "-f", gate)

	for _, tc := range []struct{ name, spec, want string }{
		{"cross-field rule", `{replicas: 1, minReplicas: 2, mode: fast}`, "spec: Invalid value: minReplicas must not exceed replicas"},
		{"messageExpression, reason and fieldPath", `{replicas: 1, minReplicas: 1, url: "http://example.com", mode: fast}`, "spec.url: Forbidden: url must be https, not http://example.com"},
		{"quantity library", `{replicas: 1, minReplicas: 1, memory: 3Gi, mode: fast}`, "memory must be under 2Gi"},
		{"cidr library", `{replicas: 1, minReplicas: 1, cidr: 10.0.0.0/8, mode: fast}`, `spec.cidr: Invalid value: "10.0.0.0/8": cidr must be a /16 or smaller`},
		{"transition rule", `{replicas: 3, minReplicas: 1, mode: slow}`, `spec.mode: Invalid value: "slow": mode is immutable`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			write(t, gate, manifest(tc.spec))
			out, err := k.try("apply", "-f", gate)
			if err == nil || !strings.Contains(out, tc.want) {
				t.Fatalf("kubectl apply: %v, want %q in:\n%s", err, tc.want, out)
			}
		})
	}
	// The transition rule lets a create through: there is no old value.
	write(t, gate, strings.Replace(manifest(`{replicas: 1, minReplicas: 1, mode: slow}`), "g1", "g2", 1))
	k.run("apply", "-f", gate)

	t.Run("bad rules refuse the definition", func(t *testing.T) {
		for _, tc := range []struct{ name, rule, want string }{
			{"does not compile", `self.nosuchfield == 1`, "compilation failed"},
			{"wrong type", `self.replicas`, "compilation failed"},
			{"too expensive", `self.items.all(x, self.items.all(y, self.items.all(z, x + y + z != '')))`, "estimated rule cost exceeds budget"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				bad := strings.NewReplacer("gates", "bads", "Gate", "Bad", "gate", "bad").Replace(gatesCRD)
				bad = strings.Replace(bad, `"self.minReplicas <= self.replicas"`, `"`+tc.rule+`"`, 1)
				bad = strings.Replace(bad, "              replicas: {type: integer}", "              replicas: {type: integer}\n              items: {type: array, items: {type: string}}", 1)
				f := filepath.Join(dir, "bad.yaml")
				write(t, f, bad)
				out, err := k.try("apply", "-f", f)
				if err == nil || !strings.Contains(out, tc.want) || !strings.Contains(out, "x-kubernetes-validations[0].rule") {
					t.Fatalf("kubectl apply: %v, want %q at the rule's path in:\n%s", err, tc.want, out)
				}
			})
		}
	})
}
