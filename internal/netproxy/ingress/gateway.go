package ingress

import (
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/orch-dev/orch/internal/gatewayapi"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/types"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// siteKey is where a Gateway is reached: one of its addresses and a
// listener port.
type siteKey struct {
	addr string
	port int32
}

// site is what is served at one address and port: the listeners of one
// Gateway on that port, the most specific hostname first.
type site struct {
	gateway   string
	listeners []*gwListener
}

type gwListener struct {
	name, hostname string
	https          bool
	// certs are the listener's certificates, the first the default.
	certs   []*tls.Certificate
	entries []*gwEntry
}

// gwEntry is one match of one rule of one route.
type gwEntry struct {
	route     string
	order     int
	rule      int
	index     int
	hostnames []string
	match     gatewayv1.HTTPRouteMatch
	pathRE    *regexp.Regexp
	headerREs map[int]*regexp.Regexp
	do        *gwRule
}

type gwRule struct {
	filters  []gatewayv1.HTTPRouteFilter
	backends []*gwBackend
	weights  int32
	// requestTimeout and backendTimeout are the rule's timeouts (0 for
	// none), parsed once.
	requestTimeout, backendTimeout time.Duration
	retry                          *gatewayv1.HTTPRouteRetry
	mirrors                        []*gwMirror
}

// timeout is a Gateway API duration, 0 when unset or not one.
func timeout(d *gatewayv1.Duration) time.Duration {
	if d == nil {
		return 0
	}
	parsed, err := time.ParseDuration(string(*d))
	if err != nil || parsed < 0 {
		return 0
	}
	return parsed
}

type gwBackend struct {
	*backend
	weight  int32
	filters []gatewayv1.HTTPRouteFilter
	invalid string
}

type gwMirror struct {
	backend *backend
	// percent of requests mirrored (100 when not said).
	percent float64
}

// listener picks the listener for a request's host: the one whose
// hostname matches it most specifically.
func (s *site) listener(host string) *gwListener {
	for _, l := range s.listeners {
		if l.hostname == "" || gatewayapi.HostMatches(l.hostname, host) {
			return l
		}
	}
	return nil
}

// hostScore ranks how an entry's hostnames match host: an exact name
// above any wildcard, a longer wildcard above a shorter, any host last;
// -1 when none matches.
func hostScore(hostnames []string, host string) int {
	if len(hostnames) == 0 {
		return 0
	}
	best := -1
	for _, h := range hostnames {
		switch {
		case h == host:
			return 1 << 20
		case gatewayapi.HostMatches(h, host):
			best = max(best, len(h))
		}
	}
	return best
}

// route finds the entry for a request, by the precedence the Gateway API
// gives: hostname, then (within the entries' static order) path,
// method, headers, query parameters, route age and rule order.
func (l *gwListener) route(r *http.Request, host string) *gwEntry {
	var best *gwEntry
	bestScore := -1
	for _, e := range l.entries {
		score := hostScore(e.hostnames, host)
		if score <= bestScore || !e.matches(r) {
			continue
		}
		best, bestScore = e, score
	}
	return best
}

func (e *gwEntry) matches(r *http.Request) bool {
	if p := e.match.Path; p != nil && p.Value != nil {
		typ := gatewayv1.PathMatchPathPrefix
		if p.Type != nil {
			typ = *p.Type
		}
		switch typ {
		case gatewayv1.PathMatchExact:
			if r.URL.Path != *p.Value {
				return false
			}
		case gatewayv1.PathMatchRegularExpression:
			if e.pathRE == nil || !e.pathRE.MatchString(r.URL.Path) {
				return false
			}
		default:
			prefix := strings.TrimRight(*p.Value, "/")
			if prefix != "" && r.URL.Path != prefix && !strings.HasPrefix(r.URL.Path, prefix+"/") {
				return false
			}
		}
	}
	if m := e.match.Method; m != nil && string(*m) != r.Method {
		return false
	}
	for i, h := range e.match.Headers {
		v, ok := r.Header[http.CanonicalHeaderKey(string(h.Name))]
		if !ok {
			return false
		}
		got := strings.Join(v, ",")
		if h.Type != nil && *h.Type == gatewayv1.HeaderMatchRegularExpression {
			if re := e.headerREs[i]; re == nil || !re.MatchString(got) {
				return false
			}
		} else if got != h.Value {
			return false
		}
	}
	if len(e.match.QueryParams) > 0 {
		q := r.URL.Query()
		for _, qp := range e.match.QueryParams {
			if !q.Has(string(qp.Name)) || q.Get(string(qp.Name)) != qp.Value {
				return false
			}
		}
	}
	return true
}

// compareEntries is the static precedence of the spec: an Exact path
// before any prefix, a longer prefix before a shorter, then a method
// match, more header matches, more query matches, the older route, the
// earlier rule and match.
func compareEntries(a, b *gwEntry) int {
	kind := func(e *gwEntry) (int, int) {
		p := e.match.Path
		if p == nil || p.Value == nil {
			return 2, 1
		}
		switch {
		case p.Type != nil && *p.Type == gatewayv1.PathMatchExact:
			return 0, len(*p.Value)
		case p.Type != nil && *p.Type == gatewayv1.PathMatchRegularExpression:
			return 1, len(*p.Value)
		}
		return 2, len(*p.Value)
	}
	ak, al := kind(a)
	bk, bl := kind(b)
	if c := cmp.Compare(ak, bk); c != 0 {
		return c
	}
	if c := cmp.Compare(bl, al); c != 0 {
		return c
	}
	am, bm := a.match.Method != nil, b.match.Method != nil
	if am != bm {
		if am {
			return -1
		}
		return 1
	}
	if c := cmp.Compare(len(b.match.Headers), len(a.match.Headers)); c != 0 {
		return c
	}
	if c := cmp.Compare(len(b.match.QueryParams), len(a.match.QueryParams)); c != 0 {
		return c
	}
	if c := cmp.Compare(a.order, b.order); c != 0 {
		return c
	}
	if c := cmp.Compare(a.rule, b.rule); c != 0 {
		return c
	}
	return cmp.Compare(a.index, b.index)
}

// buildGateways makes the sites of the nodes' Gateway configuration.
func buildGateways(cfg gatewayapi.Config, c cluster, resolve func(namespace, name string, port int32) *backend) (map[siteKey]*site, []buildProblem) {
	sites := map[siteKey]*site{}
	var problems []buildProblem
	for _, g := range cfg.Gateways {
		byPort := map[int32]*site{}
		for _, ls := range g.Listeners {
			l := &gwListener{name: ls.Name, hostname: strings.ToLower(ls.Hostname), https: ls.Protocol == string(gatewayv1.HTTPSProtocolType)}
			for _, ref := range ls.Certificates {
				ns, name, _ := strings.Cut(ref, "/")
				cert, err := c.certificate(ns, name)
				if err != nil {
					problems = append(problems, buildProblem{g.Name, fmt.Errorf("listener %s: TLS secret %s: %w", ls.Name, ref, err)})
					continue
				}
				l.certs = append(l.certs, cert)
			}
			for _, rt := range ls.Routes {
				for ri, rule := range rt.Rules {
					do := buildRule(rule, resolve, &problems, rt.Name)
					for mi, m := range rule.Matches {
						e := &gwEntry{route: rt.Name, order: rt.Order, rule: ri, index: mi, hostnames: rt.Hostnames, match: m, do: do}
						if m.Path != nil && m.Path.Type != nil && *m.Path.Type == gatewayv1.PathMatchRegularExpression && m.Path.Value != nil {
							if re, err := regexp.Compile(*m.Path.Value); err == nil {
								e.pathRE = re
							}
						}
						for hi, h := range m.Headers {
							if h.Type != nil && *h.Type == gatewayv1.HeaderMatchRegularExpression {
								if re, err := regexp.Compile(h.Value); err == nil {
									if e.headerREs == nil {
										e.headerREs = map[int]*regexp.Regexp{}
									}
									e.headerREs[hi] = re
								}
							}
						}
						l.entries = append(l.entries, e)
					}
				}
			}
			slices.SortStableFunc(l.entries, compareEntries)
			s := byPort[ls.Port]
			if s == nil {
				s = &site{gateway: g.Name}
				byPort[ls.Port] = s
			}
			s.listeners = append(s.listeners, l)
		}
		for port, s := range byPort {
			// The most specific hostname first: exact names, then
			// wildcards (longer first), then the listener for any host.
			slices.SortStableFunc(s.listeners, func(a, b *gwListener) int {
				rank := func(l *gwListener) (int, int) {
					switch {
					case l.hostname == "":
						return 2, 0
					case strings.HasPrefix(l.hostname, "*"):
						return 1, -len(l.hostname)
					}
					return 0, 0
				}
				ar, al := rank(a)
				br, bl := rank(b)
				if c := cmp.Compare(ar, br); c != 0 {
					return c
				}
				return cmp.Compare(al, bl)
			})
			for _, addr := range g.Addresses {
				sites[siteKey{addr, port}] = s
			}
		}
	}
	return sites, problems
}

func buildRule(rule gatewayapi.ConfigRule, resolve func(namespace, name string, port int32) *backend, problems *[]buildProblem, route string) *gwRule {
	do := &gwRule{filters: rule.Filters, retry: rule.Retry}
	if t := rule.Timeouts; t != nil {
		do.requestTimeout, do.backendTimeout = timeout(t.Request), timeout(t.BackendRequest)
	}
	for _, b := range rule.Backends {
		gb := &gwBackend{weight: b.Weight, filters: b.Filters, invalid: b.Invalid}
		if b.Invalid == "" {
			ns, name, _ := strings.Cut(b.Service, "/")
			gb.backend = resolve(ns, name, b.Port)
		}
		do.backends = append(do.backends, gb)
		do.weights += max(b.Weight, 0)
	}
	for _, f := range rule.Filters {
		if f.Type != gatewayv1.HTTPRouteFilterRequestMirror || f.RequestMirror == nil {
			continue
		}
		m := f.RequestMirror
		if m.BackendRef.Port == nil || m.BackendRef.Namespace == nil {
			*problems = append(*problems, buildProblem{route, fmt.Errorf("a mirror backend that cannot be resolved")})
			continue
		}
		percent := 100.0
		switch {
		case m.Percent != nil:
			percent = float64(*m.Percent)
		case m.Fraction != nil:
			den := int32(100)
			if m.Fraction.Denominator != nil && *m.Fraction.Denominator > 0 {
				den = *m.Fraction.Denominator
			}
			percent = 100 * float64(m.Fraction.Numerator) / float64(den)
		}
		do.mirrors = append(do.mirrors, &gwMirror{backend: resolve(string(*m.BackendRef.Namespace), string(m.BackendRef.Name), int32(*m.BackendRef.Port)), percent: percent})
	}
	return do
}

// backendKey names a Service port: namespace/name:port.
func serviceKey(namespace, name string, port int32) string {
	return namespace + "/" + name + ":" + strconv.Itoa(int(port))
}

// resolver resolves Service backends once per table, into seen.
func resolver(c cluster, seen map[string]*backend) func(namespace, name string, port int32) *backend {
	return func(namespace, name string, port int32) *backend {
		key := serviceKey(namespace, name, port)
		if be, ok := seen[key]; ok {
			return be
		}
		be := resolveService(c, types.NamespacedName{Namespace: namespace, Name: name}, networkingv1.ServiceBackendPort{Number: port})
		seen[key] = be
		return be
	}
}

// pick chooses a backend by weight; nil when every weight is zero.
func (r *gwRule) pick() *gwBackend {
	if r.weights <= 0 {
		return nil
	}
	n := rand.Int32N(r.weights)
	for _, b := range r.backends {
		if b.weight <= 0 {
			continue
		}
		if n < b.weight {
			return b
		}
		n -= b.weight
	}
	return nil
}

// serveGateway serves a request that came to a Gateway's address.
func (p *Proxy) serveGateway(w http.ResponseWriter, r *http.Request, s *site, port int32, tlsConn bool) {
	host := normalizeHost(r.Host)
	l := s.listener(host)
	if l == nil || l.https != tlsConn {
		http.Error(w, "404 page not found: no listener of Gateway "+s.gateway+" takes "+host, http.StatusNotFound)
		return
	}
	if tlsConn && r.TLS != nil && r.TLS.ServerName != "" {
		// A connection made for one listener's name may not be reused
		// for another's (HTTP/2 connection coalescing).
		if sl := s.listener(normalizeHost(r.TLS.ServerName)); sl != l {
			http.Error(w, "421 misdirected request", http.StatusMisdirectedRequest)
			return
		}
	}
	e := l.route(r, host)
	if e == nil {
		http.Error(w, "404 page not found: no HTTPRoute of Gateway "+s.gateway+" matches "+host+r.URL.Path, http.StatusNotFound)
		return
	}
	if d := e.do.requestTimeout; d > 0 {
		ctx, cancel := context.WithTimeout(r.Context(), d)
		defer cancel()
		r = r.WithContext(ctx)
	}
	// The filters change the request in place: the handler owns it, and
	// the reverse proxy copies it for the backend.
	var respFilters []*gatewayv1.HTTPHeaderFilter
	for _, f := range e.do.filters {
		switch f.Type {
		case gatewayv1.HTTPRouteFilterRequestRedirect:
			redirect(w, r, e, f.RequestRedirect, port, tlsConn)
			return
		case gatewayv1.HTTPRouteFilterRequestHeaderModifier:
			modifyHeaders(r.Header, f.RequestHeaderModifier)
		case gatewayv1.HTTPRouteFilterResponseHeaderModifier:
			respFilters = append(respFilters, f.ResponseHeaderModifier)
		case gatewayv1.HTTPRouteFilterURLRewrite:
			rewriteURL(r, e, f.URLRewrite)
		case gatewayv1.HTTPRouteFilterCORS:
			if f.CORS == nil {
				continue
			}
			if corsPreflight(w, r, f.CORS) {
				return
			}
			if h := corsResponse(f.CORS, r.Header.Get("Origin")); h != nil {
				respFilters = append(respFilters, h)
			}
		}
	}
	for _, m := range e.do.mirrors {
		p.mirror(r, m)
	}
	b := e.do.pick()
	switch {
	case b == nil || b.invalid != "":
		why := "no backend"
		if b != nil {
			why = b.invalid
		}
		http.Error(w, "500 internal server error: "+why, http.StatusInternalServerError)
		return
	case len(b.endpoints) == 0:
		b.unavailable(w)
		return
	}
	for _, f := range b.filters {
		switch f.Type {
		case gatewayv1.HTTPRouteFilterRequestHeaderModifier:
			modifyHeaders(r.Header, f.RequestHeaderModifier)
		case gatewayv1.HTTPRouteFilterResponseHeaderModifier:
			respFilters = append(respFilters, f.ResponseHeaderModifier)
		}
	}
	ctx := r.Context()
	if len(respFilters) > 0 {
		ctx = withResponseFilters(ctx, respFilters)
	}
	if e.do.retry != nil {
		ctx = context.WithValue(ctx, retryKey{}, e.do.retry)
	}
	if d := e.do.backendTimeout; d > 0 {
		ctx = withBackendTimeout(ctx, d)
	}
	p.proxy.ServeHTTP(w, r.WithContext(withBackend(ctx, b.backend)))
}

// modifyHeaders applies a header filter: set replaces, add appends,
// remove deletes (names are case-insensitive).
func modifyHeaders(h http.Header, f *gatewayv1.HTTPHeaderFilter) {
	if f == nil {
		return
	}
	for _, s := range f.Set {
		h.Set(string(s.Name), s.Value)
	}
	for _, a := range f.Add {
		h.Add(string(a.Name), a.Value)
	}
	for _, name := range f.Remove {
		h.Del(name)
	}
}

// matchedPrefix is the path prefix an entry matched, for
// ReplacePrefixMatch ("" when it matched no prefix).
func (e *gwEntry) matchedPrefix() (string, bool) {
	p := e.match.Path
	if p == nil || p.Value == nil || p.Type != nil && *p.Type != gatewayv1.PathMatchPathPrefix {
		return "", p == nil || p.Value == nil
	}
	return strings.TrimRight(*p.Value, "/"), true
}

// replacePath is the path a path modifier makes of path.
func replacePath(e *gwEntry, path string, m *gatewayv1.HTTPPathModifier) string {
	switch {
	case m.Type == gatewayv1.FullPathHTTPPathModifier && m.ReplaceFullPath != nil:
		return *m.ReplaceFullPath
	case m.Type == gatewayv1.PrefixMatchHTTPPathModifier && m.ReplacePrefixMatch != nil:
		prefix, ok := e.matchedPrefix()
		if !ok {
			return path
		}
		rest := strings.TrimPrefix(path, prefix)
		repl := strings.TrimRight(*m.ReplacePrefixMatch, "/")
		out := repl + rest
		if out == "" {
			return "/"
		}
		if !strings.HasPrefix(out, "/") {
			out = "/" + out
		}
		return out
	}
	return path
}

func rewriteURL(r *http.Request, e *gwEntry, f *gatewayv1.HTTPURLRewriteFilter) {
	if f == nil {
		return
	}
	if f.Hostname != nil {
		r.Host = string(*f.Hostname)
	}
	if f.Path != nil {
		r.URL.Path = replacePath(e, r.URL.Path, f.Path)
		r.URL.RawPath = ""
	}
}

// redirect answers with the redirect a RequestRedirect filter describes.
func redirect(w http.ResponseWriter, r *http.Request, e *gwEntry, f *gatewayv1.HTTPRequestRedirectFilter, port int32, tlsConn bool) {
	scheme := "http"
	if tlsConn {
		scheme = "https"
	}
	host := r.Host
	if h, _, ok := strings.Cut(host, ":"); ok {
		host = h
	}
	if f.Hostname != nil {
		host = string(*f.Hostname)
	}
	outPort := port
	if f.Scheme != nil && *f.Scheme != scheme {
		scheme = *f.Scheme
		outPort = 0 // the new scheme's well-known port
	}
	if f.Port != nil {
		outPort = int32(*f.Port)
	}
	if outPort == 80 && scheme == "http" || outPort == 443 && scheme == "https" {
		outPort = 0
	}
	u := url.URL{Scheme: scheme, Host: host, Path: r.URL.Path, RawQuery: r.URL.RawQuery}
	if outPort != 0 {
		u.Host = host + ":" + strconv.Itoa(int(outPort))
	}
	if f.Path != nil {
		u.Path = replacePath(e, r.URL.Path, f.Path)
	}
	code := http.StatusFound
	if f.StatusCode != nil {
		code = *f.StatusCode
	}
	w.Header().Set("Location", u.String())
	w.WriteHeader(code)
}
