package gateway

import (
	"context"
	"io"
	"log/slog"
	"maps"
	"testing"

	"github.com/orch-dev/orch/internal/api/apitest"
	"github.com/orch-dev/orch/internal/gatewayapi"
	"github.com/orch-dev/orch/internal/kube"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestInstall: on a real API server, the definitions missing are
// created and the class made; one of an older release is upgraded; one
// of a newer release or of the experimental channel is left as the user
// installed it (orch never downgrades them); installing again changes
// nothing.
func TestInstall(t *testing.T) {
	srv := apitest.Start(t)
	ctx := context.Background()
	client, err := kube.NewForConfig(srv.Admin)
	if err != nil {
		t.Fatal(err)
	}
	crds, err := gatewayapi.CRDs()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*apiextensionsv1.CustomResourceDefinition{}
	for _, c := range crds {
		byName[c.Name] = c
	}
	defs := client.CustomResourceDefinitions()
	preinstall := func(name, version, channel string) {
		c := byName[name].DeepCopy()
		c.Annotations[gatewayapi.BundleVersionAnnotation], c.Annotations[gatewayapi.ChannelAnnotation] = version, channel
		if _, err := defs.Create(ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	preinstall("httproutes.gateway.networking.k8s.io", "v1.1.0", "standard")
	preinstall("gateways.gateway.networking.k8s.io", "v9.0.0", "standard")
	preinstall("referencegrants.gateway.networking.k8s.io", gatewayapi.Version, "experimental")

	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := Install(ctx, client, true, log); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][2]string{
		"httproutes.gateway.networking.k8s.io":      {gatewayapi.Version, "standard"},
		"gateways.gateway.networking.k8s.io":        {"v9.0.0", "standard"},
		"referencegrants.gateway.networking.k8s.io": {gatewayapi.Version, "experimental"},
		"gatewayclasses.gateway.networking.k8s.io":  {gatewayapi.Version, "standard"},
	} {
		c, err := defs.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := [2]string{c.Annotations[gatewayapi.BundleVersionAnnotation], c.Annotations[gatewayapi.ChannelAnnotation]}; got != want {
			t.Errorf("%s: %v, want %v", name, got, want)
		}
	}
	gc, err := client.GatewayClasses().Get(ctx, gatewayapi.ClassName, metav1.GetOptions{})
	if err != nil || gc.Spec.ControllerName != gatewayapi.ControllerName {
		t.Fatalf("the class: %+v %v", gc, err)
	}
	before, err := defs.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := Install(ctx, client, true, log); err != nil {
		t.Fatal(err)
	}
	after, err := defs.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	versions := func(l *apiextensionsv1.CustomResourceDefinitionList) map[string]string {
		out := map[string]string{}
		for _, c := range l.Items {
			out[c.Name] = c.ResourceVersion
		}
		return out
	}
	if b, a := versions(before), versions(after); len(b) != len(crds) || !maps.Equal(b, a) {
		t.Errorf("installing again wrote: %v -> %v", b, a)
	}
}
