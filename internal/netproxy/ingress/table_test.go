package ingress

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

var (
	exact  = ptr.To(networkingv1.PathTypeExact)
	prefix = ptr.To(networkingv1.PathTypePrefix)
	impl   = ptr.To(networkingv1.PathTypeImplementationSpecific)
)

func orchClass() *networkingv1.IngressClass {
	return &networkingv1.IngressClass{ObjectMeta: metav1.ObjectMeta{Name: "orch"}, Spec: networkingv1.IngressClassSpec{Controller: "orch.io/ingress"}}
}

// ing is an Ingress of class orch (unless class says otherwise), created
// age seconds before the others.
func ing(name string, age int, rules ...networkingv1.IngressRule) *networkingv1.Ingress {
	return &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", CreationTimestamp: metav1.NewTime(time.Unix(1e9-int64(age), 0))},
		Spec: networkingv1.IngressSpec{IngressClassName: ptr.To("orch"), Rules: rules}}
}

func rule(host string, paths ...networkingv1.HTTPIngressPath) networkingv1.IngressRule {
	return networkingv1.IngressRule{Host: host, IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{Paths: paths}}}
}

func path(p string, typ *networkingv1.PathType, svc string) networkingv1.HTTPIngressPath {
	return networkingv1.HTTPIngressPath{Path: p, PathType: typ, Backend: networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: svc, Port: networkingv1.ServiceBackendPort{Number: 80}}}}
}

// services makes a Service on port 80 (named http, to 8080) for each name,
// its one endpoint ready at 10.0.0.i.
func services(names ...string) (func(string, string) *corev1.Service, func(string, string) []*discoveryv1.EndpointSlice) {
	svcs, slices := map[string]*corev1.Service{}, map[string][]*discoveryv1.EndpointSlice{}
	for i, n := range names {
		svcs[n] = &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: n, Namespace: "default"}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
		slices[n] = []*discoveryv1.EndpointSlice{{Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}},
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{fmt.Sprintf("10.0.0.%d", i+1)}},
				{Addresses: []string{"10.0.1.1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}}}}}
	}
	return func(_, n string) *corev1.Service { return svcs[n] }, func(_, n string) []*discoveryv1.EndpointSlice { return slices[n] }
}

// TestRouting: requests go where the Ingress spec says: the host's rules
// (exact name, then a one-label wildcard, then rules for any host), the
// longest matching path, Exact before Prefix of the same path, Prefix
// element by element (ImplementationSpecific taken as Prefix), the older
// Ingress's route on a tie, the default backend when nothing matches;
// only Ingresses of orch's classes count.
func TestRouting(t *testing.T) {
	svc, slices := services("web", "api", "api-v2", "docs", "wild", "any", "fallback", "old", "other-class", "exact")
	fallback := ing("fallback", 0)
	fallback.Spec.DefaultBackend = &networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: "fallback", Port: networkingv1.ServiceBackendPort{Name: "http"}}}
	nginx := ing("nginx", 100, rule("web.example", path("/", prefix, "other-class")))
	nginx.Spec.IngressClassName = ptr.To("nginx")
	c := cluster{classes: []*networkingv1.IngressClass{orchClass()}, service: svc, slices: slices, ingresses: []*networkingv1.Ingress{
		ing("web", 10, rule("web.example", path("/", prefix, "web"), path("/api", prefix, "api"), path("/api/v2", impl, "api-v2"), path("/docs", exact, "exact"))),
		ing("docs", 5, rule("web.example", path("/docs", prefix, "docs"))),
		ing("newer", 1, rule("web.example", path("/api", prefix, "web"))),
		ing("older", 20, rule("old.example", path("/", prefix, "old"))),
		ing("younger", 2, rule("old.example", path("/", prefix, "web"))),
		ing("wild", 3, rule("*.wild.example", path("/", prefix, "wild"))),
		ing("any", 4, rule("", path("/anyhost", prefix, "any"))),
		fallback, nginx,
	}}
	tbl, problems := build(c)
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	for _, tc := range []struct{ host, path, want string }{
		{"web.example", "/", "web"},
		{"WEB.example:80", "/index.html", "web"},
		{"web.example", "/api", "api"},
		{"web.example", "/api/", "api"},
		{"web.example", "/api/users", "api"},
		{"web.example", "/apiary", "web"},
		{"web.example", "/api/v2/x", "api-v2"},
		{"web.example", "/docs", "exact"},
		{"web.example", "/docs/intro", "docs"},
		{"old.example", "/", "old"},
		{"a.wild.example", "/x", "wild"},
		{"a.b.wild.example", "/x", "fallback"},
		{"wild.example", "/x", "fallback"},
		{"web.example", "/anyhost/1", "web"},
		{"unknown.example", "/anyhost/1", "any"},
		{"unknown.example", "/", "fallback"},
	} {
		_, be := tbl.route(tc.host, tc.path)
		got := "<none>"
		if be != nil {
			got = be.service.Name
		}
		if got != tc.want {
			t.Errorf("%s%s went to %s, want %s", tc.host, tc.path, got, tc.want)
		}
	}
	_, be := tbl.route("web.example", "/")
	if len(be.endpoints) != 1 || be.endpoints[0] != "10.0.0.1:8080" {
		t.Errorf("the ready endpoints of web: %v (not ready ones left out)", be.endpoints)
	}
	if tbl.ingresses != 8 {
		t.Errorf("%d Ingresses served, want 8 (not nginx's)", tbl.ingresses)
	}
}

// TestBackendProblems: a backend whose Service or port does not exist,
// or a resource backend, routes to no endpoint with the reason said.
func TestBackendProblems(t *testing.T) {
	svc, slices := services("web")
	named := path("/named", prefix, "web")
	named.Backend.Service.Port = networkingv1.ServiceBackendPort{Name: "grpc"}
	res := path("/res", prefix, "web")
	res.Backend = networkingv1.IngressBackend{Resource: &corev1.TypedLocalObjectReference{Kind: "Bucket", Name: "b"}}
	tbl, _ := build(cluster{classes: []*networkingv1.IngressClass{orchClass()}, service: svc, slices: slices, ingresses: []*networkingv1.Ingress{
		ing("a", 0, rule("x", path("/missing", prefix, "nope"), named, res))}})
	for p, want := range map[string]string{
		"/missing": `service "default/nope" not found`,
		"/named":   `service "default/web" has no port "grpc"`,
		"/res":     "a resource backend: orch's Ingress serves Services only",
	} {
		_, be := tbl.route("x", p)
		if be == nil || len(be.endpoints) != 0 || be.problem != want {
			t.Errorf("%s: %+v, want %q", p, be, want)
		}
	}
}
