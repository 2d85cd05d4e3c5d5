// Package aggregator is Kubernetes' API aggregation (kube-aggregator)
// inside orch's API server: an APIService names a group/version that a
// Service in the cluster serves; requests for it are authenticated and
// authorized by orch, then proxied to one of the Service's ready
// endpoints over TLS (verified against the APIService's caBundle) with a
// front-proxy client certificate and the user in X-Remote-* headers,
// which the extension server trusts through the
// extension-apiserver-authentication ConfigMap, as on Kubernetes. A loop
// checks each APIService (its Service, its endpoints, its discovery) and
// reports it in status; an unavailable one answers 503. Its discovery is
// merged into orch's.
package aggregator

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/orch-dev/orch/internal/api/auth"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"
)

// Services finds and reaches what serves an aggregated group/version.
type Services interface {
	// ResolveService is the address (host:port) of a ready endpoint of
	// the Service's port; its errors are Kubernetes StatusErrors (NotFound
	// for a missing Service, ServiceUnavailable for no endpoint).
	ResolveService(ctx context.Context, namespace, name string, port int32) (string, error)
	DialContext(ctx context.Context, network, addr string) (net.Conn, error)
}

// Aggregator proxies the aggregated group/versions and keeps their
// availability and discovery.
type Aggregator struct {
	services Services
	// clientCert is the front-proxy client certificate of the moment.
	clientCert func() *tls.Certificate
	log        *slog.Logger

	mu      sync.RWMutex
	remotes map[schema.GroupVersion]*remote
	// changed wakes the availability loop.
	changed chan struct{}
}

// remote is one APIService a Service serves.
type remote struct {
	name            string
	gv              schema.GroupVersion
	service         apiregistrationv1.ServiceReference
	caBundle        []byte
	insecure        bool
	groupPriority   int32
	versionPriority int32
	// status is the Available condition as stored.
	status    apiregistrationv1.APIServiceCondition
	transport *http.Transport
	// resources is the last discovery the Service answered.
	resources []metav1.APIResource
}

// New makes an aggregator reaching services with the front-proxy client
// certificate clientCert gives.
func New(services Services, clientCert func() *tls.Certificate, log *slog.Logger) *Aggregator {
	return &Aggregator{services: services, clientCert: clientCert, log: log, remotes: map[schema.GroupVersion]*remote{}, changed: make(chan struct{}, 1)}
}

// Replace follows the stored APIServices after a fresh list.
func (a *Aggregator) Replace(objs []runtime.Object) {
	a.mu.Lock()
	old := a.remotes
	a.remotes = map[schema.GroupVersion]*remote{}
	for _, obj := range objs {
		a.setLocked(obj.(*apiregistrationv1.APIService), old)
	}
	a.mu.Unlock()
	a.wake()
}

// Set follows a created or changed APIService.
func (a *Aggregator) Set(obj runtime.Object) {
	a.mu.Lock()
	s := obj.(*apiregistrationv1.APIService)
	before := a.remotesCopyLocked()
	for k, r := range a.remotes {
		if r.name == s.Name {
			delete(a.remotes, k)
		}
	}
	a.setLocked(s, before)
	a.mu.Unlock()
	a.wake()
}

// Delete follows a deleted APIService.
func (a *Aggregator) Delete(obj runtime.Object) {
	s := obj.(*apiregistrationv1.APIService)
	a.mu.Lock()
	for k, r := range a.remotes {
		if r.name == s.Name {
			delete(a.remotes, k)
		}
	}
	a.mu.Unlock()
}

func (a *Aggregator) remotesCopyLocked() map[schema.GroupVersion]*remote {
	out := make(map[schema.GroupVersion]*remote, len(a.remotes))
	for k, v := range a.remotes {
		out[k] = v
	}
	return out
}

func (a *Aggregator) wake() {
	select {
	case a.changed <- struct{}{}:
	default:
	}
}

// setLocked records s when a Service serves it; what was known of the
// same spec before (its transport, its discovery) is kept.
func (a *Aggregator) setLocked(s *apiregistrationv1.APIService, before map[schema.GroupVersion]*remote) {
	if s.Spec.Service == nil || s.DeletionTimestamp != nil {
		return
	}
	r := &remote{name: s.Name, gv: schema.GroupVersion{Group: s.Spec.Group, Version: s.Spec.Version}, service: *s.Spec.Service,
		caBundle: s.Spec.CABundle, insecure: s.Spec.InsecureSkipTLSVerify, groupPriority: s.Spec.GroupPriorityMinimum, versionPriority: s.Spec.VersionPriority}
	for _, c := range s.Status.Conditions {
		if c.Type == apiregistrationv1.Available {
			r.status = c
		}
	}
	if prev := before[r.gv]; prev != nil && prev.sameTarget(r) {
		r.transport, r.resources = prev.transport, prev.resources
	} else {
		r.transport = a.newTransport(r)
	}
	a.remotes[r.gv] = r
}

func (r *remote) sameTarget(o *remote) bool {
	return r.name == o.name && r.service.Namespace == o.service.Namespace && r.service.Name == o.service.Name &&
		ptr.Deref(r.service.Port, 443) == ptr.Deref(o.service.Port, 443) && string(r.caBundle) == string(o.caBundle) && r.insecure == o.insecure
}

// newTransport reaches the Service's endpoints over TLS, verifying the
// serving certificate for <service>.<namespace>.svc against the caBundle.
func (a *Aggregator) newTransport(r *remote) *http.Transport {
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(r.caBundle)
	return &http.Transport{
		DialContext: a.services.DialContext,
		TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots, InsecureSkipVerify: r.insecure, //nolint:gosec // the APIService asks for it, as on Kubernetes
			ServerName:           r.service.Name + "." + r.service.Namespace + ".svc",
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return a.clientCert(), nil }},
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 60 * time.Second,
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConnsPerHost:   8,
	}
}

// remoteFor is the APIService a path is under (/apis/<group>/<version>...).
func (a *Aggregator) remoteFor(path string) *remote {
	rest, ok := strings.CutPrefix(path, "/apis/")
	if !ok {
		return nil
	}
	parts := strings.SplitN(rest, "/", 3)
	if len(parts) < 2 {
		return nil
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.remotes[schema.GroupVersion{Group: parts[0], Version: parts[1]}]
}

// Handler serves the aggregated group/versions (proxied to their
// Services) and passes everything else to next. The request has been
// authenticated and authorized; its user is in the context.
func (a *Aggregator) Handler(next http.Handler, writeError func(http.ResponseWriter, *http.Request, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r := a.remoteFor(req.URL.Path)
		if r == nil {
			next.ServeHTTP(w, req)
			return
		}
		a.proxy(w, req, r, writeError)
	})
}

// OpenAPIHandler serves an aggregated group/version's OpenAPI v3
// document (/openapi/v3/apis/<group>/<version>) from its Service, and
// passes everything else to next.
func (a *Aggregator) OpenAPIHandler(next http.Handler, writeError func(http.ResponseWriter, *http.Request, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		path, ok := strings.CutPrefix(req.URL.Path, "/openapi/v3")
		r := a.remoteFor(path)
		if !ok || r == nil {
			next.ServeHTTP(w, req)
			return
		}
		a.proxy(w, req, r, writeError)
	})
}

// proxy passes the request to a ready endpoint of r's Service.
func (a *Aggregator) proxy(w http.ResponseWriter, req *http.Request, r *remote, writeError func(http.ResponseWriter, *http.Request, error)) {
	if r.status.Status != apiregistrationv1.ConditionTrue {
		writeError(w, req, apierrors.NewServiceUnavailable("service unavailable"))
		return
	}
	addr, err := a.services.ResolveService(req.Context(), r.service.Namespace, r.service.Name, ptr.Deref(r.service.Port, 443))
	if err != nil {
		writeError(w, req, apierrors.NewServiceUnavailable(fmt.Sprintf("service unavailable: %v", err)))
		return
	}
	u, _ := auth.UserFrom(req.Context())
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "https", addr
			pr.Out.Host = r.service.Name + "." + r.service.Namespace + ".svc"
			setRemoteUser(pr.Out.Header, u)
		},
		Transport:     r.transport,
		FlushInterval: -1, // watches stream
		ErrorHandler: func(w http.ResponseWriter, req *http.Request, err error) {
			a.log.Warn("aggregated API unreachable", "apiservice", r.name, "err", err)
			writeError(w, req, apierrors.NewServiceUnavailable(fmt.Sprintf("error trying to reach service: %v", err)))
		},
	}
	proxy.ServeHTTP(w, req)
}

// setRemoteUser replaces the client's credentials with the front proxy's
// headers naming the authenticated user, as kube-aggregator sends them.
func setRemoteUser(h http.Header, u auth.User) {
	for k := range h {
		if k == "Authorization" || strings.HasPrefix(k, "Impersonate-") || strings.HasPrefix(k, "X-Remote-") {
			h.Del(k)
		}
	}
	h.Set("X-Remote-User", u.Name)
	if u.UID != "" {
		h.Set("X-Remote-Uid", u.UID)
	}
	for _, g := range u.Groups {
		h.Add("X-Remote-Group", g)
	}
	for k, vs := range u.Extra {
		for _, v := range vs {
			h.Add("X-Remote-Extra-"+url.PathEscape(k), v)
		}
	}
}

// GroupVersion is an aggregated group/version as discovery lists it.
type GroupVersion struct {
	schema.GroupVersion
	GroupPriority, VersionPriority int32
	// Resources is what its Service last said it serves (nil until it
	// answered).
	Resources []metav1.APIResource
	Available bool
}

// GroupVersions are the aggregated group/versions, by group priority
// then version priority, highest first, as Kubernetes orders them.
func (a *Aggregator) GroupVersions() []GroupVersion {
	a.mu.RLock()
	out := make([]GroupVersion, 0, len(a.remotes))
	for _, r := range a.remotes {
		out = append(out, GroupVersion{GroupVersion: r.gv, GroupPriority: r.groupPriority, VersionPriority: r.versionPriority,
			Resources: r.resources, Available: r.status.Status == apiregistrationv1.ConditionTrue})
	}
	a.mu.RUnlock()
	slices.SortFunc(out, func(x, y GroupVersion) int {
		switch {
		case x.GroupPriority != y.GroupPriority:
			return int(y.GroupPriority - x.GroupPriority)
		case x.Group != y.Group:
			return strings.Compare(x.Group, y.Group)
		}
		return int(y.VersionPriority - x.VersionPriority)
	})
	return out
}

// SetStatus writes an APIService's Available condition.
type SetStatus func(ctx context.Context, name string, cond apiregistrationv1.APIServiceCondition) error

// checkEvery is how often each APIService is checked, besides when one
// changes.
const checkEvery = 10 * time.Second

// Run checks the aggregated APIServices until ctx ends: at once when one
// changes, and every 10 seconds, writing what changed with set.
func (a *Aggregator) Run(ctx context.Context, set SetStatus) {
	tick := time.NewTicker(checkEvery)
	defer tick.Stop()
	for {
		a.checkAll(ctx, set)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-a.changed:
		}
	}
}

func (a *Aggregator) checkAll(ctx context.Context, set SetStatus) {
	a.mu.RLock()
	remotes := make([]*remote, 0, len(a.remotes))
	for _, r := range a.remotes {
		remotes = append(remotes, r)
	}
	a.mu.RUnlock()
	for _, r := range remotes {
		cond, resources := a.check(ctx, r)
		a.mu.Lock()
		if cur := a.remotes[r.gv]; cur == r && resources != nil {
			r.resources = resources
		}
		a.mu.Unlock()
		if cond.Status == r.status.Status && cond.Reason == r.status.Reason && cond.Message == r.status.Message {
			continue
		}
		cond.LastTransitionTime = metav1.Now()
		if cond.Status == r.status.Status {
			cond.LastTransitionTime = r.status.LastTransitionTime
		}
		if err := set(ctx, r.name, cond); err != nil && ctx.Err() == nil {
			a.log.Warn("APIService status not written", "apiservice", r.name, "err", err)
		}
	}
}

// check is kube-aggregator's availability check: the Service exists, it
// has a ready endpoint for the port, and its discovery document for the
// group/version answers 2xx to the aggregator's own identity.
func (a *Aggregator) check(ctx context.Context, r *remote) (apiregistrationv1.APIServiceCondition, []metav1.APIResource) {
	unavailable := func(reason, message string) apiregistrationv1.APIServiceCondition {
		return apiregistrationv1.APIServiceCondition{Type: apiregistrationv1.Available, Status: apiregistrationv1.ConditionFalse, Reason: reason, Message: message}
	}
	port := ptr.Deref(r.service.Port, 443)
	addr, err := a.services.ResolveService(ctx, r.service.Namespace, r.service.Name, port)
	switch {
	case apierrors.IsNotFound(err):
		return unavailable("ServiceNotFound", fmt.Sprintf("service/%s in %q is not present", r.service.Name, r.service.Namespace)), nil
	case apierrors.IsServiceUnavailable(err):
		return unavailable("MissingEndpoints", fmt.Sprintf("endpoints for service/%s in %q have no addresses with port %d", r.service.Name, r.service.Namespace, port)), nil
	case err != nil:
		return unavailable("ServiceAccessError", err.Error()), nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	path := "/apis/" + r.gv.Group + "/" + r.gv.Version
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+path, nil)
	if err != nil {
		return unavailable("FailedDiscoveryCheck", err.Error()), nil
	}
	req.Host = r.service.Name + "." + r.service.Namespace + ".svc"
	req.Header.Set("Accept", "application/json")
	setRemoteUser(req.Header, auth.User{Name: "system:kube-aggregator", Groups: []string{auth.GroupMasters}})
	resp, err := r.transport.RoundTrip(req)
	if err != nil {
		return unavailable("FailedDiscoveryCheck", fmt.Sprintf("failing or missing response from https://%s%s: %v", addr, path, err)), nil
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return unavailable("FailedDiscoveryCheck", fmt.Sprintf("failing or missing response from https://%s%s: bad status from https://%s%s: %d", addr, path, addr, path, resp.StatusCode)), nil
	}
	var list metav1.APIResourceList
	if err := json.Unmarshal(body, &list); err != nil {
		return unavailable("FailedDiscoveryCheck", fmt.Sprintf("discovery of https://%s%s is not an APIResourceList: %v", addr, path, err)), nil
	}
	if list.APIResources == nil {
		list.APIResources = []metav1.APIResource{}
	}
	return apiregistrationv1.APIServiceCondition{Type: apiregistrationv1.Available, Status: apiregistrationv1.ConditionTrue, Reason: "Passed", Message: "all checks passed"}, list.APIResources
}
