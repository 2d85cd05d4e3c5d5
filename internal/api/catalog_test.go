package api_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orch-dev/orch/internal/api/apitest"
	"github.com/orch-dev/orch/internal/api/resources"
	corev1 "k8s.io/api/core/v1"
)

// podTemplates describes a kind as a CustomResourceDefinition describes
// one at run time (the test takes the built-in PodTemplate away first).
func podTemplates() *resources.Resource {
	return resources.Described[corev1.PodTemplate, corev1.PodTemplateList](&resources.Resource{
		GroupVersionKind: resources.GVK("", "PodTemplate"), Plural: "podtemplates", Singular: "podtemplate",
		Namespaced: true, StorageKey: "podtemplates",
	})
}

const podTemplateManifest = `apiVersion: v1
kind: PodTemplate
metadata: {name: tmpl}
template:
  metadata: {labels: {app: tmpl}}
  spec:
    containers: [{name: app, image: busybox:1.36}]
`

// TestCatalogChangesWhileServing adds a resource to a running server and
// takes it away again: stock kubectl finds it through discovery and
// OpenAPI, creates and lists it, then is told it is gone, with no restart.
func TestCatalogChangesWhileServing(t *testing.T) {
	srv := apitest.Start(t)
	k := apitest.NewKubectl(t, srv.Kubeconfig)
	srv.Unserve(corev1.SchemeGroupVersion.WithResource("podtemplates"))
	if out, err := k.Try("get", "podtemplates"); err == nil || !strings.Contains(out, `the server doesn't have a resource type "podtemplates"`) {
		t.Fatalf("before: want kubectl's unknown-type error, got %v: %s", err, out)
	}
	// The OpenAPI documents are built now, for the catalog as it is.
	k.Run("explain", "pods")
	if err := srv.Serve(podTemplates()); err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(podTemplates()); err == nil {
		t.Fatal("serving podtemplates twice was accepted")
	}
	manifest := filepath.Join(t.TempDir(), "tmpl.yaml")
	if err := os.WriteFile(manifest, []byte(podTemplateManifest), 0o600); err != nil {
		t.Fatal(err)
	}
	k.Run("create", "-f", manifest)
	if out := k.Run("get", "podtemplates"); !strings.Contains(out, "tmpl") {
		t.Fatalf("kubectl get podtemplates:\n%s", out)
	}
	if out := k.Run("api-resources", "--namespaced=true"); !strings.Contains(out, "podtemplates") {
		t.Fatalf("discovery does not list podtemplates:\n%s", out)
	}
	// kubectl explain reads /openapi/v3, rebuilt for the new catalog.
	if out := k.Run("explain", "podtemplate.template"); !strings.Contains(out, "PodTemplateSpec") {
		t.Fatalf("kubectl explain podtemplate.template:\n%s", out)
	}
	srv.Unserve(corev1.SchemeGroupVersion.WithResource("podtemplates"))
	if out, err := k.Try("get", "podtemplates"); err == nil || !strings.Contains(out, "podtemplates") {
		t.Fatalf("after: want an error naming podtemplates, got %v: %s", err, out)
	}
}
