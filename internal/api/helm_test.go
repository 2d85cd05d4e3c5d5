package api_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

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
	home := t.TempDir()
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(helm, args...)
		cmd.Env = apitest.HelmEnv(home, ts.kubeconfig)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
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
