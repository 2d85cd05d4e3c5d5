package api_test

import (
	"encoding/base64"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api/apitest"
)

// TestHelm4 installs, upgrades and uninstalls with stock Helm 4, which
// writes with server-side apply, a chart that ships its own kind (a
// CustomResourceDefinition in crds/) and an object of it: Helm waits for
// the kind to be served, applies, and its changes merge as on Kubernetes.
func TestHelm4(t *testing.T) {
	if testing.Short() {
		t.Skip("builds helm")
	}
	helm := apitest.Helm4Binary(t)
	ts := startServer(t, "")
	k := newKubectl(t, ts)
	chart, err := filepath.Abs("testdata/charts/widgets")
	if err != nil {
		t.Fatal(err)
	}
	run := helmRunner(t, helm, ts.kubeconfig)
	if out := run("version", "--short"); !strings.HasPrefix(out, "v4.") {
		t.Fatalf("not Helm 4: %s", out)
	}
	run("install", "rel", chart, "--wait", "--timeout", "1m")
	if out := k.run("get", "gadget", "rel-gadget", "-o", "jsonpath={.spec.size} {.spec.replicas}"); out != "small 1" {
		t.Errorf("after install: %q", out)
	}
	// Helm 4 applies server-side: its fields are its own, by Apply.
	if out := k.run("get", "gadget", "rel-gadget", "--show-managed-fields", "-o", "jsonpath={.metadata.managedFields[*].manager} {.metadata.managedFields[*].operation}"); !strings.Contains(out, "helm") || !strings.Contains(out, "Apply") {
		t.Errorf("managers after install: %q", out)
	}

	run("upgrade", "rel", chart, "--set", "size=large", "--set", "replicas=3", "--wait", "--timeout", "1m")
	if out := k.run("get", "gadget", "rel-gadget", "-o", "jsonpath={.spec.size} {.spec.replicas}"); out != "large 3" {
		t.Errorf("after upgrade: %q", out)
	}
	if out := k.run("get", "configmap", "rel-settings", "-o", "jsonpath={.data.size}"); out != "large" {
		t.Errorf("the chart's ConfigMap after upgrade: %q", out)
	}

	run("uninstall", "rel", "--wait", "--timeout", "1m")
	if out, err := k.try("get", "gadget", "rel-gadget"); err == nil || !strings.Contains(out, "NotFound") {
		t.Errorf("after uninstall: %v %s", err, out)
	}
	// Helm leaves the kinds it installed from crds/ in place.
	k.run("get", "crd", "gadgets.example.com")
}

// TestHelmChartWithAdmission installs, upgrades and uninstalls with stock
// Helm 4 a chart that ships a validating webhook and a validating
// admission policy, as cert-manager's, ingress controllers' and policy
// engines' charts do: both take effect once installed and go with it.
func TestHelmChartWithAdmission(t *testing.T) {
	if testing.Short() {
		t.Skip("builds helm")
	}
	helm := apitest.Helm4Binary(t)
	ts := startServer(t, "")
	k := newKubectl(t, ts)
	hook := startWebhook(t, "127.0.0.1:0")
	chart, err := filepath.Abs("testdata/charts/guard")
	if err != nil {
		t.Fatal(err)
	}
	run := helmRunner(t, helm, ts.kubeconfig)
	k.run("create", "namespace", "guarded")
	k.run("label", "namespace", "guarded", "guarded=yes")
	run("install", "rel", chart, "--set", "url="+hook.url+"/deny", "--set", "caBundle="+base64.StdEncoding.EncodeToString(hook.ca), "--wait", "--timeout", "1m")
	refused := func(want string, args ...string) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			out, err := k.try(args...)
			if err != nil && strings.Contains(out, want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("kubectl %s: %v, want a refusal with %q:\n%s", strings.Join(args, " "), err, want, out)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	refused(`admission webhook "deny.rel.guard.example.com" denied the request: the key deny is not allowed`,
		"-n", "guarded", "create", "configmap", "c1", "--from-literal=deny=1", "--dry-run=server")
	refused("ValidatingAdmissionPolicy 'rel-no-forbidden-key' with binding 'rel-no-forbidden-key' denied request: the key secret is not allowed in a ConfigMap",
		"create", "configmap", "c2", "--from-literal=secret=1", "--dry-run=server")

	run("upgrade", "rel", chart, "--set", "url="+hook.url+"/deny", "--set", "caBundle="+base64.StdEncoding.EncodeToString(hook.ca), "--set", "forbiddenKey=token", "--wait", "--timeout", "1m")
	refused("the key token is not allowed", "create", "configmap", "c3", "--from-literal=token=1", "--dry-run=server")

	run("uninstall", "rel", "--wait", "--timeout", "1m")
	deadline := time.Now().Add(15 * time.Second)
	for {
		out1, err1 := k.try("-n", "guarded", "create", "configmap", "c1", "--from-literal=deny=1", "--dry-run=server")
		out2, err2 := k.try("create", "configmap", "c3", "--from-literal=token=1", "--dry-run=server")
		if err1 == nil && err2 == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still refused after uninstall:\n%s\n%s", out1, out2)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// helmRunner runs stock Helm against kubeconfig with a home of its own,
// failing the test when Helm fails.
func helmRunner(t *testing.T, helm, kubeconfig string) func(args ...string) string {
	home := t.TempDir()
	return func(args ...string) string {
		t.Helper()
		cmd := exec.Command(helm, args...)
		cmd.Env = apitest.HelmEnv(home, kubeconfig)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
}
