package api_test

import (
	"context"
	"encoding/json"
	"testing"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
)

// TestAggregatedDiscovery: /api and /apis answer the aggregated discovery
// document (apidiscovery.k8s.io/v2) to a client asking for it, as
// kube-apiserver 1.30+ does (kubectl and client-go then need one request,
// not one per group version): every resource with its scope, kind and
// subresources, custom resources once their definition is established;
// and the older documents to a client that does not ask.
func TestAggregatedDiscovery(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "gadgets.example.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{Group: "example.com", Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "gadgets", Kind: "Gadget"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object"}}}}},
	}
	if err := createCRD(ctx, ts.config, crd); err != nil {
		t.Fatal(err)
	}
	waitCRDCondition(t, ts.config, "gadgets.example.com", apiextensionsv1.Established)
	rc := discovery.NewDiscoveryClientForConfigOrDie(ts.config).RESTClient()
	get := func(path string) *apidiscoveryv2.APIGroupDiscoveryList {
		t.Helper()
		res := rc.Get().AbsPath(path).SetHeader("Accept", "application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json").Do(ctx)
		var ct string
		raw, err := res.ContentType(&ct).Raw()
		if err != nil {
			t.Fatal(err)
		}
		if ct != "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList" {
			t.Fatalf("%s: content type %q", path, ct)
		}
		var list apidiscoveryv2.APIGroupDiscoveryList
		if err := json.Unmarshal(raw, &list); err != nil {
			t.Fatal(err)
		}
		return &list
	}
	find := func(list *apidiscoveryv2.APIGroupDiscoveryList, group, version, resource string) *apidiscoveryv2.APIResourceDiscovery {
		for _, g := range list.Items {
			for _, v := range g.Versions {
				for i, r := range v.Resources {
					if g.Name == group && v.Version == version && r.Resource == resource {
						return &v.Resources[i]
					}
				}
			}
		}
		return nil
	}
	legacy := get("/api")
	pods := find(legacy, "", "v1", "pods")
	if pods == nil || pods.Scope != apidiscoveryv2.ScopeNamespace || pods.ResponseKind.Kind != "Pod" || pods.SingularResource != "pod" {
		t.Fatalf("/api: pods %+v", pods)
	}
	groups := get("/apis")
	deploy := find(groups, "apps", "v1", "deployments")
	if deploy == nil || deploy.ShortNames[0] != "deploy" {
		t.Fatalf("/apis: deployments %+v", deploy)
	}
	scale := false
	for _, sub := range deploy.Subresources {
		scale = scale || sub.Subresource == "scale" && sub.ResponseKind.Group == "autoscaling" && sub.ResponseKind.Kind == "Scale"
	}
	if !scale {
		t.Fatalf("deployments' subresources: %+v", deploy.Subresources)
	}
	if g := find(groups, "example.com", "v1", "gadgets"); g == nil || g.Scope != apidiscoveryv2.ScopeNamespace || g.ResponseKind.Kind != "Gadget" {
		t.Fatalf("the custom resource: %+v", g)
	}
	if find(groups, "", "v1", "pods") != nil || find(legacy, "apps", "v1", "deployments") != nil {
		t.Fatal("the core group and the named groups are not apart")
	}
	// A client that asks for the older form gets it, as client-go's
	// discovery falls back to it.
	var plain metav1.APIGroupList
	raw, err := rc.Get().AbsPath("/apis").SetHeader("Accept", "application/json").Do(ctx).Raw()
	if err != nil || json.Unmarshal(raw, &plain) != nil || len(plain.Groups) == 0 {
		t.Fatalf("the older /apis: %s %v", raw, err)
	}
	resources, err := discovery.NewDiscoveryClientForConfigOrDie(ts.config).ServerPreferredResources()
	if err != nil || len(resources) == 0 {
		t.Fatalf("client-go's discovery: %d groups, %v", len(resources), err)
	}
}
