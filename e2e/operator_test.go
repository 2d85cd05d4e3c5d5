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
	"github.com/orch-dev/orch/internal/api/apitest"
	"github.com/orch-dev/orch/internal/api/pki"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// operatorChart ships testdata/operator as operators ship: its CRD, RBAC,
// Deployment, and its webhooks (kubebuilder's names and paths) with the
// Service they are called through and their serving certificate, given
// or made by the chart.
const operatorChart = "testdata/charts/widget-operator"

// operatorCluster is a server that is not on the pod network
// (--disable-agent) and one node holding the operator's image.
func operatorCluster(t *testing.T, nodeIP string) *cluster {
	operator := moduleBinary(t, "testdata/operator")
	c := newCluster(t)
	c.images = map[string]map[string][]byte{"docker.io/library/operator:test": {"/bin/operator": operator}}
	c.imageCmds = map[string][]string{"docker.io/library/operator:test": {"/bin/operator"}}
	c.addNode("node-a", nodeIP)
	agenttest.Eventually(t, "node-a Ready", func() bool {
		n, err := c.client.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
		return err == nil && agenttest.NodeReady(n)
	})
	return c
}

// helm runs stock Helm 4 against the cluster, with a home of its own.
func (c *cluster) helm(args ...string) string {
	c.t.Helper()
	cmd := exec.Command(apitest.Helm4Binary(c.t), args...)
	cmd.Env = apitest.HelmEnv(c.t.TempDir(), c.kubeconfig)
	out, err := cmd.CombinedOutput()
	if err != nil {
		c.t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// writeFile writes data to a file of the test's and returns its path.
func writeFile(t *testing.T, name, data string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// checkWidgetWebhooks: the operator's webhooks, served by its pod and
// called by a server that reaches the pod through its node, default a
// Widget before the CRD's schema is checked (its required image) and
// refuse one of too many replicas with the webhook's message, as on
// Kubernetes. It leaves Widget w1 (2 replicas) created.
func checkWidgetWebhooks(t *testing.T, c *cluster) {
	t.Helper()
	widget := writeFile(t, "widget.yaml", "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w1}\nspec: {replicas: 2}\n")
	// The first call may find the webhook's endpoint not yet published.
	agenttest.Eventually(t, "the Widget admitted through the operator's webhooks", func() bool {
		out, err := c.kubectl("", "apply", "-f", widget)
		if err != nil {
			t.Logf("kubectl apply: %v: %s", err, out)
		}
		return err == nil
	})
	if out := c.mustKubectl("", "get", "widget", "w1", "-o", `jsonpath={.spec.image} {.metadata.labels.example\.com/tier}`); out != "busybox:test standard" {
		t.Errorf("the Widget as the mutating webhook left it: %q", out)
	}
	tooMany := writeFile(t, "too-many.yaml", "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w2}\nspec: {replicas: 9}\n")
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
}

// TestOperator runs a real operator, built with controller-runtime, as a
// pod with its own ServiceAccount and RBAC, installed as GitOps tools
// install one (its chart rendered, applied with kubectl, its webhooks'
// certificate made by the test as cert-manager would): it elects itself
// leader, reconciles a Widget into a Deployment it owns (written with
// server-side apply), reports the ready replicas in the Widget's status,
// follows a change of the Widget, and its Deployment is collected with
// the Widget. Its webhooks default and refuse Widgets (checkWidgetWebhooks)
// and warn of one of no replicas, and pods/proxy reaches its pod through
// the pod's node.
func TestOperator(t *testing.T) {
	c := operatorCluster(t, "198.18.0.61")
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
	rendered := c.helm("template", "widget-operator", operatorChart, "--namespace", "widget-system", "--include-crds",
		"--set", "webhook.caBundle="+b64(ca.Bundle()), "--set", "webhook.tlsCrt="+b64(serving.CertPEM), "--set", "webhook.tlsKey="+b64(serving.KeyPEM))
	c.mustKubectl("", "create", "namespace", "widget-system")
	c.mustKubectl("", "apply", "-f", writeFile(t, "operator.yaml", rendered))
	c.mustKubectl("", "wait", "--for=condition=established", "crd/widgets.example.com", "--timeout=30s")
	if out, err := c.kubectl("", "rollout", "status", "-n", "widget-system", "deployment/widget-operator", "--timeout=120s"); err != nil {
		logs, _ := c.kubectl("", "logs", "-n", "widget-system", "deployment/widget-operator", "--tail=20")
		t.Fatalf("the operator did not roll out: %v\n%s\nits log:\n%s", err, out, logs)
	}
	checkWidgetWebhooks(t, c)
	ctx := context.Background()
	deployments := c.client.AppsV1().Deployments("default")

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

// TestHelmChartShipsWebhooks installs the operator's chart with stock
// Helm 4, the chart making the webhooks' certificate itself (genCA, as
// many charts do): `helm install --wait` returns once the webhooks
// serve, they default and refuse Widgets, and `helm uninstall` takes
// them away (the CRD stays, as Helm leaves crds/), so that a Widget of
// too many replicas is then accepted and one without an image is refused
// by the CRD's schema alone.
func TestHelmChartShipsWebhooks(t *testing.T) {
	c := operatorCluster(t, "198.18.0.62")
	c.helm("install", "widgets", operatorChart, "--namespace", "widget-system", "--create-namespace", "--wait", "--timeout", "3m")
	checkWidgetWebhooks(t, c)
	c.helm("uninstall", "widgets", "--namespace", "widget-system", "--wait", "--timeout", "1m")
	tooMany := writeFile(t, "too-many.yaml", "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w3}\nspec: {replicas: 9, image: busybox:test}\n")
	agenttest.Eventually(t, "a Widget of 9 replicas accepted once the webhooks are gone", func() bool {
		_, err := c.kubectl("", "apply", "-f", tooMany)
		return err == nil
	})
	noImage := writeFile(t, "no-image.yaml", "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w4}\nspec: {replicas: 1}\n")
	if out, err := c.kubectl("", "apply", "-f", noImage); err == nil || !strings.Contains(out, "spec.image: Required value") {
		t.Errorf("a Widget without its image, no webhook: %v\n%s", err, out)
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
