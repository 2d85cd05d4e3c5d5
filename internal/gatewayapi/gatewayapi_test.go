package gatewayapi

import (
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestCRDs: the embedded definitions are the standard channel's of
// Version, of the kinds orch serves and no other.
func TestCRDs(t *testing.T) {
	crds, err := CRDs()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, c := range crds {
		if c.Annotations[BundleVersionAnnotation] != Version || c.Annotations[ChannelAnnotation] != "standard" {
			t.Errorf("%s: %v", c.Name, c.Annotations)
		}
		names[c.Name] = true
	}
	for _, want := range []string{"gatewayclasses", "gateways", "httproutes", "referencegrants"} {
		if !names[want+".gateway.networking.k8s.io"] {
			t.Errorf("no %s in %v", want, names)
		}
	}
	if len(names) != 4 {
		t.Errorf("definitions %v, want the four kinds orch serves", names)
	}
}

// TestNewer: a definition of a later release is left alone, an earlier
// one (or orch's own) is orch's to update.
func TestNewer(t *testing.T) {
	for v, want := range map[string]bool{"v1.7.0": true, "v1.6.3": false, "v1.5.1": false, "v1.6.4-rc.1": true, "": true, "garbage": true} {
		crd := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{BundleVersionAnnotation: v}}}
		if got := Newer(crd); got != want {
			t.Errorf("%q: newer %v, want %v", v, got, want)
		}
	}
}
