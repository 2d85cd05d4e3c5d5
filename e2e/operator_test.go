//go:build e2e

package e2e_test

import (
	"context"
	"encoding/base64"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orch-dev/orch/internal/agent/agenttest"
	"github.com/orch-dev/orch/internal/api/pki"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// operatorManifests are what an operator's install applies: its kind,
// namespace, ServiceAccount, the RBAC it needs and nothing more, its
// Deployment, and its webhooks (kubebuilder's names and paths) with the
// Service they are called through and the certificate the Deployment
// serves them with (CA_BUNDLE, TLS_CRT and TLS_KEY, made by the test as
// cert-manager would make them).
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
            required: [image] # the mutating webhook fills it in
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
      containers:
      - name: operator
        image: "operator:test"
        imagePullPolicy: IfNotPresent
        ports: [{name: webhook, containerPort: 9443}, {name: health, containerPort: 8081}]
        readinessProbe: {httpGet: {path: /readyz, port: health}, periodSeconds: 1}
        volumeMounts: [{name: cert, mountPath: /tmp/k8s-webhook-server/serving-certs, readOnly: true}]
      volumes: [{name: cert, secret: {secretName: widget-operator-webhook-cert}}]
---
apiVersion: v1
kind: Secret
metadata: {name: widget-operator-webhook-cert, namespace: widget-system}
type: kubernetes.io/tls
data: {tls.crt: TLS_CRT, tls.key: TLS_KEY}
---
apiVersion: v1
kind: Service
metadata: {name: widget-operator-webhook, namespace: widget-system}
spec:
  selector: {app: widget-operator}
  ports: [{port: 443, targetPort: webhook}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: widget-operator}
webhooks:
- name: mwidget.kb.io
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Fail
  clientConfig:
    caBundle: CA_BUNDLE
    service: {name: widget-operator-webhook, namespace: widget-system, path: /mutate-example-com-v1-widget}
  rules: [{apiGroups: [example.com], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [widgets]}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: widget-operator}
webhooks:
- name: vwidget.kb.io
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Fail
  clientConfig:
    caBundle: CA_BUNDLE
    service: {name: widget-operator-webhook, namespace: widget-system, path: /validate-example-com-v1-widget}
  rules: [{apiGroups: [example.com], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [widgets]}]
`

// TestOperator runs a real operator, built with controller-runtime, as a
// pod with its own ServiceAccount and RBAC: it elects itself leader,
// reconciles a Widget into a Deployment it owns (written with server-side
// apply), reports the ready replicas in the Widget's status, follows a
// change of the Widget, and its Deployment is collected with the Widget.
// Its webhooks, served by the pod on a certificate the test makes and
// called by a server that is not on the pod network (through the pod's
// node), default a Widget before the CRD's schema is checked (its
// required image), refuse one of too many replicas with the webhook's
// message, and warn of one of none, as on Kubernetes.
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
	ca, err := pki.LoadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	serving, err := ca.Issue(pki.Request{CommonName: "widget-operator-webhook.widget-system.svc", Server: true,
		DNSNames: []string{"widget-operator-webhook.widget-system.svc", "widget-operator-webhook.widget-system.svc.cluster.local"}})
	if err != nil {
		t.Fatal(err)
	}
	b64 := base64.StdEncoding.EncodeToString
	manifests := filepath.Join(t.TempDir(), "operator.yaml")
	filled := strings.NewReplacer("CA_BUNDLE", b64(ca.Bundle()), "TLS_CRT", b64(serving.CertPEM), "TLS_KEY", b64(serving.KeyPEM)).Replace(operatorManifests)
	if err := os.WriteFile(manifests, []byte(filled), 0o600); err != nil {
		t.Fatal(err)
	}
	c.mustKubectl("", "apply", "-f", manifests)
	c.mustKubectl("", "wait", "--for=condition=established", "crd/widgets.example.com", "--timeout=30s")
	if out, err := c.kubectl("", "rollout", "status", "-n", "widget-system", "deployment/widget-operator", "--timeout=120s"); err != nil {
		logs, _ := c.kubectl("", "logs", "-n", "widget-system", "deployment/widget-operator", "--tail=20")
		t.Fatalf("the operator did not roll out: %v\n%s\nits log:\n%s", err, out, logs)
	}
	ctx := context.Background()
	deployments := c.client.AppsV1().Deployments("default")

	// No image: the mutating webhook gives it one before the schema,
	// which requires it, is checked. The first call may find the
	// webhook's endpoint not yet published.
	widget := filepath.Join(t.TempDir(), "widget.yaml")
	if err := os.WriteFile(widget, []byte("apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w1}\nspec: {replicas: 2}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var admitted string
	agenttest.Eventually(t, "the Widget admitted through the operator's webhooks", func() bool {
		var err error
		admitted, err = c.kubectl("", "apply", "-f", widget)
		if err != nil {
			t.Logf("kubectl apply: %v: %s", err, admitted)
		}
		return err == nil
	})
	if out := c.mustKubectl("", "get", "widget", "w1", "-o", `jsonpath={.spec.image} {.metadata.labels.example\.com/tier}`); out != "busybox:test standard" {
		t.Errorf("the Widget as the mutating webhook left it: %q", out)
	}
	tooMany := filepath.Join(t.TempDir(), "too-many.yaml")
	if err := os.WriteFile(tooMany, []byte("apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w2}\nspec: {replicas: 9}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// kubectl prints a refusal of reason Invalid from its causes, as it
	// does on Kubernetes; the API's message names the webhook.
	if out, err := c.kubectl("", "apply", "-f", tooMany); err == nil ||
		!strings.Contains(out, `The Widget "w2" is invalid: spec.replicas: Invalid value: 9: a Widget runs at most 5 replicas`) {
		t.Errorf("kubectl apply of a Widget of 9 replicas: %v\n%s", err, out)
	}
	if out, err := c.kubectl("", "create", "-f", tooMany, "-v=8"); err == nil ||
		!strings.Contains(out, `admission webhook \"vwidget.kb.io\" denied the request`) {
		t.Errorf("the refusal's message does not name the webhook: %v\n%s", err, tail(out, 5))
	}
	// pods/proxy reaches the operator's pod through its node too.
	pods, err := c.client.CoreV1().Pods("widget-system").List(ctx, metav1.ListOptions{LabelSelector: "app=widget-operator"})
	if err != nil || len(pods.Items) == 0 {
		t.Fatalf("the operator's pod: %v", err)
	}
	if out, err := c.kubectl("", "get", "--raw", "/api/v1/namespaces/widget-system/pods/"+pods.Items[0].Name+":8081/proxy/readyz"); err != nil || out != "ok" {
		t.Errorf("the operator's readyz through pods/proxy: %v %q", err, out)
	}
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

	if out := c.mustKubectl("", "patch", "widget", "w1", "--type=merge", "-p", `{"spec":{"replicas":0}}`); !strings.Contains(out, "Warning: a Widget of 0 replicas runs nothing") {
		t.Errorf("the validating webhook's warning did not reach kubectl:\n%s", out)
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
