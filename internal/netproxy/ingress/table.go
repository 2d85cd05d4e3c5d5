package ingress

import (
	"cmp"
	"crypto/tls"
	"fmt"
	"net"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/orch-dev/orch/internal/gatewayapi"
	"github.com/orch-dev/orch/internal/ingressclass"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/types"
)

// backend is where a matched request goes: a Service's port, resolved
// when the table was built to the ready endpoints behind it.
type backend struct {
	service types.NamespacedName
	port    networkingv1.ServiceBackendPort
	// endpoints are the ready addresses (ip:port) the request may go to.
	endpoints []string
	// h2c: the Service port speaks HTTP/2 without TLS (appProtocol
	// kubernetes.io/h2c, as gRPC servers do).
	h2c bool
	// problem is why nothing can serve it (no such Service or port), for
	// the 503's body and the logs; "" when the Service is there.
	problem string
	// next spreads requests over the endpoints in turn.
	next atomic.Uint32
}

// route is one path of one rule.
type route struct {
	// path is the path as matched: for a prefix, without its trailing
	// slash ("" matches every path).
	path    string
	exact   bool
	backend *backend
	// ingress names the Ingress it came from, and order its age: of two
	// routes for one path, the older Ingress's wins, as controllers do.
	ingress string
	order   int
}

// matches reports whether the request path p is the route's: Exact
// compares whole paths; Prefix compares elements, so /foo matches /foo
// and /foo/bar but not /foobar.
func (r *route) matches(p string) bool {
	if r.exact {
		return p == r.path
	}
	return r.path == "" || p == r.path || strings.HasPrefix(p, r.path+"/")
}

// routes are one host's, the most specific first: longer paths before
// shorter, Exact before Prefix of the same path, older Ingresses first.
type routes []route

func (rs routes) match(path string) *route {
	for i := range rs {
		if rs[i].matches(path) {
			return &rs[i]
		}
	}
	return nil
}

func (rs routes) sort() {
	slices.SortStableFunc(rs, func(a, b route) int {
		if c := cmp.Compare(len(b.path), len(a.path)); c != 0 {
			return c
		}
		if a.exact != b.exact {
			if a.exact {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.order, b.order)
	})
}

// table is everything the proxy routes by, built whole from the cluster's
// objects and swapped in at once.
type table struct {
	// exact holds the routes of each host named in full; wildcard those of
	// each *.domain by its domain; anyHost the rules that name no host.
	exact, wildcard map[string]routes
	anyHost         routes
	// defaultBackend is the oldest served Ingress's spec.defaultBackend.
	defaultBackend *backend
	// certs are the TLS certificates by host (exact, and *.domain by
	// domain); defaultCert serves what names no host of theirs.
	certs, wildcardCerts map[string]*tls.Certificate
	defaultCert          *tls.Certificate
	// ingresses counts the Ingresses served.
	ingresses int
	// sites are the Gateways' listeners by address and port;
	// gatewayPorts the ports they take, with whether each is HTTPS.
	sites        map[siteKey]*site
	gatewayPorts map[int32]bool
	// gateways is the configuration they came from, kept with the table,
	// and gwBackends the Service ports it resolved, by serviceKey.
	gateways   gatewayapi.Config
	gwBackends map[string]*backend
}

// route finds the route of a request: the host's own rules (its exact
// name, then a wildcard of its domain, then the rules for every host)
// and, when none matches, the default backend; nil for none.
func (t *table) route(host, path string) (*route, *backend) {
	host = normalizeHost(host)
	if r := t.exact[host].match(path); r != nil {
		return r, r.backend
	}
	if _, domain, ok := strings.Cut(host, "."); ok {
		if r := t.wildcard[domain].match(path); r != nil {
			return r, r.backend
		}
	}
	if r := t.anyHost.match(path); r != nil {
		return r, r.backend
	}
	return nil, t.defaultBackend
}

// certificate is the TLS certificate for an SNI name.
func (t *table) certificate(name string) *tls.Certificate {
	name = normalizeHost(name)
	if c := t.certs[name]; c != nil {
		return c
	}
	if _, domain, ok := strings.Cut(name, "."); ok {
		if c := t.wildcardCerts[domain]; c != nil {
			return c
		}
	}
	return t.defaultCert
}

// normalizeHost is a Host header or SNI name as rules name hosts: no
// port, lower case, no trailing dot.
func normalizeHost(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return strings.TrimSuffix(strings.ToLower(host), ".")
}

// cluster is what a table is built from.
type cluster struct {
	ingresses []*networkingv1.Ingress
	classes   []*networkingv1.IngressClass
	// gateways are the Gateways as the server resolved them.
	gateways gatewayapi.Config
	// service and slices look a Service and its EndpointSlices up.
	service func(namespace, name string) *corev1.Service
	slices  func(namespace, service string) []*discoveryv1.EndpointSlice
	// certificate is a TLS Secret's certificate, or why there is none.
	certificate func(namespace, name string) (*tls.Certificate, error)
}

// buildProblem is something of the cluster's objects that the table
// leaves out, for the logs.
type buildProblem struct {
	ingress string
	err     error
}

// served are the Ingresses of classes orch's controller serves, oldest
// first.
func served(ingresses []*networkingv1.Ingress, classes []*networkingv1.IngressClass) []*networkingv1.Ingress {
	ours := ingressclass.Ours(classes)
	var out []*networkingv1.Ingress
	for _, in := range ingresses {
		if ours[ingressclass.Of(in)] {
			out = append(out, in)
		}
	}
	slices.SortStableFunc(out, func(a, b *networkingv1.Ingress) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return cmp.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return out
}

// build makes the table of the served Ingresses.
func build(c cluster) (*table, []buildProblem) {
	t := &table{exact: map[string]routes{}, wildcard: map[string]routes{}, certs: map[string]*tls.Certificate{}, wildcardCerts: map[string]*tls.Certificate{}}
	var problems []buildProblem
	backends := map[string]*backend{}
	resolve := func(namespace string, b *networkingv1.IngressBackend) *backend {
		if b.Service == nil {
			return &backend{problem: "a resource backend: orch's Ingress serves Services only"}
		}
		key := namespace + "/" + b.Service.Name + ":" + b.Service.Port.Name + strconv.Itoa(int(b.Service.Port.Number))
		if be, ok := backends[key]; ok {
			return be
		}
		be := resolveService(c, types.NamespacedName{Namespace: namespace, Name: b.Service.Name}, b.Service.Port)
		backends[key] = be
		return be
	}
	ingresses := served(c.ingresses, c.classes)
	t.ingresses = len(ingresses)
	for order, in := range ingresses {
		name := in.Namespace + "/" + in.Name
		if in.Spec.DefaultBackend != nil && t.defaultBackend == nil {
			t.defaultBackend = resolve(in.Namespace, in.Spec.DefaultBackend)
		}
		for _, rule := range in.Spec.Rules {
			if rule.HTTP == nil {
				continue
			}
			var rs routes
			for _, p := range rule.HTTP.Paths {
				r := route{backend: resolve(in.Namespace, &p.Backend), ingress: name, order: order}
				switch {
				case p.PathType != nil && *p.PathType == networkingv1.PathTypeExact:
					r.path, r.exact = p.Path, true
				default: // Prefix, and ImplementationSpecific taken as Prefix
					r.path = strings.TrimRight(p.Path, "/")
				}
				rs = append(rs, r)
			}
			host := strings.ToLower(rule.Host)
			switch {
			case host == "":
				t.anyHost = append(t.anyHost, rs...)
			case strings.HasPrefix(host, "*."):
				t.wildcard[host[2:]] = append(t.wildcard[host[2:]], rs...)
			default:
				t.exact[host] = append(t.exact[host], rs...)
			}
		}
		for _, tl := range in.Spec.TLS {
			if tl.SecretName == "" {
				continue
			}
			cert, err := c.certificate(in.Namespace, tl.SecretName)
			if err != nil {
				problems = append(problems, buildProblem{name, fmt.Errorf("TLS secret %s: %w", tl.SecretName, err)})
				continue
			}
			hosts := tl.Hosts
			if len(hosts) == 0 {
				if t.defaultCert == nil {
					t.defaultCert = cert
				}
				continue
			}
			for _, h := range hosts {
				h = strings.ToLower(h)
				certs, key := t.certs, h
				if strings.HasPrefix(h, "*.") {
					certs, key = t.wildcardCerts, h[2:]
				}
				if certs[key] == nil {
					certs[key] = cert
				}
			}
		}
	}
	for _, rs := range t.exact {
		rs.sort()
	}
	for _, rs := range t.wildcard {
		rs.sort()
	}
	t.anyHost.sort()
	t.gateways = c.gateways
	var gwProblems []buildProblem
	t.gwBackends = map[string]*backend{}
	t.sites, gwProblems = buildGateways(c.gateways, c, resolver(c, t.gwBackends))
	t.gatewayPorts = gatewayPorts(c.gateways)
	return t, append(problems, gwProblems...)
}

// gatewayPorts are the ports of the Gateways' listeners, with whether
// each is HTTPS (of two Gateways that disagree on a port, the first's).
func gatewayPorts(cfg gatewayapi.Config) map[int32]bool {
	ports := map[int32]bool{}
	for _, g := range cfg.Gateways {
		for _, l := range g.Listeners {
			if _, ok := ports[l.Port]; !ok {
				ports[l.Port] = l.Protocol == string(gatewayv1.HTTPSProtocolType)
			}
		}
	}
	return ports
}

// resolveService finds the Service port a backend names and its ready
// endpoints.
func resolveService(c cluster, svcName types.NamespacedName, port networkingv1.ServiceBackendPort) *backend {
	be := &backend{service: svcName, port: port}
	svc := c.service(svcName.Namespace, svcName.Name)
	if svc == nil {
		be.problem = fmt.Sprintf("service %q not found", svcName.String())
		return be
	}
	var sp *corev1.ServicePort
	for i := range svc.Spec.Ports {
		p := &svc.Spec.Ports[i]
		if port.Name != "" && p.Name == port.Name || port.Name == "" && p.Port == port.Number {
			sp = p
			break
		}
	}
	if sp == nil {
		be.problem = fmt.Sprintf("service %q has no port %s", svcName.String(), portString(port))
		return be
	}
	be.h2c = sp.AppProtocol != nil && *sp.AppProtocol == "kubernetes.io/h2c"
	seen := map[string]bool{}
	for _, slice := range c.slices(svcName.Namespace, svcName.Name) {
		var target int32
		for _, p := range slice.Ports {
			if p.Port != nil && (p.Name == nil && sp.Name == "" || p.Name != nil && *p.Name == sp.Name) &&
				(p.Protocol == nil || *p.Protocol == corev1.ProtocolTCP) {
				target = *p.Port
			}
		}
		if target == 0 {
			continue
		}
		for _, ep := range slice.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, addr := range ep.Addresses {
				hp := net.JoinHostPort(addr, strconv.Itoa(int(target)))
				if !seen[hp] {
					seen[hp] = true
					be.endpoints = append(be.endpoints, hp)
				}
			}
		}
	}
	slices.Sort(be.endpoints)
	return be
}

func portString(p networkingv1.ServiceBackendPort) string {
	if p.Name != "" {
		return strconv.Quote(p.Name)
	}
	return strconv.Itoa(int(p.Number))
}
