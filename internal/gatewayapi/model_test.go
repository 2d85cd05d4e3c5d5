package gatewayapi

import (
	"errors"
	"k8s.io/utils/ptr"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

func testCluster() Cluster {
	ipType := gatewayv1.IPAddressType
	return Cluster{
		Classes: []*gatewayv1.GatewayClass{
			{ObjectMeta: metav1.ObjectMeta{Name: "orch", Generation: 2}, Spec: gatewayv1.GatewayClassSpec{ControllerName: ControllerName}},
			{ObjectMeta: metav1.ObjectMeta{Name: "other"}, Spec: gatewayv1.GatewayClassSpec{ControllerName: "example.com/other"}},
		},
		NamespaceLabels: func(name string) (map[string]string, bool) {
			return map[string]string{"team": map[string]string{"apps": "web"}[name]}, true
		},
		Service: func(namespace, name string) *corev1.Service {
			if name != "web" {
				return nil
			}
			return &corev1.Service{Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 8080}}}}
		},
		Certificate: func(namespace, name string) error {
			if name == "good" {
				return nil
			}
			return errors.New("no such Secret")
		},
		Addresses: func(gw *gatewayv1.Gateway) ([]gatewayv1.GatewayStatusAddress, string) {
			return []gatewayv1.GatewayStatusAddress{{Type: &ipType, Value: "10.43.0.50"}}, ""
		},
	}
}

func gw(name, class string, listeners ...gatewayv1.Listener) *gatewayv1.Gateway {
	return &gatewayv1.Gateway{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "infra", Generation: 3},
		Spec: gatewayv1.GatewaySpec{GatewayClassName: gatewayv1.ObjectName(class), Listeners: listeners}}
}

func httpRoute(ns, name string, hostnames []gatewayv1.Hostname, parents ...gatewayv1.ParentReference) *gatewayv1.HTTPRoute {
	return &gatewayv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Generation: 4},
		Spec: gatewayv1.HTTPRouteSpec{CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: parents}, Hostnames: hostnames,
			Rules: []gatewayv1.HTTPRouteRule{{BackendRefs: []gatewayv1.HTTPBackendRef{{BackendRef: gatewayv1.BackendRef{
				BackendObjectReference: gatewayv1.BackendObjectReference{Name: "web", Port: ptr.To(gatewayv1.PortNumber(8080))}}}}}}}}
}

func parent(name string) gatewayv1.ParentReference {
	return gatewayv1.ParentReference{Name: gatewayv1.ObjectName(name), Namespace: ptr.To(gatewayv1.Namespace("infra"))}
}

func condition(t *testing.T, conds []metav1.Condition, typ string) metav1.Condition {
	t.Helper()
	c := meta.FindStatusCondition(conds, typ)
	if c == nil {
		t.Fatalf("no %s condition in %+v", typ, conds)
	}
	return *c
}

// TestResolve: what Resolve makes of a class, its Gateways and routes,
// with each reason the spec gives for not accepting a listener or route,
// and observedGeneration on every condition.
func TestResolve(t *testing.T) {
	all := gatewayv1.NamespacesFromAll
	selector := gatewayv1.NamespacesFromSelector
	c := testCluster()
	c.Gateways = []*gatewayv1.Gateway{
		gw("main", "orch",
			gatewayv1.Listener{Name: "http", Port: 80, Protocol: gatewayv1.HTTPProtocolType, AllowedRoutes: &gatewayv1.AllowedRoutes{Namespaces: &gatewayv1.RouteNamespaces{From: &all}}},
			gatewayv1.Listener{Name: "shop", Port: 8080, Protocol: gatewayv1.HTTPProtocolType, Hostname: ptr.To(gatewayv1.Hostname("*.shop.example")),
				AllowedRoutes: &gatewayv1.AllowedRoutes{Namespaces: &gatewayv1.RouteNamespaces{From: &selector, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "web"}}}}},
			gatewayv1.Listener{Name: "https", Port: 443, Protocol: gatewayv1.HTTPSProtocolType, TLS: &gatewayv1.ListenerTLSConfig{
				CertificateRefs: []gatewayv1.SecretObjectReference{{Name: "missing"}}}},
			gatewayv1.Listener{Name: "tcp", Port: 9000, Protocol: gatewayv1.TCPProtocolType},
		),
		gw("theirs", "other", gatewayv1.Listener{Name: "http", Port: 80, Protocol: gatewayv1.HTTPProtocolType}),
	}
	c.Routes = []*gatewayv1.HTTPRoute{
		httpRoute("apps", "shop", []gatewayv1.Hostname{"cart.shop.example", "other.example"}, parent("main")),
		httpRoute("apps", "wrong-section", nil, gatewayv1.ParentReference{Name: "main", Namespace: ptr.To(gatewayv1.Namespace("infra")), SectionName: ptr.To(gatewayv1.SectionName("nope"))}),
		httpRoute("default", "only-theirs", nil, parent("theirs")),
	}
	missing := httpRoute("apps", "missing-backend", []gatewayv1.Hostname{"a.example"}, parent("main"))
	missing.Spec.Rules[0].BackendRefs[0].Name = "gone"
	c.Routes = append(c.Routes, missing)

	r := Resolve(c)
	if st := r.Classes["orch"]; condition(t, st.Conditions, "Accepted").Status != metav1.ConditionTrue || condition(t, st.Conditions, "Accepted").ObservedGeneration != 2 || len(st.SupportedFeatures) == 0 {
		t.Errorf("class status %+v", st)
	}
	if _, ok := r.Classes["other"]; ok {
		t.Error("another controller's class got a status")
	}
	st, ok := r.Gateways[types.NamespacedName{Namespace: "infra", Name: "main"}]
	if !ok {
		t.Fatal("no status for the Gateway")
	}
	if _, ok := r.Gateways[types.NamespacedName{Namespace: "infra", Name: "theirs"}]; ok {
		t.Error("another class's Gateway got a status")
	}
	if a := condition(t, st.Conditions, "Accepted"); a.Status != metav1.ConditionTrue || a.Reason != "ListenersNotValid" || a.ObservedGeneration != 3 {
		t.Errorf("Accepted %+v", a)
	}
	if p := condition(t, st.Conditions, "Programmed"); p.Status != metav1.ConditionTrue {
		t.Errorf("Programmed %+v", p)
	}
	want := map[string]struct {
		attached        int32
		accepted, refs  string
		programmedState metav1.ConditionStatus
	}{
		"http":  {attached: 2, accepted: "Accepted", refs: "ResolvedRefs", programmedState: metav1.ConditionTrue},
		"shop":  {attached: 1, accepted: "Accepted", refs: "ResolvedRefs", programmedState: metav1.ConditionTrue},
		"https": {accepted: "Accepted", refs: "InvalidCertificateRef", programmedState: metav1.ConditionFalse},
		"tcp":   {accepted: "UnsupportedProtocol", refs: "ResolvedRefs", programmedState: metav1.ConditionFalse},
	}
	for _, ls := range st.Listeners {
		w := want[string(ls.Name)]
		if ls.AttachedRoutes != w.attached || condition(t, ls.Conditions, "Accepted").Reason != w.accepted ||
			condition(t, ls.Conditions, "ResolvedRefs").Reason != w.refs || condition(t, ls.Conditions, "Programmed").Status != w.programmedState {
			t.Errorf("listener %s: %+v", ls.Name, ls)
		}
	}
	routeCond := func(name, typ string) metav1.Condition {
		ps := r.Routes[types.NamespacedName{Namespace: "apps", Name: name}]
		if len(ps) != 1 {
			t.Fatalf("route %s parents %+v", name, ps)
		}
		if ps[0].ControllerName != ControllerName {
			t.Errorf("route %s controller %q", name, ps[0].ControllerName)
		}
		return condition(t, ps[0].Conditions, typ)
	}
	if a := routeCond("shop", "Accepted"); a.Status != metav1.ConditionTrue || a.ObservedGeneration != 4 {
		t.Errorf("shop Accepted %+v", a)
	}
	if a := routeCond("wrong-section", "Accepted"); a.Reason != "NoMatchingParent" {
		t.Errorf("wrong-section Accepted %+v", a)
	}
	if rr := routeCond("missing-backend", "ResolvedRefs"); rr.Status != metav1.ConditionFalse || rr.Reason != "BackendNotFound" {
		t.Errorf("missing-backend ResolvedRefs %+v", rr)
	}
	if _, ok := r.Routes[types.NamespacedName{Namespace: "default", Name: "only-theirs"}]; ok {
		t.Error("a route of another controller's Gateway got orch's status")
	}

	// The nodes' configuration: the Gateway's valid listeners, the
	// hostnames narrowed, the missing backend kept to answer 500.
	if len(r.Config.Gateways) != 1 {
		t.Fatalf("config %+v", r.Config)
	}
	cg := r.Config.Gateways[0]
	if cg.Name != "infra/main" || len(cg.Addresses) != 1 || len(cg.Listeners) != 2 {
		t.Fatalf("config gateway %+v", cg)
	}
	shop := cg.Listeners[1]
	if shop.Name != "shop" || len(shop.Routes) != 1 || len(shop.Routes[0].Hostnames) != 1 || shop.Routes[0].Hostnames[0] != "cart.shop.example" {
		t.Errorf("shop listener %+v", shop)
	}
	for _, rt := range cg.Listeners[0].Routes {
		if rt.Name == "apps/missing-backend" && rt.Rules[0].Backends[0].Invalid == "" {
			t.Errorf("missing backend not marked: %+v", rt.Rules[0].Backends[0])
		}
	}
}

// TestResolveReferenceGrants: a route's backend and a listener's
// certificate in another namespace need a ReferenceGrant there.
func TestResolveReferenceGrants(t *testing.T) {
	c := testCluster()
	c.Gateways = []*gatewayv1.Gateway{gw("main", "orch",
		gatewayv1.Listener{Name: "https", Port: 443, Protocol: gatewayv1.HTTPSProtocolType, TLS: &gatewayv1.ListenerTLSConfig{
			CertificateRefs: []gatewayv1.SecretObjectReference{{Name: "good", Namespace: ptr.To(gatewayv1.Namespace("certs"))}}}})}
	route := httpRoute("infra", "cross", nil, parent("main"))
	route.Spec.Rules[0].BackendRefs[0].Namespace = ptr.To(gatewayv1.Namespace("apps"))
	c.Routes = []*gatewayv1.HTTPRoute{route}

	r := Resolve(c)
	ls := r.Gateways[types.NamespacedName{Namespace: "infra", Name: "main"}].Listeners[0]
	if rr := condition(t, ls.Conditions, "ResolvedRefs"); rr.Reason != "RefNotPermitted" {
		t.Errorf("certificate without a grant: %+v", rr)
	}
	if len(r.Routes[types.NamespacedName{Namespace: "infra", Name: "cross"}]) != 1 {
		t.Fatal("no route status")
	}

	c.Grants = []*gatewayv1.ReferenceGrant{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "certs", Name: "gateways"}, Spec: gatewayv1.ReferenceGrantSpec{
			From: []gatewayv1.ReferenceGrantFrom{{Group: group, Kind: "Gateway", Namespace: "infra"}},
			To:   []gatewayv1.ReferenceGrantTo{{Kind: "Secret"}}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "routes"}, Spec: gatewayv1.ReferenceGrantSpec{
			From: []gatewayv1.ReferenceGrantFrom{{Group: group, Kind: "HTTPRoute", Namespace: "infra"}},
			To:   []gatewayv1.ReferenceGrantTo{{Kind: "Service", Name: ptr.To(gatewayv1.ObjectName("web"))}}}},
	}
	r = Resolve(c)
	ls = r.Gateways[types.NamespacedName{Namespace: "infra", Name: "main"}].Listeners[0]
	if rr := condition(t, ls.Conditions, "ResolvedRefs"); rr.Status != metav1.ConditionTrue || ls.AttachedRoutes != 1 {
		t.Errorf("certificate with a grant: %+v", ls)
	}
	rr := condition(t, r.Routes[types.NamespacedName{Namespace: "infra", Name: "cross"}][0].Conditions, "ResolvedRefs")
	if rr.Status != metav1.ConditionTrue {
		t.Errorf("backend with a grant: %+v", rr)
	}
	if got := r.Config.Gateways[0].Listeners[0].Certificates; len(got) != 1 || got[0] != "certs/good" {
		t.Errorf("certificates %v", got)
	}
}

func TestIntersect(t *testing.T) {
	for _, tc := range []struct {
		listener string
		route    []gatewayv1.Hostname
		want     []string
		ok       bool
	}{
		{"", nil, nil, true},
		{"a.example", nil, []string{"a.example"}, true},
		{"", []gatewayv1.Hostname{"B.example"}, []string{"b.example"}, true},
		{"*.example", []gatewayv1.Hostname{"a.example", "x.other"}, []string{"a.example"}, true},
		{"a.b.example", []gatewayv1.Hostname{"*.example"}, []string{"a.b.example"}, true},
		{"*.example", []gatewayv1.Hostname{"*.b.example"}, []string{"*.b.example"}, true},
		{"*.example", []gatewayv1.Hostname{"example"}, nil, false},
		{"a.example", []gatewayv1.Hostname{"b.example"}, nil, false},
	} {
		got, ok := intersect(tc.listener, tc.route)
		if ok != tc.ok || len(got) != len(tc.want) || len(got) > 0 && got[0] != tc.want[0] {
			t.Errorf("intersect(%q, %v) = %v, %v; want %v, %v", tc.listener, tc.route, got, ok, tc.want, tc.ok)
		}
	}
}

// TestResolveStaticAddresses: an address of a type orch does not serve
// leaves the Gateway not accepted; an address that cannot be served
// (loopback) leaves it accepted but not programmed, as the conformance
// suite's GatewayStaticAddresses expects.
func TestResolveStaticAddresses(t *testing.T) {
	hostname := gatewayv1.HostnameAddressType
	for _, tc := range []struct {
		addr             gatewayv1.GatewaySpecAddress
		accepted, reason string
	}{
		{gatewayv1.GatewaySpecAddress{Type: &hostname, Value: "gw.example"}, "False", "UnsupportedAddress"},
		{gatewayv1.GatewaySpecAddress{Value: "127.0.0.2"}, "True", "AddressNotUsable"},
		{gatewayv1.GatewaySpecAddress{Value: "192.0.2.10"}, "True", "Programmed"},
	} {
		c := testCluster()
		g := gw("main", "orch", gatewayv1.Listener{Name: "http", Port: 80, Protocol: gatewayv1.HTTPProtocolType})
		g.Spec.Addresses = []gatewayv1.GatewaySpecAddress{tc.addr}
		c.Gateways = []*gatewayv1.Gateway{g}
		st := Resolve(c).Gateways[types.NamespacedName{Namespace: "infra", Name: "main"}]
		if a, p := condition(t, st.Conditions, "Accepted"), condition(t, st.Conditions, "Programmed"); string(a.Status) != tc.accepted || p.Reason != tc.reason && a.Reason != tc.reason {
			t.Errorf("%v: Accepted %+v, Programmed %+v", tc.addr, a, p)
		}
	}
}

// TestResolveAttachedToUnresolvedListener: a listener whose certificate
// cannot be found still counts the routes attached to it, and serves
// none.
func TestResolveAttachedToUnresolvedListener(t *testing.T) {
	c := testCluster()
	c.Gateways = []*gatewayv1.Gateway{gw("main", "orch", gatewayv1.Listener{Name: "https", Port: 443, Protocol: gatewayv1.HTTPSProtocolType,
		TLS: &gatewayv1.ListenerTLSConfig{CertificateRefs: []gatewayv1.SecretObjectReference{{Name: "missing"}}}})}
	c.Routes = []*gatewayv1.HTTPRoute{httpRoute("infra", "r", nil, parent("main"))}
	r := Resolve(c)
	if ls := r.Gateways[types.NamespacedName{Namespace: "infra", Name: "main"}].Listeners[0]; ls.AttachedRoutes != 1 {
		t.Errorf("attached routes %d, want 1", ls.AttachedRoutes)
	}
	if len(r.Config.Gateways) != 0 {
		t.Errorf("an invalid listener served: %+v", r.Config)
	}
}
