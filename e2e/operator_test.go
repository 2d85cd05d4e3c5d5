//go:build e2e

package e2e_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orch-dev/orch/internal/agent/agenttest"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// operatorManifests are what an operator's install applies: its kind,
// namespace, ServiceAccount, the RBAC it needs and nothing more, and its
// Deployment.
const operatorManifests = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    additionalPrinterColumns:
    - {name: Ready, type: integer, jsonPath: .status.readyReplicas}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [image]
            properties:
              replicas: {type: integer, minimum: 0, default: 1}
              image: {type: string}
          status:
            type: object
            properties:
              readyReplicas: {type: integer}
---
apiVersion: v1
kind: Namespace
metadata: {name: widget-system}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: widget-operator, namespace: widget-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: widget-operator}
rules:
- {apiGroups: [example.com], resources: [widgets], verbs: [get, list, watch]}
- {apiGroups: [example.com], resources: [widgets/status], verbs: [get, update, patch]}
- {apiGroups: [apps], resources: [deployments], verbs: [get, list, watch, create, update, patch, delete]}
- {apiGroups: [""], resources: [events], verbs: [create, patch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: widget-operator}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: widget-operator}
subjects: [{kind: ServiceAccount, name: widget-operator, namespace: widget-system}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: leader-election, namespace: widget-system}
rules:
- {apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get, list, watch, create, update, patch, delete]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: leader-election, namespace: widget-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: leader-election}
subjects: [{kind: ServiceAccount, name: widget-operator, namespace: widget-system}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: widget-operator, namespace: widget-system}
spec:
  selector: {matchLabels: {app: widget-operator}}
  template:
    metadata: {labels: {app: widget-operator}}
    spec:
      serviceAccountName: widget-operator
      terminationGracePeriodSeconds: 0
      containers: [{name: operator, image: "operator:test", imagePullPolicy: IfNotPresent}]
`

// TestOperator runs a real operator, built with controller-runtime, as a
// pod with its own ServiceAccount and RBAC: it elects itself leader,
// reconciles a Widget into a Deployment it owns (written with server-side
// apply), reports the ready replicas in the Widget's status, follows a
// change of the Widget, and its Deployment is collected with the Widget.
func TestOperator(t *testing.T) {
	operator := moduleBinary(t, "testdata/operator")
	c := newCluster(t)
	c.images = map[string]map[string][]byte{"docker.io/library/operator:test": {"/bin/operator": operator}}
	c.imageCmds = map[string][]string{"docker.io/library/operator:test": {"/bin/operator"}}
	c.addNode("node-a", "198.18.0.61")
	agenttest.Eventually(t, "node-a Ready", func() bool {
		n, err := c.client.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
		return err == nil && agenttest.NodeReady(n)
	})
	manifests := filepath.Join(t.TempDir(), "operator.yaml")
	if err := os.WriteFile(manifests, []byte(operatorManifests), 0o600); err != nil {
		t.Fatal(err)
	}
	c.mustKubectl("", "apply", "-f", manifests)
	c.mustKubectl("", "wait", "--for=condition=established", "crd/widgets.example.com", "--timeout=30s")
	ctx := context.Background()
	deployments := c.client.AppsV1().Deployments("default")

	widget := filepath.Join(t.TempDir(), "widget.yaml")
	if err := os.WriteFile(widget, []byte("apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w1}\nspec: {replicas: 2, image: \"busybox:test\"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c.mustKubectl("", "apply", "-f", widget)
	var dep *appsv1.Deployment
	agenttest.Eventually(t, "the operator's Deployment", func() bool {
		var err error
		dep, err = deployments.Get(ctx, "w1", metav1.GetOptions{})
		return err == nil
	})
	if refs := dep.OwnerReferences; len(refs) != 1 || refs[0].Kind != "Widget" || refs[0].Controller == nil || !*refs[0].Controller {
		t.Errorf("the Deployment's owner: %+v", refs)
	}
	applied := false
	for _, e := range dep.ManagedFields {
		applied = applied || e.Manager == "widget-operator" && e.Operation == metav1.ManagedFieldsOperationApply
	}
	if !applied {
		t.Errorf("the Deployment was not server-side applied by the operator: %+v", dep.ManagedFields)
	}
	agenttest.Eventually(t, "the Widget's status says 2 ready", func() bool {
		out, _ := c.kubectl("", "get", "widget", "w1", "-o", "jsonpath={.status.readyReplicas}")
		return out == "2"
	})
	if out, _ := c.kubectl("", "get", "lease", "-n", "widget-system", "widget-operator", "-o", "jsonpath={.spec.holderIdentity}"); out == "" {
		t.Errorf("the operator holds no leader lease")
	}

	c.mustKubectl("", "patch", "widget", "w1", "--type=merge", "-p", `{"spec":{"replicas":1}}`)
	agenttest.Eventually(t, "the Deployment follows the Widget", func() bool {
		d, err := deployments.Get(ctx, "w1", metav1.GetOptions{})
		return err == nil && d.Spec.Replicas != nil && *d.Spec.Replicas == 1
	})

	c.mustKubectl("", "delete", "widget", "w1")
	agenttest.Eventually(t, "the Deployment collected with its Widget", func() bool {
		_, err := deployments.Get(ctx, "w1", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	if out, _ := c.kubectl("", "logs", "-n", "widget-system", "deployment/widget-operator"); strings.Contains(out, "forbidden") {
		t.Errorf("the operator was refused something it needs:\n%s", out)
	}
}

// moduleBinary builds the program of a module of its own (a test program
// whose dependencies must stay out of orch's module), static.
func moduleBinary(t *testing.T, dir string) []byte {
	t.Helper()
	bin := filepath.Join(t.TempDir(), filepath.Base(dir))
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", dir, err, out)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
