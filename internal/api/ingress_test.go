package api_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// webBackend is port 80 of the Service web.
func webBackend() networkingv1.IngressBackend {
	return networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: "web", Port: networkingv1.ServiceBackendPort{Number: 80}}}
}

func prefixRule(host, path string, backend networkingv1.IngressBackend) networkingv1.IngressRule {
	return networkingv1.IngressRule{Host: host, IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{
		Paths: []networkingv1.HTTPIngressPath{{Path: path, PathType: ptr.To(networkingv1.PathTypePrefix), Backend: backend}}}}}
}

// TestIngressClassDefault: the server makes the IngressClass orch, marked
// default, and a new Ingress naming no class gets it (Kubernetes'
// DefaultIngressClass admission); one naming a class or the older
// annotation keeps what it says; unmarked, the class is given to none.
func TestIngressClassDefault(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	net := ts.client.NetworkingV1()
	class, err := net.IngressClasses().Get(ctx, "orch", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if class.Spec.Controller != "orch.io/ingress" || class.Annotations[networkingv1.AnnotationIsDefaultIngressClass] != "true" {
		t.Fatalf("the orch IngressClass: %+v", class)
	}
	create := func(in *networkingv1.Ingress) *networkingv1.Ingress {
		t.Helper()
		in.Spec.Rules = []networkingv1.IngressRule{prefixRule("web.example", "/", webBackend())}
		got, err := net.Ingresses("default").Create(ctx, in, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := create(&networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Name: "plain"}}); ptr.Deref(got.Spec.IngressClassName, "") != "orch" {
		t.Errorf("an Ingress naming no class: class %v", got.Spec.IngressClassName)
	}
	if got := create(&networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Name: "nginx"}, Spec: networkingv1.IngressSpec{IngressClassName: ptr.To("nginx")}}); *got.Spec.IngressClassName != "nginx" {
		t.Errorf("an Ingress naming nginx: class %v", *got.Spec.IngressClassName)
	}
	annotated := create(&networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Name: "annotated", Annotations: map[string]string{"kubernetes.io/ingress.class": "traefik"}}})
	if annotated.Spec.IngressClassName != nil {
		t.Errorf("an Ingress with the class annotation: class %v", *annotated.Spec.IngressClassName)
	}
	class.Annotations[networkingv1.AnnotationIsDefaultIngressClass] = "false"
	if _, err := net.IngressClasses().Update(ctx, class, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := create(&networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Name: "after"}}); got.Spec.IngressClassName != nil {
		t.Errorf("with no default class: class %v", *got.Spec.IngressClassName)
	}
	// The controller is fixed once made, as in Kubernetes.
	class, _ = net.IngressClasses().Get(ctx, "orch", metav1.GetOptions{})
	class.Spec.Controller = "example.com/other"
	if _, err := net.IngressClasses().Update(ctx, class, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.controller: Invalid value") {
		t.Errorf("changing the controller: %v", err)
	}
}

// TestIngressBadInput: malformed Ingresses and IngressClasses are 422s at
// the field and with the message Kubernetes gives.
func TestIngressBadInput(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	net := ts.client.NetworkingV1()
	ok := prefixRule("web.example", "/", webBackend())
	withPath := func(path string, typ *networkingv1.PathType) networkingv1.IngressRule {
		r := prefixRule("web.example", path, webBackend())
		r.HTTP.Paths[0].PathType = typ
		return r
	}
	for _, tc := range []struct {
		name string
		spec networkingv1.IngressSpec
		want string
	}{
		{"nothing to serve", networkingv1.IngressSpec{}, "spec: Invalid value: null: either `defaultBackend` or `rules` must be specified"},
		{"an IP as host", networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{prefixRule("10.0.0.1", "/", webBackend())}},
			"spec.rules[0].host: Invalid value: \"10.0.0.1\": must be a DNS name, not an IP address"},
		{"a bad wildcard", networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{prefixRule("web.*.example", "/", webBackend())}},
			"spec.rules[0].host: Invalid value: \"web.*.example\""},
		{"no path type", networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{withPath("/", nil)}},
			"spec.rules[0].http.paths[0].pathType: Required value: pathType must be specified"},
		{"an unknown path type", networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{withPath("/", ptr.To(networkingv1.PathType("Regex")))}},
			"spec.rules[0].http.paths[0].pathType: Unsupported value: \"Regex\""},
		{"a relative path", networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{withPath("api", ptr.To(networkingv1.PathTypePrefix))}},
			"spec.rules[0].http.paths[0].path: Invalid value: \"api\": must be an absolute path"},
		{"a path that climbs", networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{withPath("/a/../b", ptr.To(networkingv1.PathTypeExact))}},
			"spec.rules[0].http.paths[0].path: Invalid value: \"/a/../b\": must not contain '/../'"},
		{"two backends", networkingv1.IngressSpec{DefaultBackend: &networkingv1.IngressBackend{Service: webBackend().Service,
			Resource: &corev1.TypedLocalObjectReference{Kind: "Bucket", Name: "b"}}}, "spec.defaultBackend: Invalid value: \"\": cannot set both resource and service backends"},
		{"no port", networkingv1.IngressSpec{DefaultBackend: &networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: "web"}}},
			"spec.defaultBackend: Required value: port name or number is required"},
		{"a port out of range", networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{ok}, DefaultBackend: &networkingv1.IngressBackend{
			Service: &networkingv1.IngressServiceBackend{Name: "web", Port: networkingv1.ServiceBackendPort{Number: 70000}}}},
			"spec.defaultBackend.service.port.number: Invalid value: 70000"},
		{"a bad TLS secret name", networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{ok}, TLS: []networkingv1.IngressTLS{{Hosts: []string{"web.example"}, SecretName: "Bad_Name"}}},
			"spec.tls[0].secretName: Invalid value: \"Bad_Name\""},
	} {
		_, err := net.Ingresses("default").Create(ctx, &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Name: "bad"}, Spec: tc.spec}, metav1.CreateOptions{})
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want 422 %q", tc.name, err, tc.want)
		}
	}
	if _, err := net.Ingresses("default").Create(ctx, &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Name: "mixed", Annotations: map[string]string{"kubernetes.io/ingress.class": "a"}},
		Spec: networkingv1.IngressSpec{IngressClassName: ptr.To("b"), Rules: []networkingv1.IngressRule{ok}}}, metav1.CreateOptions{}); !apierrors.IsInvalid(err) ||
		!strings.Contains(err.Error(), "must match `ingressClassName` when both are specified") {
		t.Errorf("annotation and field disagreeing: %v", err)
	}
	for _, tc := range []struct {
		name string
		spec networkingv1.IngressClassSpec
		want string
	}{
		{"a controller without a domain", networkingv1.IngressClassSpec{Controller: "nginx"}, "spec.controller: Invalid value: \"nginx\": must be a domain-prefixed path"},
		{"namespaced parameters without a namespace", networkingv1.IngressClassSpec{Controller: "example.com/x", Parameters: &networkingv1.IngressClassParametersReference{
			Kind: "Config", Name: "c", Scope: ptr.To("Namespace")}}, "spec.parameters.namespace: Required value"},
	} {
		_, err := net.IngressClasses().Create(ctx, &networkingv1.IngressClass{ObjectMeta: metav1.ObjectMeta{Name: "bad"}, Spec: tc.spec}, metav1.CreateOptions{})
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want 422 %q", tc.name, err, tc.want)
		}
	}
	// Parameters without a scope are at the cluster's, as Kubernetes
	// defaults them.
	got, err := net.IngressClasses().Create(ctx, &networkingv1.IngressClass{ObjectMeta: metav1.ObjectMeta{Name: "params"}, Spec: networkingv1.IngressClassSpec{
		Controller: "example.com/x", Parameters: &networkingv1.IngressClassParametersReference{Kind: "Config", Name: "c"}}}, metav1.CreateOptions{})
	if err != nil || ptr.Deref(got.Spec.Parameters.Scope, "") != "Cluster" {
		t.Errorf("parameters without a scope: %v %+v", err, got)
	}
}

// TestNodeReadsIngresses: every node is the ingress controller of orch's
// classes, so a node's certificate may read Ingresses and IngressClasses
// (not write them) and the TLS Secrets that Ingresses of orch's classes
// name; not a Secret an Ingress of another class names, nor one no
// Ingress names; and once the Ingress is gone, not its Secret either.
func TestNodeReadsIngresses(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	core, net := ts.client.CoreV1(), ts.client.NetworkingV1()
	for _, name := range []string{"served-tls", "nginx-tls", "unnamed"} {
		if _, err := core.Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, StringData: map[string]string{"k": "v"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for name, class := range map[string]string{"served": "orch", "nginx": "nginx"} {
		in := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networkingv1.IngressSpec{IngressClassName: ptr.To(class),
			Rules: []networkingv1.IngressRule{prefixRule("web.example", "/", webBackend())},
			TLS:   []networkingv1.IngressTLS{{Hosts: []string{"web.example"}, SecretName: name + "-tls"}}}}
		if _, err := net.Ingresses("default").Create(ctx, in, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	n1 := ts.as(t, "system:node:n1", "system:nodes")
	secret := func(name string) int {
		code, _ := n1.do("GET", "/api/v1/namespaces/default/secrets/"+name, "", "")
		return code
	}
	for deadline := time.Now().Add(10 * time.Second); secret("served-tls") != 200 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
	}
	for _, tc := range []struct {
		what, method, path string
		want               int
	}{
		{"list Ingresses", "GET", "/apis/networking.k8s.io/v1/ingresses", 200},
		{"watch IngressClasses", "GET", "/apis/networking.k8s.io/v1/ingressclasses?watch=true&timeoutSeconds=1", 200},
		{"read a served Ingress's TLS Secret", "GET", "/api/v1/namespaces/default/secrets/served-tls", 200},
		{"watch it by name", "GET", "/api/v1/namespaces/default/secrets?fieldSelector=metadata.name%3Dserved-tls&watch=true&timeoutSeconds=1", 200},
		{"read another class's TLS Secret", "GET", "/api/v1/namespaces/default/secrets/nginx-tls", 403},
		{"read a Secret nothing names", "GET", "/api/v1/namespaces/default/secrets/unnamed", 403},
		{"list Secrets", "GET", "/api/v1/namespaces/default/secrets", 403},
		{"delete an Ingress", "DELETE", "/apis/networking.k8s.io/v1/namespaces/default/ingresses/served", 403},
	} {
		if code, msg := n1.do(tc.method, tc.path, "", ""); code != tc.want {
			t.Errorf("a node may %s: %d %s, want %d", tc.what, code, msg, tc.want)
		}
	}
	if err := net.Ingresses("default").Delete(ctx, "served", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); secret("served-tls") != 403; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a deleted Ingress's TLS Secret is still readable by nodes")
		}
	}
}

// TestIngressStatusWrite: a write of the status subresource sets the
// status and may change the metadata, but not the spec, as Kubernetes'
// Ingress status strategy does (the conformance spec patches an
// annotation through /status).
func TestIngressStatusWrite(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	ings := ts.client.NetworkingV1().Ingresses("default")
	if _, err := ings.Create(ctx, &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{prefixRule("web.example", "/", webBackend())}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := ings.Patch(ctx, "web", types.MergePatchType, []byte(`{"metadata":{"annotations":{"patchedstatus":"true"}},`+
		`"spec":{"rules":[{"host":"other.example","http":{"paths":[{"path":"/","pathType":"Prefix","backend":{"service":{"name":"x","port":{"number":1}}}}]}}]},`+
		`"status":{"loadBalancer":{"ingress":[{"ip":"169.1.1.1"}]}}}`), metav1.PatchOptions{}, "status")
	if err != nil {
		t.Fatal(err)
	}
	if got.Annotations["patchedstatus"] != "true" || len(got.Status.LoadBalancer.Ingress) != 1 || got.Status.LoadBalancer.Ingress[0].IP != "169.1.1.1" ||
		got.Spec.Rules[0].Host != "web.example" {
		t.Errorf("after a status patch: annotations %v, status %+v, host %q", got.Annotations, got.Status, got.Spec.Rules[0].Host)
	}
}
