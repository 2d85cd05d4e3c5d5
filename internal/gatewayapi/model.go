package gatewayapi

import (
	"cmp"
	"crypto/tls"
	"fmt"
	"k8s.io/utils/ptr"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// Cluster is what the Gateway API objects are resolved against: the
// objects themselves and lookups of what they refer to.
type Cluster struct {
	Classes  []*gatewayv1.GatewayClass
	Gateways []*gatewayv1.Gateway
	Routes   []*gatewayv1.HTTPRoute
	Grants   []*gatewayv1.ReferenceGrant
	// NamespaceLabels are a namespace's labels (false when there is no
	// such namespace), for listeners that take routes by selector.
	NamespaceLabels func(name string) (map[string]string, bool)
	// Service is a Service, nil when there is none.
	Service func(namespace, name string) *corev1.Service
	// Certificate is nil when the Secret holds a usable certificate and
	// key, else why not.
	Certificate func(namespace, name string) error
	// Addresses are a Gateway's addresses as assigned, or why it has none.
	Addresses func(gw *gatewayv1.Gateway) ([]gatewayv1.GatewayStatusAddress, string)
}

// Resolved is the cluster's Gateway API objects as orch serves them: the
// statuses its controller writes and the configuration the nodes' proxies
// route by. Both come from one resolution, so that what a status says is
// what the proxies do.
type Resolved struct {
	Config Config
	// Classes are the conditions of orch's GatewayClasses by name.
	Classes map[string]gatewayv1.GatewayClassStatus
	// Gateways are the statuses of orch's Gateways.
	Gateways map[types.NamespacedName]gatewayv1.GatewayStatus
	// Routes are, for each HTTPRoute naming one of orch's Gateways, the
	// parent statuses orch's controller owns (other controllers' entries
	// are theirs to write).
	Routes map[types.NamespacedName][]gatewayv1.RouteParentStatus
}

// Config is what a node's proxy serves: each of orch's programmed
// Gateways with its listeners and the routes attached to each.
type Config struct {
	Gateways []ConfigGateway `json:"gateways"`
}

// ConfigGateway is one Gateway: it is reached on its addresses.
type ConfigGateway struct {
	// Name is namespace/name.
	Name      string           `json:"name"`
	Addresses []string         `json:"addresses"`
	Listeners []ConfigListener `json:"listeners"`
}

// ConfigListener is one valid listener.
type ConfigListener struct {
	Name     string `json:"name"`
	Port     int32  `json:"port"`
	Protocol string `json:"protocol"`
	// Hostname is the listener's ("" for any), exact or *.domain.
	Hostname string `json:"hostname,omitempty"`
	// Certificates are the TLS Secrets (namespace/name) of an HTTPS
	// listener, the first the default.
	Certificates []string      `json:"certificates,omitempty"`
	Routes       []ConfigRoute `json:"routes,omitempty"`
}

// ConfigRoute is an HTTPRoute as attached to one listener.
type ConfigRoute struct {
	// Name is namespace/name; Order its rank among all routes (oldest
	// first, then by name), which breaks ties between equal matches.
	Name  string `json:"name"`
	Order int    `json:"order"`
	// Hostnames are the route's hostnames as narrowed by the listener's
	// (empty: any host).
	Hostnames []string     `json:"hostnames,omitempty"`
	Rules     []ConfigRule `json:"rules"`
}

// ConfigRule is one rule of a route.
type ConfigRule struct {
	Matches  []gatewayv1.HTTPRouteMatch   `json:"matches,omitempty"`
	Filters  []gatewayv1.HTTPRouteFilter  `json:"filters,omitempty"`
	Backends []ConfigBackend              `json:"backends,omitempty"`
	Timeouts *gatewayv1.HTTPRouteTimeouts `json:"timeouts,omitempty"`
	Retry    *gatewayv1.HTTPRouteRetry    `json:"retry,omitempty"`
}

// ConfigBackend is one backend of a rule.
type ConfigBackend struct {
	// Service is namespace/name, Port its port.
	Service string                      `json:"service,omitempty"`
	Port    int32                       `json:"port,omitempty"`
	Weight  int32                       `json:"weight"`
	Filters []gatewayv1.HTTPRouteFilter `json:"filters,omitempty"`
	// Invalid says why the backend cannot be reached: the requests it
	// would take get a 500, as the spec requires.
	Invalid string `json:"invalid,omitempty"`
}

// Features are what orch's GatewayClass says it supports, in its status
// (sorted, as the spec asks). A rule's retry policy is served too, but
// the field is the experimental channel's: not claimed with the standard
// one orch installs.
var Features = func() []gatewayv1.SupportedFeature {
	names := []string{
		"Gateway", "GatewayPort8080", "GatewayStaticAddresses", "GatewayHTTPListenerIsolation", "GatewayAddressEmpty",
		"GatewayInfrastructure", "GatewayHTTPSListenerDetectMisdirectedRequests",
		"HTTPRouteCORS", "HTTPRoute303RedirectStatusCode", "HTTPRoute307RedirectStatusCode", "HTTPRoute308RedirectStatusCode",
		"HTTPRoute", "ReferenceGrant",
		"HTTPRouteBackendRequestHeaderModification", "HTTPRouteHostRewrite", "HTTPRouteMethodMatching",
		"HTTPRouteParentRefPort", "HTTPRoutePathRedirect", "HTTPRoutePathRewrite", "HTTPRoutePortRedirect",
		"HTTPRouteQueryParamMatching", "HTTPRouteRequestMirror", "HTTPRouteRequestMultipleMirrors",
		"HTTPRouteRequestPercentageMirror", "HTTPRouteResponseHeaderModification", "HTTPRouteSchemeRedirect",
		"HTTPRouteBackendTimeout", "HTTPRouteRequestTimeout", "HTTPRouteNamedRouteRule",
		"HTTPRouteDestinationPortMatching", "HTTPRouteBackendProtocolH2C", "HTTPRouteBackendProtocolWebSocket",
	}
	slices.Sort(names)
	out := make([]gatewayv1.SupportedFeature, len(names))
	for i, n := range names {
		out[i] = gatewayv1.SupportedFeature{Name: gatewayv1.FeatureName(n)}
	}
	return out
}()

const (
	group     = gatewayv1.GroupName
	kindRoute = "HTTPRoute"
)

// Resolve works out what orch serves of the cluster's objects.
func Resolve(c Cluster) Resolved {
	r := Resolved{Classes: map[string]gatewayv1.GatewayClassStatus{}, Gateways: map[types.NamespacedName]gatewayv1.GatewayStatus{},
		Routes: map[types.NamespacedName][]gatewayv1.RouteParentStatus{}}
	ours := map[string]bool{}
	for _, gc := range c.Classes {
		if gc.Spec.ControllerName != ControllerName {
			continue
		}
		ours[gc.Name] = true
		st := gatewayv1.GatewayClassStatus{SupportedFeatures: Features}
		accepted := metav1.Condition{Type: string(gatewayv1.GatewayClassConditionStatusAccepted), Status: metav1.ConditionTrue,
			Reason: string(gatewayv1.GatewayClassReasonAccepted), Message: "served by every node's proxy", ObservedGeneration: gc.Generation}
		if gc.Spec.ParametersRef != nil {
			accepted.Status, accepted.Reason, accepted.Message = metav1.ConditionFalse, string(gatewayv1.GatewayClassReasonInvalidParameters), "orch's GatewayClass takes no parameters"
		}
		setCondition(&st.Conditions, gc.Status.Conditions, accepted)
		setCondition(&st.Conditions, gc.Status.Conditions, metav1.Condition{Type: string(gatewayv1.GatewayClassConditionStatusSupportedVersion),
			Status: metav1.ConditionTrue, Reason: string(gatewayv1.GatewayClassReasonSupportedVersion), Message: "Gateway API " + Version, ObservedGeneration: gc.Generation})
		r.Classes[gc.Name] = st
	}

	gateways := map[types.NamespacedName]*gateway{}
	var order []*gateway
	for _, gw := range c.Gateways {
		if !ours[string(gw.Spec.GatewayClassName)] {
			continue
		}
		g := resolveGateway(c, gw)
		gateways[types.NamespacedName{Namespace: gw.Namespace, Name: gw.Name}] = g
		order = append(order, g)
	}

	routes := slices.Clone(c.Routes)
	slices.SortFunc(routes, func(a, b *gatewayv1.HTTPRoute) int {
		if d := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); d != 0 {
			return d
		}
		return cmp.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	for rank, rt := range routes {
		attachRoute(c, gateways, rt, rank, &r)
	}

	for _, g := range order {
		key := types.NamespacedName{Namespace: g.gw.Namespace, Name: g.gw.Name}
		r.Gateways[key] = g.status()
		if cg, ok := g.config(); ok {
			r.Config.Gateways = append(r.Config.Gateways, cg)
		}
	}
	slices.SortFunc(r.Config.Gateways, func(a, b ConfigGateway) int { return cmp.Compare(a.Name, b.Name) })
	return r
}

// gateway is one of orch's Gateways as resolved.
type gateway struct {
	gw        *gatewayv1.Gateway
	addresses []gatewayv1.GatewayStatusAddress
	// noAddress says why it has no address; unusable why an address it
	// names cannot be served; unsupported why it is not accepted at all.
	noAddress, unusable, unsupported string
	listeners                        []*listener
}

type listener struct {
	spec     gatewayv1.Listener
	kinds    []gatewayv1.RouteGroupKind
	accepted metav1.Condition
	resolved metav1.Condition
	conflict metav1.Condition
	certs    []string
	attached int32
	routes   []ConfigRoute
}

func (l *listener) valid() bool {
	return l.accepted.Status == metav1.ConditionTrue && l.resolved.Status == metav1.ConditionTrue && l.conflict.Status == metav1.ConditionFalse
}

func resolveGateway(c Cluster, gw *gatewayv1.Gateway) *gateway {
	g := &gateway{gw: gw}
	for _, a := range gw.Spec.Addresses {
		switch {
		case a.Type != nil && *a.Type != gatewayv1.IPAddressType:
			g.unsupported = fmt.Sprintf("address type %q is not supported: orch's Gateways take IPAddress addresses", *a.Type)
		case a.Value != "" && !UsableAddress(a.Value):
			g.unusable = fmt.Sprintf("address %q cannot be served: not a unicast address of a network (loopback, link-local, multicast and unspecified addresses are not)", a.Value)
		}
	}
	if gw.Spec.Infrastructure != nil && gw.Spec.Infrastructure.ParametersRef != nil {
		g.unsupported = "orch's Gateways take no infrastructure parameters"
	}
	if g.unsupported == "" {
		g.addresses, g.noAddress = c.Addresses(gw)
	}
	gen := gw.Generation
	for _, ls := range gw.Spec.Listeners {
		l := &listener{spec: ls,
			accepted: metav1.Condition{Type: string(gatewayv1.ListenerConditionAccepted), Status: metav1.ConditionTrue, Reason: string(gatewayv1.ListenerReasonAccepted), ObservedGeneration: gen},
			resolved: metav1.Condition{Type: string(gatewayv1.ListenerConditionResolvedRefs), Status: metav1.ConditionTrue, Reason: string(gatewayv1.ListenerReasonResolvedRefs), ObservedGeneration: gen},
			conflict: metav1.Condition{Type: string(gatewayv1.ListenerConditionConflicted), Status: metav1.ConditionFalse, Reason: string(gatewayv1.ListenerReasonNoConflicts), ObservedGeneration: gen},
		}
		g.listeners = append(g.listeners, l)
		switch ls.Protocol {
		case gatewayv1.HTTPProtocolType, gatewayv1.HTTPSProtocolType:
		default:
			l.accepted.Status, l.accepted.Reason = metav1.ConditionFalse, string(gatewayv1.ListenerReasonUnsupportedProtocol)
			l.accepted.Message = fmt.Sprintf("protocol %q is not supported: orch's listeners are HTTP and HTTPS", ls.Protocol)
			continue
		}
		// The route kinds it takes: HTTPRoute, the only one orch serves.
		l.kinds = []gatewayv1.RouteGroupKind{{Group: ptr.To(gatewayv1.Group(group)), Kind: kindRoute}}
		if ls.AllowedRoutes != nil && len(ls.AllowedRoutes.Kinds) > 0 {
			l.kinds = nil
			for _, k := range ls.AllowedRoutes.Kinds {
				if (k.Group == nil || *k.Group == group) && k.Kind == kindRoute {
					l.kinds = append(l.kinds, gatewayv1.RouteGroupKind{Group: ptr.To(gatewayv1.Group(group)), Kind: kindRoute})
				} else {
					l.resolved.Status, l.resolved.Reason = metav1.ConditionFalse, string(gatewayv1.ListenerReasonInvalidRouteKinds)
					l.resolved.Message = fmt.Sprintf("route kind %s is not supported: orch serves HTTPRoutes", k.Kind)
				}
			}
		}
		if ls.Protocol == gatewayv1.HTTPSProtocolType {
			resolveCertificates(c, gw, l)
		}
	}
	// Two listeners on one port conflict when their protocols differ or
	// they name the same host.
	for i, a := range g.listeners {
		for j, b := range g.listeners {
			if i == j || a.spec.Port != b.spec.Port || a.accepted.Status != metav1.ConditionTrue || b.accepted.Status != metav1.ConditionTrue {
				continue
			}
			switch {
			case a.spec.Protocol != b.spec.Protocol:
				a.conflict.Status, a.conflict.Reason = metav1.ConditionTrue, string(gatewayv1.ListenerReasonProtocolConflict)
				a.conflict.Message = fmt.Sprintf("listener %s takes port %d with protocol %s", b.spec.Name, b.spec.Port, b.spec.Protocol)
			case hostnameOf(a.spec.Hostname) == hostnameOf(b.spec.Hostname):
				a.conflict.Status, a.conflict.Reason = metav1.ConditionTrue, string(gatewayv1.ListenerReasonHostnameConflict)
				a.conflict.Message = fmt.Sprintf("listener %s takes port %d for the same hostname", b.spec.Name, b.spec.Port)
			}
		}
	}
	return g
}

// resolveCertificates checks an HTTPS listener's certificate references:
// Secrets, in the Gateway's namespace or one whose ReferenceGrant allows
// it, holding a usable certificate.
func resolveCertificates(c Cluster, gw *gatewayv1.Gateway, l *listener) {
	invalid := func(reason gatewayv1.ListenerConditionReason, msg string) {
		if l.resolved.Status == metav1.ConditionTrue {
			l.resolved.Status, l.resolved.Reason, l.resolved.Message = metav1.ConditionFalse, string(reason), msg
		}
	}
	tls := l.spec.TLS
	if tls != nil && tls.Mode != nil && *tls.Mode != gatewayv1.TLSModeTerminate {
		l.accepted.Status, l.accepted.Reason = metav1.ConditionFalse, string(gatewayv1.ListenerReasonUnsupportedValue)
		l.accepted.Message = "an HTTPS listener terminates TLS: mode Passthrough is for TLSRoutes, which orch does not serve"
		return
	}
	if tls == nil || len(tls.CertificateRefs) == 0 {
		invalid(gatewayv1.ListenerReasonInvalidCertificateRef, "an HTTPS listener needs a certificate reference")
		return
	}
	for i, ref := range tls.CertificateRefs {
		if ref.Group != nil && *ref.Group != "" || ref.Kind != nil && *ref.Kind != "Secret" {
			invalid(gatewayv1.ListenerReasonInvalidCertificateRef, fmt.Sprintf("certificateRefs[%d]: only core Secrets are supported", i))
			continue
		}
		ns := gw.Namespace
		if ref.Namespace != nil && *ref.Namespace != "" {
			ns = string(*ref.Namespace)
		}
		if ns != gw.Namespace && !granted(c.Grants, group, "Gateway", gw.Namespace, "", "Secret", ns, string(ref.Name)) {
			invalid(gatewayv1.ListenerReasonRefNotPermitted, fmt.Sprintf("certificateRefs[%d]: no ReferenceGrant in namespace %s allows Gateways of %s to use Secret %s", i, ns, gw.Namespace, ref.Name))
			continue
		}
		if err := c.Certificate(ns, string(ref.Name)); err != nil {
			invalid(gatewayv1.ListenerReasonInvalidCertificateRef, fmt.Sprintf("certificateRefs[%d]: Secret %s/%s: %v", i, ns, ref.Name, err))
			continue
		}
		l.certs = append(l.certs, ns+"/"+string(ref.Name))
	}
}

// granted reports whether a ReferenceGrant in the target's namespace lets
// objects of fromGroup/fromKind in fromNS refer to the target.
func granted(grants []*gatewayv1.ReferenceGrant, fromGroup, fromKind, fromNS, toGroup, toKind, toNS, toName string) bool {
	for _, g := range grants {
		if g.Namespace != toNS {
			continue
		}
		from := slices.ContainsFunc(g.Spec.From, func(f gatewayv1.ReferenceGrantFrom) bool {
			return string(f.Group) == fromGroup && string(f.Kind) == fromKind && string(f.Namespace) == fromNS
		})
		to := slices.ContainsFunc(g.Spec.To, func(t gatewayv1.ReferenceGrantTo) bool {
			return string(t.Group) == toGroup && string(t.Kind) == toKind && (t.Name == nil || *t.Name == "" || string(*t.Name) == toName)
		})
		if from && to {
			return true
		}
	}
	return false
}

func (g *gateway) status() gatewayv1.GatewayStatus {
	gen, prior := g.gw.Generation, g.gw.Status.Conditions
	st := gatewayv1.GatewayStatus{Addresses: g.addresses}
	valid := 0
	for _, l := range g.listeners {
		if l.valid() {
			valid++
		}
	}
	accepted := metav1.Condition{Type: string(gatewayv1.GatewayConditionAccepted), Status: metav1.ConditionTrue, Reason: string(gatewayv1.GatewayReasonAccepted), ObservedGeneration: gen}
	programmed := metav1.Condition{Type: string(gatewayv1.GatewayConditionProgrammed), Status: metav1.ConditionTrue, Reason: string(gatewayv1.GatewayReasonProgrammed), ObservedGeneration: gen}
	switch {
	case g.unsupported != "":
		accepted.Status, accepted.Reason, accepted.Message = metav1.ConditionFalse, string(gatewayv1.GatewayReasonUnsupportedAddress), g.unsupported
		if strings.Contains(g.unsupported, "infrastructure") {
			accepted.Reason = string(gatewayv1.GatewayReasonInvalidParameters)
		}
		programmed.Status, programmed.Reason, programmed.Message = metav1.ConditionFalse, string(gatewayv1.GatewayReasonInvalid), g.unsupported
	case valid < len(g.listeners):
		accepted.Reason, accepted.Message = string(gatewayv1.GatewayReasonListenersNotValid), "some listeners are not valid: see their conditions"
		if valid == 0 {
			accepted.Status = metav1.ConditionFalse
			programmed.Status, programmed.Reason, programmed.Message = metav1.ConditionFalse, string(gatewayv1.GatewayReasonInvalid), "no listener is valid"
		}
	}
	switch {
	case programmed.Status != metav1.ConditionTrue:
	case g.unusable != "":
		programmed.Status, programmed.Reason, programmed.Message = metav1.ConditionFalse, string(gatewayv1.GatewayReasonAddressNotUsable), g.unusable
	case g.noAddress != "":
		programmed.Status, programmed.Reason, programmed.Message = metav1.ConditionFalse, string(gatewayv1.GatewayReasonAddressNotAssigned), g.noAddress
	}
	setCondition(&st.Conditions, prior, accepted)
	setCondition(&st.Conditions, prior, programmed)
	for _, l := range g.listeners {
		var before []metav1.Condition
		for _, ls := range g.gw.Status.Listeners {
			if ls.Name == l.spec.Name {
				before = ls.Conditions
			}
		}
		ls := gatewayv1.ListenerStatus{Name: l.spec.Name, SupportedKinds: l.kinds, AttachedRoutes: l.attached, Conditions: []metav1.Condition{}}
		lp := metav1.Condition{Type: string(gatewayv1.ListenerConditionProgrammed), Status: metav1.ConditionTrue, Reason: string(gatewayv1.ListenerReasonProgrammed), ObservedGeneration: gen}
		switch {
		case !l.valid():
			lp.Status, lp.Reason, lp.Message = metav1.ConditionFalse, string(gatewayv1.ListenerReasonInvalid), "the listener is not valid: see its other conditions"
		case programmed.Status != metav1.ConditionTrue:
			lp.Status, lp.Reason, lp.Message = metav1.ConditionFalse, string(gatewayv1.ListenerReasonPending), programmed.Message
		}
		for _, cond := range []metav1.Condition{l.accepted, l.resolved, l.conflict, lp} {
			setCondition(&ls.Conditions, before, cond)
		}
		st.Listeners = append(st.Listeners, ls)
	}
	return st
}

// config is the Gateway as the nodes serve it, when it is programmed.
func (g *gateway) config() (ConfigGateway, bool) {
	if g.unsupported != "" || len(g.addresses) == 0 {
		return ConfigGateway{}, false
	}
	cg := ConfigGateway{Name: g.gw.Namespace + "/" + g.gw.Name}
	for _, a := range g.addresses {
		cg.Addresses = append(cg.Addresses, a.Value)
	}
	for _, l := range g.listeners {
		if !l.valid() {
			continue
		}
		cg.Listeners = append(cg.Listeners, ConfigListener{Name: string(l.spec.Name), Port: int32(l.spec.Port), Protocol: string(l.spec.Protocol),
			Hostname: hostnameOf(l.spec.Hostname), Certificates: l.certs, Routes: l.routes})
	}
	return cg, len(cg.Listeners) > 0
}

// attachRoute attaches a route to the listeners of orch's Gateways it
// names and that take it, and writes its parent statuses.
func attachRoute(c Cluster, gateways map[types.NamespacedName]*gateway, rt *gatewayv1.HTTPRoute, rank int, r *Resolved) {
	key := types.NamespacedName{Namespace: rt.Namespace, Name: rt.Name}
	var rules []ConfigRule
	resolvedRefs := metav1.Condition{Type: string(gatewayv1.RouteConditionResolvedRefs), Status: metav1.ConditionTrue, Reason: string(gatewayv1.RouteReasonResolvedRefs), ObservedGeneration: rt.Generation}
	unresolved := func(reason gatewayv1.RouteConditionReason, msg string) {
		if resolvedRefs.Status == metav1.ConditionTrue {
			resolvedRefs.Status, resolvedRefs.Reason, resolvedRefs.Message = metav1.ConditionFalse, string(reason), msg
		}
	}
	var unsupported string
	resolved := false
	for _, ref := range rt.Spec.ParentRefs {
		if !isGatewayRef(ref) {
			continue
		}
		ns := rt.Namespace
		if ref.Namespace != nil && *ref.Namespace != "" {
			ns = string(*ref.Namespace)
		}
		g := gateways[types.NamespacedName{Namespace: ns, Name: string(ref.Name)}]
		if g == nil {
			continue // not orch's: its controller writes this parent's status
		}
		if !resolved {
			resolved = true
			rules, unsupported = resolveRules(c, rt, unresolved)
		}
		accepted := metav1.Condition{Type: string(gatewayv1.RouteConditionAccepted), Status: metav1.ConditionTrue, Reason: string(gatewayv1.RouteReasonAccepted), ObservedGeneration: rt.Generation}
		reason, msg := attachToGateway(c, g, rt, ref, rank, rules, unsupported == "")
		if reason != "" {
			accepted.Status, accepted.Reason, accepted.Message = metav1.ConditionFalse, string(reason), msg
		}
		if unsupported != "" && accepted.Status == metav1.ConditionTrue {
			accepted.Status, accepted.Reason, accepted.Message = metav1.ConditionFalse, string(gatewayv1.RouteReasonUnsupportedValue), unsupported
		}
		ps := gatewayv1.RouteParentStatus{ParentRef: ref, ControllerName: ControllerName}
		var before []metav1.Condition
		for _, p := range rt.Status.Parents {
			if p.ControllerName == ControllerName && sameParent(p.ParentRef, ref, rt.Namespace) {
				before = p.Conditions
			}
		}
		setCondition(&ps.Conditions, before, accepted)
		setCondition(&ps.Conditions, before, resolvedRefs)
		r.Routes[key] = append(r.Routes[key], ps)
	}
}

// attachToGateway attaches the route to the Gateway's listeners that
// take it, or says why none does.
func attachToGateway(c Cluster, g *gateway, rt *gatewayv1.HTTPRoute, ref gatewayv1.ParentReference, rank int, rules []ConfigRule, serve bool) (gatewayv1.RouteConditionReason, string) {
	var allowed, matched int
	candidates := 0
	for _, l := range g.listeners {
		if ref.SectionName != nil && *ref.SectionName != l.spec.Name || ref.Port != nil && *ref.Port != l.spec.Port {
			continue
		}
		candidates++
		// A listener with unresolved references still counts the routes
		// attached to it (the spec's attachedRoutes), though it serves none.
		if l.accepted.Status != metav1.ConditionTrue || l.conflict.Status != metav1.ConditionFalse || !l.allows(c, g.gw, rt) {
			continue
		}
		allowed++
		hosts, ok := intersect(hostnameOf(l.spec.Hostname), rt.Spec.Hostnames)
		if !ok {
			continue
		}
		matched++
		l.attached++
		if serve && l.valid() {
			l.routes = append(l.routes, ConfigRoute{Name: rt.Namespace + "/" + rt.Name, Order: rank, Hostnames: hosts, Rules: rules})
		}
	}
	switch {
	case candidates == 0:
		return gatewayv1.RouteReasonNoMatchingParent, "the Gateway has no listener of that name and port"
	case allowed == 0:
		return gatewayv1.RouteReasonNotAllowedByListeners, "no listener of the Gateway takes routes of this kind from this namespace"
	case matched == 0:
		return gatewayv1.RouteReasonNoMatchingListenerHostname, "no listener's hostname matches the route's hostnames"
	}
	return "", ""
}

// allows reports whether the listener takes HTTPRoutes of the route's
// namespace.
func (l *listener) allows(c Cluster, gw *gatewayv1.Gateway, rt *gatewayv1.HTTPRoute) bool {
	if len(l.kinds) == 0 {
		return false
	}
	from := gatewayv1.NamespacesFromSame
	var selector *metav1.LabelSelector
	if ar := l.spec.AllowedRoutes; ar != nil && ar.Namespaces != nil {
		if ar.Namespaces.From != nil {
			from = *ar.Namespaces.From
		}
		selector = ar.Namespaces.Selector
	}
	switch from {
	case gatewayv1.NamespacesFromAll:
		return true
	case gatewayv1.NamespacesFromSelector:
		if selector == nil {
			return false
		}
		sel, err := metav1.LabelSelectorAsSelector(selector)
		if err != nil {
			return false
		}
		nsLabels, ok := c.NamespaceLabels(rt.Namespace)
		return ok && sel.Matches(labels.Set(nsLabels))
	default:
		return rt.Namespace == gw.Namespace
	}
}

// resolveRules resolves a route's rules: its backends checked (kind,
// cross-namespace grant, Service and port), their problems reported
// through unresolved, and what in them orch does not serve returned.
func resolveRules(c Cluster, rt *gatewayv1.HTTPRoute, unresolved func(gatewayv1.RouteConditionReason, string)) ([]ConfigRule, string) {
	var rules []ConfigRule
	var unsupported string
	for i, rule := range rt.Spec.Rules {
		cr := ConfigRule{Matches: rule.Matches, Filters: rule.Filters, Timeouts: rule.Timeouts, Retry: rule.Retry}
		if len(cr.Matches) == 0 {
			cr.Matches = []gatewayv1.HTTPRouteMatch{{}}
		}
		if msg := unsupportedFilters(rule.Filters); msg != "" && unsupported == "" {
			unsupported = fmt.Sprintf("spec.rules[%d]: %s", i, msg)
		}
		for j := range cr.Filters {
			if m := cr.Filters[j].RequestMirror; m != nil {
				m = m.DeepCopy()
				cr.Filters[j].RequestMirror = m
				if ns, why := resolveBackend(c, rt, m.BackendRef); why != "" {
					unresolved(gatewayv1.RouteReasonBackendNotFound, fmt.Sprintf("spec.rules[%d].filters[%d]: %s", i, j, why))
				} else {
					m.BackendRef.Namespace = ptr.To(gatewayv1.Namespace(ns))
				}
			}
		}
		for j, b := range rule.BackendRefs {
			cb := ConfigBackend{Weight: 1, Filters: b.Filters}
			if b.Weight != nil {
				cb.Weight = *b.Weight
			}
			if msg := unsupportedFilters(b.Filters); msg != "" && unsupported == "" {
				unsupported = fmt.Sprintf("spec.rules[%d].backendRefs[%d]: %s", i, j, msg)
			}
			ns, why := resolveBackend(c, rt, b.BackendObjectReference)
			if why != "" {
				cb.Invalid = why
				unresolved(reasonOf(why), fmt.Sprintf("spec.rules[%d].backendRefs[%d]: %s", i, j, why))
			} else {
				cb.Service, cb.Port = ns+"/"+string(b.Name), int32(*b.Port)
			}
			cr.Backends = append(cr.Backends, cb)
		}
		rules = append(rules, cr)
	}
	return rules, unsupported
}

// Why a backend cannot be used, which also names the route's reason.
const (
	whyKind       = "only Services are supported backends"
	whyNotGranted = "no ReferenceGrant allows it"
	whyNoService  = "not found"
	whyNoPort     = "a Service backend needs a port"
)

func reasonOf(why string) gatewayv1.RouteConditionReason {
	switch {
	case strings.HasSuffix(why, whyKind):
		return gatewayv1.RouteReasonInvalidKind
	case strings.HasSuffix(why, whyNotGranted):
		return gatewayv1.RouteReasonRefNotPermitted
	}
	return gatewayv1.RouteReasonBackendNotFound
}

// resolveBackend checks one backend reference, returning its namespace
// or why it cannot be used.
func resolveBackend(c Cluster, rt *gatewayv1.HTTPRoute, ref gatewayv1.BackendObjectReference) (string, string) {
	ns := rt.Namespace
	if ref.Namespace != nil && *ref.Namespace != "" {
		ns = string(*ref.Namespace)
	}
	name := fmt.Sprintf("backend %s/%s", ns, ref.Name)
	switch {
	case ref.Group != nil && *ref.Group != "" || ref.Kind != nil && *ref.Kind != "Service":
		return "", name + ": " + whyKind
	case ns != rt.Namespace && !granted(c.Grants, group, kindRoute, rt.Namespace, "", "Service", ns, string(ref.Name)):
		return "", name + ": " + whyNotGranted
	case ref.Port == nil:
		return "", name + ": " + whyNoPort
	}
	svc := c.Service(ns, string(ref.Name))
	if svc == nil {
		return "", name + ": " + whyNoService
	}
	if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == int32(*ref.Port) }) {
		return "", fmt.Sprintf("%s: port %d %s", name, *ref.Port, whyNoService)
	}
	return ns, ""
}

// unsupportedFilters names a filter orch does not serve.
func unsupportedFilters(filters []gatewayv1.HTTPRouteFilter) string {
	for _, f := range filters {
		switch f.Type {
		case gatewayv1.HTTPRouteFilterRequestHeaderModifier, gatewayv1.HTTPRouteFilterResponseHeaderModifier,
			gatewayv1.HTTPRouteFilterRequestRedirect, gatewayv1.HTTPRouteFilterURLRewrite, gatewayv1.HTTPRouteFilterRequestMirror,
			gatewayv1.HTTPRouteFilterCORS:
		default:
			return fmt.Sprintf("filter %s is not supported", f.Type)
		}
	}
	return ""
}

func isGatewayRef(ref gatewayv1.ParentReference) bool {
	return (ref.Group == nil || *ref.Group == group) && (ref.Kind == nil || *ref.Kind == "Gateway")
}

// sameParent compares parent references with their defaults applied.
func sameParent(a, b gatewayv1.ParentReference, routeNS string) bool {
	norm := func(r gatewayv1.ParentReference) string {
		ns := routeNS
		if r.Namespace != nil && *r.Namespace != "" {
			ns = string(*r.Namespace)
		}
		var section string
		if r.SectionName != nil {
			section = string(*r.SectionName)
		}
		var port int32
		if r.Port != nil {
			port = int32(*r.Port)
		}
		return fmt.Sprintf("%s/%s#%s:%d", ns, r.Name, section, port)
	}
	return isGatewayRef(a) && isGatewayRef(b) && norm(a) == norm(b)
}

func hostnameOf(h *gatewayv1.Hostname) string {
	if h == nil {
		return ""
	}
	return strings.ToLower(string(*h))
}

// intersect narrows a route's hostnames by its listener's: each of the
// route's that the listener's takes, the more specific of the two
// (*.example.com and foo.example.com give foo.example.com). No hostnames
// on either side means any; ok is false when none is left.
func intersect(listener string, route []gatewayv1.Hostname) ([]string, bool) {
	if len(route) == 0 {
		if listener == "" {
			return nil, true
		}
		return []string{listener}, true
	}
	var out []string
	for _, h := range route {
		rh := strings.ToLower(string(h))
		switch {
		case listener == "":
			out = append(out, rh)
		case HostMatches(listener, rh):
			out = append(out, rh)
		case HostMatches(rh, listener):
			out = append(out, listener)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), len(out) > 0
}

// HostMatches reports whether pattern (a name, or *.domain for its
// subdomains at any depth) takes name (which may itself be a wildcard,
// taken when it is no broader than pattern).
func HostMatches(pattern, name string) bool {
	if pattern == name {
		return true
	}
	if suffix, ok := strings.CutPrefix(pattern, "*"); ok {
		return strings.HasSuffix(name, suffix) && len(name) > len(suffix)
	}
	return false
}

// setCondition puts cond in conds, keeping the transition time of the
// same condition in prior when its status has not changed.
func setCondition(conds *[]metav1.Condition, prior []metav1.Condition, cond metav1.Condition) {
	cond.LastTransitionTime = metav1.Now()
	if old := meta.FindStatusCondition(prior, cond.Type); old != nil && old.Status == cond.Status {
		cond.LastTransitionTime = old.LastTransitionTime
	}
	*conds = append(*conds, cond)
}

// UsableAddress reports whether a Gateway may be served at ip: a unicast
// address of a network, which a Service may take as an external IP.
func UsableAddress(ip string) bool {
	a, err := netip.ParseAddr(ip)
	return err == nil && !a.IsLoopback() && !a.IsUnspecified() && !a.IsLinkLocalUnicast() && !a.IsMulticast() && !a.IsLinkLocalMulticast()
}

// CheckCertificate says why a Secret holds no usable certificate and key
// (nil when it does).
func CheckCertificate(s *corev1.Secret) error {
	cert, key := s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey]
	if len(cert) == 0 || len(key) == 0 {
		return fmt.Errorf("no %s and %s", corev1.TLSCertKey, corev1.TLSPrivateKeyKey)
	}
	if _, err := tls.X509KeyPair(cert, key); err != nil {
		return fmt.Errorf("its certificate and key: %w", err)
	}
	return nil
}
