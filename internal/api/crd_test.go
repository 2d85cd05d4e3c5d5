package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

var crdsResource = apiextensionsv1.SchemeGroupVersion.WithResource("customresourcedefinitions")

// createCRD creates a definition through the dynamic client, as a
// program that defines its own kinds does.
func createCRD(ctx context.Context, cfg *rest.Config, crd *apiextensionsv1.CustomResourceDefinition) error {
	crd.APIVersion, crd.Kind = "apiextensions.k8s.io/v1", "CustomResourceDefinition"
	content, err := runtime.DefaultUnstructuredConverter.ToUnstructured(crd)
	if err != nil {
		return err
	}
	_, err = dynamic.NewForConfigOrDie(cfg).Resource(crdsResource).Create(ctx, &unstructured.Unstructured{Object: content}, metav1.CreateOptions{})
	return err
}

// waitCRDCondition waits for a definition to have the condition, and
// returns it.
func waitCRDCondition(t *testing.T, cfg *rest.Config, name string, cond apiextensionsv1.CustomResourceDefinitionConditionType) apiextensionsv1.CustomResourceDefinitionCondition {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		u, err := dynamic.NewForConfigOrDie(cfg).Resource(crdsResource).Get(context.Background(), name, metav1.GetOptions{})
		if err == nil {
			var crd apiextensionsv1.CustomResourceDefinition
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &crd); err != nil {
				t.Fatal(err)
			}
			for _, c := range crd.Status.Conditions {
				if c.Type == cond {
					return c
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s never had a %s condition", name, cond)
	return apiextensionsv1.CustomResourceDefinitionCondition{}
}

// widgetsCRD defines Widgets in two versions (v1beta1 served, v1 stored),
// with a schema that has enums, bounds, required fields and defaults, the
// status and scale subresources and printer columns.
const widgetsCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wd], categories: [all]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources:
      status: {}
      scale: {specReplicasPath: .spec.replicas, statusReplicasPath: .status.replicas}
    additionalPrinterColumns:
    - {name: Size, type: string, jsonPath: .spec.size}
    - {name: Replicas, type: integer, jsonPath: .spec.replicas}
    schema: &schema
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [size]
            properties:
              size: {type: string, enum: [small, large], description: How big the widget is.}
              replicas: {type: integer, minimum: 0, default: 1}
              color: {type: string, default: blue, pattern: "^[a-z]+$"}
              ports:
                type: array
                x-kubernetes-list-type: map
                x-kubernetes-list-map-keys: [name]
                items:
                  type: object
                  required: [name]
                  properties:
                    name: {type: string}
                    port: {type: integer}
          status:
            type: object
            properties:
              replicas: {type: integer}
  - name: v1beta1
    served: true
    storage: false
    schema: *schema
`

const widgetManifest = `apiVersion: example.com/v1
kind: Widget
metadata: {name: w1}
spec:
  size: small
  ports: [{name: http, port: 80}]
`

// TestCustomResourcesWithKubectl drives a CustomResourceDefinition's whole
// life with stock kubectl: defined and usable at once (discovery, explain,
// get with printer columns), custom resources validated, pruned and
// defaulted by the schema with Kubernetes' field paths, the scale and
// status subresources, both versions reading the same objects, and
// deletion taking the custom resources with the definition.
func TestCustomResourcesWithKubectl(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kubectl")
	}
	ts := startServer(t, "")
	k := newKubectl(t, ts)
	dir := t.TempDir()
	crd, widget := filepath.Join(dir, "crd.yaml"), filepath.Join(dir, "widget.yaml")
	write(t, crd, widgetsCRD)
	write(t, widget, widgetManifest)
	ctx := context.Background()

	start := time.Now()
	k.run("apply", "-f", crd)
	k.run("wait", "--for", "condition=established", "--timeout=10s", "crd/widgets.example.com")
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("established after %s", took)
	}
	if out := k.run("apply", "-f", widget); !strings.Contains(out, "widget.example.com/w1 created") {
		t.Fatalf("apply said %q", out)
	}
	// The definition's columns, without Age (Kubernetes adds it only to a
	// definition without columns).
	wantLines(t, k.run("get", "widgets"), `^NAME\s+SIZE\s+REPLICAS$`, `^w1\s+small\s+1$`)
	wantLines(t, k.run("api-resources", "--api-group=example.com"), `^widgets\s+wd\s+example.com/v1\s+true\s+Widget$`)
	if out := k.run("explain", "widget.spec.size"); !strings.Contains(out, "How big the widget is.") || !strings.Contains(out, "large") {
		t.Errorf("explain:\n%s", out)
	}
	if out := k.run("get", "all"); !strings.Contains(out, "widget.example.com/w1") {
		t.Errorf("the all category does not hold widgets:\n%s", out)
	}

	t.Run("defaults", func(t *testing.T) {
		k := k.For(t)
		out := k.run("get", "wd", "w1", "-o", "jsonpath={.spec.replicas} {.spec.color}")
		if out != "1 blue" {
			t.Errorf("defaults: %q", out)
		}
	})

	t.Run("validation with Kubernetes' paths", func(t *testing.T) {
		k := k.For(t)
		bad := filepath.Join(dir, "bad.yaml")
		write(t, bad, "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: bad}\nspec:\n  size: huge\n  replicas: -1\n  color: Red\n")
		out, err := k.try("apply", "-f", bad)
		for _, want := range []string{`spec.size: Unsupported value: "huge": supported values: "small", "large"`,
			"spec.replicas: Invalid value: -1: spec.replicas in body should be greater than or equal to 0",
			`spec.color: Invalid value: "Red": spec.color in body should match '^[a-z]+$'`} {
			if err == nil || !strings.Contains(out, want) {
				t.Errorf("want %q in: %v %s", want, err, out)
			}
		}
		write(t, bad, "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: bad}\nspec: {replicas: 2}\n")
		if out, err := k.try("apply", "-f", bad); err == nil || !strings.Contains(out, "spec.size: Required value") {
			t.Errorf("required: %v %s", err, out)
		}
		write(t, bad, "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: bad}\nspec:\n  size: small\n  ports: [{name: a}, {name: a}]\n")
		if out, err := k.try("apply", "-f", bad); err == nil || !strings.Contains(out, `spec.ports[1]: Duplicate value: {"name":"a"}`) {
			t.Errorf("list map keys: %v %s", err, out)
		}
	})

	t.Run("unknown fields", func(t *testing.T) {
		k := k.For(t)
		extra := filepath.Join(dir, "extra.yaml")
		write(t, extra, "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: extra}\nspec: {size: large, shape: round}\n")
		// kubectl validates strictly by default: refused, as in Kubernetes.
		if out, err := k.try("apply", "-f", extra); err == nil || !strings.Contains(out, `unknown field "spec.shape"`) {
			t.Errorf("strict: %v %s", err, out)
		}
		// Warned, the field is pruned.
		out := k.run("apply", "--validate=warn", "-f", extra)
		if !strings.Contains(out, `unknown field "spec.shape"`) {
			t.Errorf("warn said %q", out)
		}
		if out := k.run("get", "wd", "extra", "-o", "jsonpath={.spec}"); strings.Contains(out, "shape") {
			t.Errorf("not pruned: %s", out)
		}
	})

	t.Run("scale and status", func(t *testing.T) {
		k := k.For(t)
		k.run("scale", "widget", "w1", "--replicas=3")
		if out := k.run("get", "wd", "w1", "-o", "jsonpath={.spec.replicas} {.metadata.generation}"); out != "3 2" {
			t.Errorf("after scale: replicas and generation %q", out)
		}
		// Status goes through its subresource only.
		k.run("patch", "widget", "w1", "--type=merge", "-p", `{"status":{"replicas":3}}`)
		if out := k.run("get", "wd", "w1", "-o", "jsonpath={.status}"); out != "" {
			t.Errorf("status written through the main resource: %s", out)
		}
		k.run("patch", "widget", "w1", "--subresource=status", "--type=merge", "-p", `{"status":{"replicas":3}}`)
		if out := k.run("get", "wd", "w1", "-o", "jsonpath={.status.replicas} {.metadata.generation}"); out != "3 2" {
			t.Errorf("after a status patch: %q", out)
		}
		if out := k.run("get", "--raw", "/apis/example.com/v1/namespaces/default/widgets/w1/scale"); !strings.Contains(out, `"replicas":3`) || !strings.Contains(out, `"kind":"Scale"`) {
			t.Errorf("scale: %s", out)
		}
	})

	t.Run("patches", func(t *testing.T) {
		k := k.For(t)
		out, err := k.try("patch", "widget", "w1", "--type=strategic", "-p", `{"spec":{"color":"red"}}`)
		if err == nil || !strings.Contains(out, "application/strategic-merge-patch+json is not supported") {
			t.Errorf("strategic merge patch: %v %s", err, out)
		}
		k.run("patch", "widget", "w1", "--type=json", "-p", `[{"op":"replace","path":"/spec/color","value":"green"}]`)
		if out := k.run("get", "wd", "w1", "-o", "jsonpath={.spec.color}"); out != "green" {
			t.Errorf("after a JSON patch: %q", out)
		}
	})

	t.Run("both versions read the same objects", func(t *testing.T) {
		dyn := dynamic.NewForConfigOrDie(ts.config)
		beta := schema.GroupVersionResource{Group: "example.com", Version: "v1beta1", Resource: "widgets"}
		got, err := dyn.Resource(beta).Namespace("default").Get(ctx, "w1", metav1.GetOptions{})
		if err != nil || got.GetAPIVersion() != "example.com/v1beta1" {
			t.Fatalf("w1 through v1beta1: %v %v", err, got)
		}
		obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "example.com/v1beta1", "kind": "Widget",
			"metadata": map[string]any{"name": "beta"}, "spec": map[string]any{"size": "large"}}}
		if _, err := dyn.Resource(beta).Namespace("default").Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		v1 := beta
		v1.Version = "v1"
		got, err = dyn.Resource(v1).Namespace("default").Get(ctx, "beta", metav1.GetOptions{})
		if err != nil || got.GetAPIVersion() != "example.com/v1" {
			t.Fatalf("beta through v1: %v %v", err, got)
		}
	})

	t.Run("server-side apply", func(t *testing.T) {
		k := k.For(t)
		ssa := filepath.Join(dir, "ssa.yaml")
		write(t, ssa, "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: applied}\nspec:\n  size: small\n  ports: [{name: http, port: 80}]\n")
		k.run("apply", "--server-side", "-f", ssa)
		// Another manager adds a port: ports are a map keyed by name.
		other := filepath.Join(dir, "other.yaml")
		write(t, other, "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: applied}\nspec:\n  ports: [{name: https, port: 443}]\n")
		k.run("apply", "--server-side", "--field-manager=other", "-f", other)
		if out := k.run("get", "wd", "applied", "-o", "jsonpath={.spec.ports[*].name}"); out != "http https" {
			t.Errorf("ports after two managers: %q", out)
		}
		write(t, other, "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: applied}\nspec:\n  size: large\n")
		if out, err := k.try("apply", "--server-side", "--field-manager=other", "-f", other); err == nil || !strings.Contains(out, `conflict with "kubectl": .spec.size`) {
			t.Errorf("conflict: %v %s", err, out)
		}
	})

	t.Run("a huge custom resource is refused", func(t *testing.T) {
		huge := `{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"huge"},"spec":{"size":"small","color":"` + strings.Repeat("a", 4<<20) + `"}}`
		code, body, _ := ts.rawRequest(t, "POST", "/apis/example.com/v1/namespaces/default/widgets", "application/json", huge)
		if code != http.StatusRequestEntityTooLarge {
			t.Errorf("a 4 MiB custom resource: %d %.200s", code, body)
		}
	})

	t.Run("protobuf is refused", func(t *testing.T) {
		code, body, _ := ts.rawRequest(t, "POST", "/apis/example.com/v1/namespaces/default/widgets", "application/vnd.kubernetes.protobuf", "k8s\x00")
		if code != http.StatusUnsupportedMediaType {
			t.Errorf("protobuf body: %d %s", code, body)
		}
	})

	// Deleting the definition takes its custom resources, then itself.
	k.run("delete", "crd", "widgets.example.com", "--timeout=30s")
	// (kubectl's discovery cache may still know the kind: then the server
	// says it is not found.)
	if out, err := k.try("get", "widgets"); err == nil || !strings.Contains(out, `the server doesn't have a resource type "widgets"`) &&
		!strings.Contains(out, "the server could not find the requested resource") {
		t.Errorf("after delete: %v %s", err, out)
	}
	// Defined again, none of the old objects comes back.
	k.run("apply", "-f", crd)
	k.run("wait", "--for", "condition=established", "--timeout=10s", "crd/widgets.example.com")
	if out := k.run("get", "widgets", "-A"); !strings.Contains(out, "No resources found") {
		t.Errorf("objects outlived their definition:\n%s", out)
	}
}

// TestBadCustomResourceDefinitions: definitions Kubernetes refuses are
// refused with its field paths; two definitions holding the same names do
// not both get served.
func TestBadCustomResourceDefinitions(t *testing.T) {
	ts := startServer(t, "")
	base := func() *apiextensionsv1.CustomResourceDefinition {
		return &apiextensionsv1.CustomResourceDefinition{
			ObjectMeta: metav1.ObjectMeta{Name: "gadgets.example.com"},
			Spec: apiextensionsv1.CustomResourceDefinitionSpec{Group: "example.com", Scope: apiextensionsv1.NamespaceScoped,
				Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "gadgets", Kind: "Gadget"},
				Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
					Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object",
						Properties: map[string]apiextensionsv1.JSONSchemaProps{"spec": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
							"size": {Type: "string"}}}}}}}}},
		}
	}
	for _, tc := range []struct {
		name   string
		change func(*apiextensionsv1.CustomResourceDefinition)
		want   string
	}{
		{"name not plural.group", func(c *apiextensionsv1.CustomResourceDefinition) { c.Name = "gadget.example.com" },
			`metadata.name: Invalid value: "gadget.example.com": must be spec.names.plural+"."+spec.group`},
		{"not structural", func(c *apiextensionsv1.CustomResourceDefinition) {
			c.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"] = apiextensionsv1.JSONSchemaProps{Properties: map[string]apiextensionsv1.JSONSchemaProps{"size": {Type: "string"}}}
		}, "spec.versions[0].schema.openAPIV3Schema.properties[spec].type: Required value: must not be empty for specified object fields"},
		{"root not an object", func(c *apiextensionsv1.CustomResourceDefinition) {
			c.Spec.Versions[0].Schema.OpenAPIV3Schema.Type = "string"
		},
			"spec.versions[0].schema.openAPIV3Schema.type"},
		{"no schema", func(c *apiextensionsv1.CustomResourceDefinition) { c.Spec.Versions[0].Schema = nil },
			"spec.versions[0].schema.openAPIV3Schema: Required value: schemas are required"},
		{"two storage versions", func(c *apiextensionsv1.CustomResourceDefinition) {
			v2 := c.Spec.Versions[0]
			v2.Name = "v2"
			c.Spec.Versions = append(c.Spec.Versions, v2)
		}, "must have exactly one version marked as storage version"},
		{"a built-in group", func(c *apiextensionsv1.CustomResourceDefinition) { c.Spec.Group, c.Name = "apps", "gadgets.apps" },
			`spec.group: Invalid value: "apps"`},
		{"webhook conversion without a webhook", func(c *apiextensionsv1.CustomResourceDefinition) {
			c.Spec.Conversion = &apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.WebhookConverter}
		}, `spec.conversion.webhook: Required value`},
		{"conversion webhook over http", func(c *apiextensionsv1.CustomResourceDefinition) {
			c.Spec.Conversion = &apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.WebhookConverter, Webhook: &apiextensionsv1.WebhookConversion{
				ClientConfig: &apiextensionsv1.WebhookClientConfig{URL: ptr.To("http://example.com/convert")}, ConversionReviewVersions: []string{"v1"}}}
		}, `spec.conversion.webhook.clientConfig.url: Invalid value`},
		{"unknown conversion review versions", func(c *apiextensionsv1.CustomResourceDefinition) {
			c.Spec.Conversion = &apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.WebhookConverter, Webhook: &apiextensionsv1.WebhookConversion{
				ClientConfig: &apiextensionsv1.WebhookClientConfig{URL: ptr.To("https://example.com/convert")}, ConversionReviewVersions: []string{"v9"}}}
		}, `spec.conversion.webhook.conversionReviewVersions: Invalid value`},
		{"unknown conversion strategy", func(c *apiextensionsv1.CustomResourceDefinition) {
			c.Spec.Conversion = &apiextensionsv1.CustomResourceConversion{Strategy: "Magic"}
		}, `spec.conversion.strategy: Unsupported value: "Magic"`},
		{"bad printer column", func(c *apiextensionsv1.CustomResourceDefinition) {
			c.Spec.Versions[0].AdditionalPrinterColumns = []apiextensionsv1.CustomResourceColumnDefinition{{Name: "X", Type: "money", JSONPath: ".spec[[["}}
		}, "spec.versions[0].additionalPrinterColumns[0].type: Unsupported value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			crd := base()
			tc.change(crd)
			err := createCRD(context.Background(), ts.config, crd)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want %q, got %v", tc.want, err)
			}
		})
	}

	t.Run("names held by another definition", func(t *testing.T) {
		ctx := context.Background()
		if err := createCRD(ctx, ts.config, base()); err != nil {
			t.Fatal(err)
		}
		rival := base()
		rival.Name, rival.Spec.Names.Plural, rival.Spec.Names.ShortNames = "gizmos.example.com", "gizmos", []string{"gadget"}
		if err := createCRD(ctx, ts.config, rival); err != nil {
			t.Fatal(err)
		}
		cond := waitCRDCondition(t, ts.config, "gizmos.example.com", apiextensionsv1.NamesAccepted)
		if cond.Status != apiextensionsv1.ConditionFalse || cond.Reason != "NameConflict" || !strings.Contains(cond.Message, `"gadget" is already in use`) {
			t.Errorf("the rival's NamesAccepted: %+v", cond)
		}
	})
}

// TestDefinitionDeletionWaitsForFinalizers: a definition being deleted
// refuses new custom resources, deletes the ones it has, and waits for
// their finalizers before it goes, as Kubernetes' does.
func TestDefinitionDeletionWaitsForFinalizers(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	dyn := dynamic.NewForConfigOrDie(ts.config)
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "tools.example.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{Group: "example.com", Scope: apiextensionsv1.ClusterScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "tools", Kind: "Tool"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object"}}}}},
	}
	if err := createCRD(ctx, ts.config, crd); err != nil {
		t.Fatal(err)
	}
	if c := waitCRDCondition(t, ts.config, "tools.example.com", apiextensionsv1.Established); c.Status != apiextensionsv1.ConditionTrue {
		t.Fatalf("established: %+v", c)
	}
	tools := dyn.Resource(schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "tools"})
	tool := func(name string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "example.com/v1", "kind": "Tool",
			"metadata": map[string]any{"name": name, "finalizers": []any{"example.com/hold"}}}}
	}
	if _, err := tools.Create(ctx, tool("hammer"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := dyn.Resource(crdsResource).Delete(ctx, "tools.example.com", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := tools.Get(ctx, "hammer", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.GetDeletionTimestamp() != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the custom resource was never deleted")
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, err := tools.Create(ctx, tool("saw"), metav1.CreateOptions{})
	if !apierrors.IsMethodNotSupported(err) || !strings.Contains(err.Error(), "create not allowed while custom resource definition is terminating") {
		t.Errorf("a create while terminating: %v", err)
	}
	time.Sleep(1500 * time.Millisecond)
	if _, err := dyn.Resource(crdsResource).Get(ctx, "tools.example.com", metav1.GetOptions{}); err != nil {
		t.Fatalf("the definition went before its custom resource's finalizer: %v", err)
	}
	if _, err := tools.Patch(ctx, "hammer", types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		_, err := dyn.Resource(crdsResource).Get(ctx, "tools.example.com", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the definition never went: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestCustomResourceApplyFieldValidation: a server-side apply of a custom
// resource with fields its schema does not declare is refused with 400
// under fieldValidation=Strict, naming them as Kubernetes' typed apply
// does, before any other check of the object; under Warn it goes through
// with a warning per field.
func TestCustomResourceApplyFieldValidation(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "boxes.example.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{Group: "example.com", Scope: apiextensionsv1.ClusterScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "boxes", Kind: "Box"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{"spec": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"size":     {Type: "integer"},
						"template": {Type: "object", XEmbeddedResource: true, XPreserveUnknownFields: ptr.To(true)},
					}}}}}}}},
	}
	if err := createCRD(ctx, ts.config, crd); err != nil {
		t.Fatal(err)
	}
	waitCRDCondition(t, ts.config, "boxes.example.com", apiextensionsv1.Established)
	rc := discovery.NewDiscoveryClientForConfigOrDie(ts.config).RESTClient()
	body := []byte("apiVersion: example.com/v1\nkind: Box\nmetadata:\n  name: b1\n  unknownMeta: x\nspec:\n  size: 1\n  color: red\n  template:\n    apiversion: v1\n    kind: Sub\n")
	apply := func(validation string) ([]byte, []string, error) {
		var warnings []string
		res := rc.Patch(types.ApplyPatchType).AbsPath("/apis/example.com/v1/boxes/b1").Param("fieldManager", "test").Param("fieldValidation", validation).Body(body).Do(ctx)
		for _, w := range res.Warnings() {
			warnings = append(warnings, w.Text)
		}
		raw, err := res.Raw()
		return raw, warnings, err
	}
	raw, _, err := apply("Strict")
	if !apierrors.IsBadRequest(err) || !strings.Contains(string(raw), ".metadata.unknownMeta: field not declared in schema") ||
		!strings.Contains(string(raw), ".spec.color: field not declared in schema") {
		t.Fatalf("strict apply: %v %s", err, raw)
	}
	fixed := strings.Replace(string(body), "apiversion", "apiVersion", 1)
	body = []byte(fixed)
	raw, warnings, err := apply("Warn")
	if err != nil {
		t.Logf("%s", raw)
	}
	if err != nil || !slices.Contains(warnings, `unknown field "spec.color"`) {
		t.Fatalf("apply with warnings: %v %v", warnings, err)
	}
}

// TestCustomResourceOpenAPIV2: /openapi/v2 publishes custom resources as
// Kubernetes does: a definition keeping unknown fields at its root as a
// bare object (kubectl would refuse fields it does not list), others
// through Kubernetes' v2 conversion (no nullable, no unknown-field
// properties) with apiVersion, kind and metadata, metadata described as
// "Standard object's metadata" (kubectl explain shows it).
func TestCustomResourceOpenAPIV2(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	open := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: "opens.example.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{Group: "example.com", Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "opens", Kind: "Open"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: ptr.To(true)}}}}}}
	typed := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: "typeds.example.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{Group: "example.com", Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "typeds", Kind: "Typed"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{"spec": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"free": {Type: "object", XPreserveUnknownFields: ptr.To(true), Properties: map[string]apiextensionsv1.JSONSchemaProps{"a": {Type: "string"}}},
						"size": {Type: "integer", Nullable: true},
					}}}}}}}}}
	for _, crd := range []*apiextensionsv1.CustomResourceDefinition{open, typed} {
		if err := createCRD(ctx, ts.config, crd); err != nil {
			t.Fatal(err)
		}
		waitCRDCondition(t, ts.config, crd.Name, apiextensionsv1.Established)
	}
	raw, err := discovery.NewDiscoveryClientForConfigOrDie(ts.config).RESTClient().Get().AbsPath("/openapi/v2").SetHeader("Accept", "application/json").Do(ctx).Raw()
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Definitions map[string]map[string]any `json:"definitions"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	o := doc.Definitions["com.example.v1.Open"]
	if o["type"] != "object" || o["properties"] != nil || o["x-kubernetes-preserve-unknown-fields"] != nil {
		t.Fatalf("the open kind: %v", o)
	}
	d := doc.Definitions["com.example.v1.Typed"]
	props, _ := d["properties"].(map[string]any)
	meta, _ := props["metadata"].(map[string]any)
	if meta == nil || !strings.HasPrefix(fmt.Sprint(meta["description"]), "Standard object's metadata") || props["apiVersion"] == nil {
		t.Fatalf("the typed kind's metadata: %v", props)
	}
	spec := props["spec"].(map[string]any)["properties"].(map[string]any)
	if free := spec["free"].(map[string]any); free["properties"] != nil || free["type"] != nil {
		t.Fatalf("a field keeping unknown fields, in v2: %v", free)
	}
	if size := spec["size"].(map[string]any); size["type"] != nil {
		t.Fatalf("a nullable field, in v2: %v", size)
	}
}

// TestCustomResourceDefaultedOnRead: a default added to a definition's
// schema shows on objects stored before it, as Kubernetes defaults custom
// resources when it reads them (the conformance spec "custom resource
// defaulting for requests and from storage works").
func TestCustomResourceDefaultedOnRead(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	crd := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: "things.example.com"}, Spec: apiextensionsv1.CustomResourceDefinitionSpec{
		Group: "example.com", Scope: apiextensionsv1.ClusterScoped, Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "things", Singular: "thing", Kind: "Thing", ListKind: "ThingList"},
		Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true, Schema: &apiextensionsv1.CustomResourceValidation{
			OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{"a": {Type: "string"}, "b": {Type: "string"}}}}}}}}
	if err := createCRD(ctx, ts.config, crd); err != nil {
		t.Fatal(err)
	}
	waitCRDCondition(t, ts.config, crd.Name, apiextensionsv1.Established)
	dyn := dynamic.NewForConfigOrDie(ts.config)
	gvr := schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "things"}
	if _, err := dyn.Resource(gvr).Create(ctx, &unstructured.Unstructured{Object: map[string]any{"apiVersion": "example.com/v1", "kind": "Thing", "metadata": map[string]any{"name": "t1"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(crdsResource).Patch(ctx, crd.Name, types.JSONPatchType, []byte(`[{"op":"add","path":"/spec/versions/0/schema/openAPIV3Schema/properties/a/default","value":"A"}]`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		u, err := dyn.Resource(gvr).Get(ctx, "t1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if u.Object["a"] == "A" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("an object stored before the default, read: %v", u.Object)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestCustomResourceDeleteOptionsOfItsGroup: a delete's body may name
// DeleteOptions in the resource's own group version, as Kubernetes
// registers them in every group and controller-runtime sends them (the
// Gateway API conformance suite deletes so); another kind is refused.
func TestCustomResourceDeleteOptionsOfItsGroup(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	crd := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: "grants.example.com"}, Spec: apiextensionsv1.CustomResourceDefinitionSpec{
		Group: "example.com", Scope: apiextensionsv1.NamespaceScoped, Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "grants", Singular: "grant", Kind: "Grant", ListKind: "GrantList"},
		Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true, Schema: &apiextensionsv1.CustomResourceValidation{
			OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object"}}}}}}
	if err := createCRD(ctx, ts.config, crd); err != nil {
		t.Fatal(err)
	}
	waitCRDCondition(t, ts.config, crd.Name, apiextensionsv1.Established)
	dyn := dynamic.NewForConfigOrDie(ts.config)
	gvr := schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "grants"}
	for _, name := range []string{"g1", "g2"} {
		if _, err := dyn.Resource(gvr).Namespace("default").Create(ctx, &unstructured.Unstructured{Object: map[string]any{"apiVersion": "example.com/v1", "kind": "Grant", "metadata": map[string]any{"name": name}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	hc, err := rest.HTTPClientFor(ts.config)
	if err != nil {
		t.Fatal(err)
	}
	del := func(name, body string) int {
		req, _ := http.NewRequest(http.MethodDelete, ts.config.Host+"/apis/example.com/v1/namespaces/default/grants/"+name, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	if code := del("g1", `{"kind":"DeleteOptions","apiVersion":"example.com/v1","propagationPolicy":"Background"}`); code != http.StatusOK {
		t.Errorf("DeleteOptions of the resource's group: %d", code)
	}
	if code := del("g2", `{"kind":"Grant","apiVersion":"example.com/v1"}`); code != http.StatusBadRequest {
		t.Errorf("another kind as delete options: %d, want a 400", code)
	}
}

// TestCustomResourceNullsPruned: a null where the schema does not allow
// one (and gives no default) is dropped, as Kubernetes prunes it before
// defaulting, rather than refused; a nullable field keeps its null. (The
// Gateway API conformance suite writes a Gateway so.)
func TestCustomResourceNullsPruned(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	crd := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: "boxes.example.com"}, Spec: apiextensionsv1.CustomResourceDefinitionSpec{
		Group: "example.com", Scope: apiextensionsv1.ClusterScoped, Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "boxes", Singular: "box", Kind: "Box", ListKind: "BoxList"},
		Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true, Schema: &apiextensionsv1.CustomResourceValidation{
			OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
				"list": {Type: "array", Items: &apiextensionsv1.JSONSchemaPropsOrArray{Schema: &apiextensionsv1.JSONSchemaProps{Type: "string"}}},
				"keep": {Type: "string", Nullable: true}}}}}}}}
	if err := createCRD(ctx, ts.config, crd); err != nil {
		t.Fatal(err)
	}
	waitCRDCondition(t, ts.config, crd.Name, apiextensionsv1.Established)
	dyn := dynamic.NewForConfigOrDie(ts.config)
	gvr := schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "boxes"}
	u, err := dyn.Resource(gvr).Create(ctx, &unstructured.Unstructured{Object: map[string]any{"apiVersion": "example.com/v1", "kind": "Box",
		"metadata": map[string]any{"name": "b1"}, "list": nil, "keep": nil}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a null where the schema allows none: %v", err)
	}
	if _, ok := u.Object["list"]; ok {
		t.Errorf("the null list kept: %v", u.Object)
	}
	if v, ok := u.Object["keep"]; !ok || v != nil {
		t.Errorf("the nullable field: %v", u.Object)
	}
}
