package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api/apitest"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"
)

// convertEndpoints is a conversion webhook as operators write one: v1
// keeps "host:port" in spec.address, v2 splits it into spec.host and
// spec.port.
func convertEndpoints(calls *atomic.Int64) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		var review apiextensionsv1.ConversionReview
		data, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(data, &review); err != nil || review.Request == nil {
			http.Error(w, "bad review", http.StatusBadRequest)
			return
		}
		resp := &apiextensionsv1.ConversionResponse{UID: review.Request.UID, Result: metav1.Status{Status: metav1.StatusSuccess}}
		for _, raw := range review.Request.Objects {
			u := &unstructured.Unstructured{}
			_ = u.UnmarshalJSON(raw.Raw)
			spec, _, _ := unstructured.NestedMap(u.Object, "spec")
			switch review.Request.DesiredAPIVersion {
			case "example.com/v2":
				host, port, _ := net.SplitHostPort(fmt.Sprint(spec["address"]))
				spec = map[string]any{"host": host, "port": port}
			case "example.com/v1":
				spec = map[string]any{"address": net.JoinHostPort(fmt.Sprint(spec["host"]), fmt.Sprint(spec["port"]))}
			}
			_ = unstructured.SetNestedMap(u.Object, spec, "spec")
			u.SetAPIVersion(review.Request.DesiredAPIVersion)
			out, _ := u.MarshalJSON()
			resp.ConvertedObjects = append(resp.ConvertedObjects, runtime.RawExtension{Raw: out})
		}
		out, _ := json.Marshal(&apiextensionsv1.ConversionReview{TypeMeta: review.TypeMeta, Response: resp})
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(out)
	}
}

// TestCustomResourceConversionWebhook: a definition with two versions and
// a conversion webhook stores in its storage version and serves either,
// converted by the webhook, as Kubernetes does.
func TestCustomResourceConversionWebhook(t *testing.T) {
	srv := apitest.Start(t)
	ctx := context.Background()
	var calls atomic.Int64
	hook := startWebhook(t, "127.0.0.1:0")
	mux := http.NewServeMux()
	mux.Handle("/convert", convertEndpoints(&calls))
	// The test webhook server answers admission reviews; conversion gets
	// its own listener with the same certificate.
	conv := serveTLS(t, hook, mux)

	str := apiextensionsv1.JSONSchemaProps{Type: "string"}
	version := func(name string, storage bool, props map[string]apiextensionsv1.JSONSchemaProps) apiextensionsv1.CustomResourceDefinitionVersion {
		return apiextensionsv1.CustomResourceDefinitionVersion{Name: name, Served: true, Storage: storage, Schema: &apiextensionsv1.CustomResourceValidation{
			OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
				"spec": {Type: "object", Properties: props}}}}}
	}
	crd := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: "endpoints.example.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{Group: "example.com", Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "endpoints", Singular: "endpoint", Kind: "Endpoint"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{
				version("v1", true, map[string]apiextensionsv1.JSONSchemaProps{"address": str}),
				version("v2", false, map[string]apiextensionsv1.JSONSchemaProps{"host": str, "port": str}),
			},
			Conversion: &apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.WebhookConverter, Webhook: &apiextensionsv1.WebhookConversion{
				ClientConfig: &apiextensionsv1.WebhookClientConfig{URL: ptr.To(conv + "/convert"), CABundle: hook.ca}, ConversionReviewVersions: []string{"v1"}}}}}
	if err := createCRD(ctx, srv.Admin, crd); err != nil {
		t.Fatal(err)
	}
	waitCRDCondition(t, srv.Admin, crd.Name, apiextensionsv1.Established)
	dyn := dynamic.NewForConfigOrDie(srv.Admin)
	v1 := dyn.Resource(schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "endpoints"}).Namespace("default")
	v2 := dyn.Resource(schema.GroupVersionResource{Group: "example.com", Version: "v2", Resource: "endpoints"}).Namespace("default")
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if _, err = v2.List(ctx, metav1.ListOptions{}); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v1.Create(ctx, &unstructured.Unstructured{Object: map[string]any{"apiVersion": "example.com/v1", "kind": "Endpoint",
		"metadata": map[string]any{"name": "a"}, "spec": map[string]any{"address": "10.0.0.1:80"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := v2.Get(ctx, "a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetAPIVersion() != "example.com/v2" || fmt.Sprint(got.Object["spec"]) != "map[host:10.0.0.1 port:80]" {
		t.Fatalf("read through v2: %v %v", got.GetAPIVersion(), got.Object["spec"])
	}
	// Written through v2, stored in v1, read back through either.
	if _, err := v2.Create(ctx, &unstructured.Unstructured{Object: map[string]any{"apiVersion": "example.com/v2", "kind": "Endpoint",
		"metadata": map[string]any{"name": "b"}, "spec": map[string]any{"host": "10.0.0.2", "port": "443"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	back, err := v1.Get(ctx, "b", metav1.GetOptions{})
	if err != nil || fmt.Sprint(back.Object["spec"]) != "map[address:10.0.0.2:443]" {
		t.Fatalf("read through v1: %v %v", back, err)
	}
	list, err := v2.List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 2 {
		t.Fatalf("list through v2: %v %v", list, err)
	}
	for _, item := range list.Items {
		if item.GetAPIVersion() != "example.com/v2" || item.Object["spec"].(map[string]any)["host"] == nil {
			t.Fatalf("listed through v2: %v", item.Object)
		}
	}
	if calls.Load() == 0 {
		t.Fatal("the conversion webhook was never called")
	}
	// The webhook down: reads in another version fail with Kubernetes'
	// message, reads in the storage version do not need it.
	cur, err := dyn.Resource(crdsResource).Get(ctx, crd.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedField(cur.Object, "https://127.0.0.1:1/convert", "spec", "conversion", "webhook", "clientConfig", "url")
	if _, err := dyn.Resource(crdsResource).Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err = v2.Get(ctx, "a", metav1.GetOptions{})
		if err != nil && strings.Contains(err.Error(), "conversion webhook for example.com/v2, Kind=Endpoint failed") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("read with the webhook down: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := v1.Get(ctx, "a", metav1.GetOptions{}); err != nil {
		t.Fatalf("read in the storage version: %v", err)
	}
}

// serveTLS serves h with the test webhook's certificate on another port.
func serveTLS(t *testing.T, hook *testWebhook, h http.Handler) string {
	t.Helper()
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv.TLSConfig = hook.tlsConfig.Clone() // ServeTLS sets its protocols: one config per server
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	return "https://" + ln.Addr().String()
}
