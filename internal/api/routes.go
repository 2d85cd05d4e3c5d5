package api

import (
	"errors"
	"fmt"
	"net/http"
	"runtime/debug"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/orch-dev/orch/internal/api/auth"
	"github.com/orch-dev/orch/internal/api/join"
	"github.com/orch-dev/orch/internal/api/rest"
	"github.com/orch-dev/orch/internal/joinproto"
	"github.com/orch-dev/orch/internal/kubeversion"
)

// routes puts the public endpoints beside the authenticated API.
func (s *Server) routes(api http.Handler, authn *auth.Authenticator, authz *auth.Authorizer) http.Handler {
	mux := http.NewServeMux()
	health := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = w.Write([]byte("ok"))
	}
	mux.HandleFunc("GET /healthz", health)
	mux.HandleFunc("GET /livez", health)
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if !s.ready.Load() || s.cfg.WaitForLoops && !s.loopsReady.Load() {
			http.Error(w, "not ready: the store or a control loop has not started", http.StatusServiceUnavailable)
			return
		}
		if err := s.datastoreAnswers(r.Context()); err != nil {
			http.Error(w, "not ready: the datastore does not answer: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		health(w, r)
	})
	mux.HandleFunc("GET /version", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, "%s\n", mustJSON(kubeversion.Info(s.cfg.Version)))
	})
	mux.HandleFunc("GET /cacerts", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-pem-file")
		_, _ = w.Write(s.ca().Bundle())
	})
	mux.HandleFunc("GET "+serverBootstrapPath, s.serveServerBootstrap)
	if tok, err := joinproto.ParseToken(s.token); err == nil {
		// The join secret is the credential here; the CA hash in the token
		// was the agent's to check before it sent it.
		s.joins = join.NewHandler(s.ca(), tok.Secret, join.NodePasswords{Secrets: s.storage("", "secrets")}, s.joinPolicy(), s.log)
		mux.Handle("POST "+joinproto.Path, s.joins)
	}
	protected := s.authenticated(api, authn, authz)
	mux.Handle("/", protected)
	return recoverPanics(s, closeAnonymousHTTP2(mux))
}

// closeAnonymousHTTP2 is Kubernetes' UnauthenticatedHTTP2DOSMitigation: a
// request over HTTP/2 carrying no credentials (no client certificate, no
// bearer token) ends its connection, so an anonymous client cannot
// multiplex a flood of requests, or of reset streams (CVE-2023-44487),
// over one connection.
func closeAnonymousHTTP2(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		anonymous := r.Header.Get("Authorization") == "" && (r.TLS == nil || len(r.TLS.PeerCertificates) == 0)
		if r.ProtoMajor == 2 && anonymous && r.RemoteAddr != "loopback" {
			w.Header().Set("Connection", "close")
		}
		next.ServeHTTP(w, r)
	})
}

// authenticated runs authentication then authorization before next.
func (s *Server) authenticated(next http.Handler, authn *auth.Authenticator, authz *auth.Authorizer) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info := rest.ParseRequest(r)
		s.metrics.observe(s, w, r, info, func(w http.ResponseWriter) { s.authorize(w, r, authn, authz, info, next) })
	})
}

// authorize authenticates, then authorizes, the request before next.
func (s *Server) authorize(w http.ResponseWriter, r *http.Request, authn *auth.Authenticator, authz *auth.Authorizer, info rest.RequestInfo, next http.Handler) {
	user, ok, err := authn.Authenticate(r)
	if err != nil || !ok {
		rest.WriteError(w, r, apierrors.NewUnauthorized("Unauthorized"))
		return
	}
	if user, err = auth.Impersonate(r.Context(), authz, user, r.Header); err != nil {
		rest.WriteError(w, r, err)
		return
	}
	fieldSelector := r.URL.Query().Get("fieldSelector")
	name := info.Name
	if name == "" && (info.Verb == "list" || info.Verb == "watch") {
		// A list or watch of one object by name (fieldSelector
		// metadata.name=NAME) is authorized as that name, as Kubernetes'
		// RequestInfoFactory names it: a Role limited to resourceNames
		// lets it, as aggregated servers read
		// kube-system/extension-apiserver-authentication.
		name = rest.SelectedName(fieldSelector)
	}
	attrs := auth.Attributes{Verb: info.Verb, Group: info.Group, Namespace: info.Namespace, Resource: info.Resource,
		Subresource: info.Subresource, Name: name, IsResource: info.IsResource, Path: r.URL.Path,
		FieldSelector: fieldSelector}
	if !info.IsResource {
		attrs.Verb = strings.ToLower(r.Method)
	}
	if err := authz.Authorize(r.Context(), user, attrs); err != nil {
		gr := schema.GroupResource{Group: info.Group, Resource: info.Resource}
		if info.Subresource != "" {
			gr.Resource += "/" + info.Subresource
		}
		forbidden := apierrors.NewForbidden(gr, name, err)
		why := "" // RBAC says nothing of what it does not grant
		if err.Error() != "" {
			why = ": " + err.Error()
		}
		if !info.IsResource {
			forbidden.ErrStatus.Message = fmt.Sprintf("forbidden: User %q cannot %s path %q%s", user.Name, attrs.Verb, r.URL.Path, why)
		} else {
			forbidden.ErrStatus.Message = fmt.Sprintf("%s is forbidden: User %q cannot %s resource %q in API group %q%s%s",
				describe(gr, name), user.Name, info.Verb, gr.Resource, info.Group, auth.InNamespace(info.Namespace), why)
		}
		rest.WriteError(w, r, forbidden)
		return
	}
	s.inFlight.serve(w, r.WithContext(auth.WithUser(r.Context(), user)), user, info, next)
}

func describe(gr schema.GroupResource, name string) string {
	if name == "" {
		return gr.String()
	}
	return fmt.Sprintf("%s %q", gr.String(), name)
}

// recoverPanics turns a panic in a handler into a 500 Status and a log
// line; the server goes on serving. A panic is always a bug to fix.
func recoverPanics(s *Server, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if err, ok := v.(error); ok && errors.Is(err, http.ErrAbortHandler) {
					panic(v)
				}
				s.log.Error("panic serving request", "method", r.Method, "path", r.URL.Path, "panic", v, "stack", string(debug.Stack()))
				rest.WriteError(w, r, apierrors.NewInternalError(fmt.Errorf("internal error")))
			}
		}()
		next.ServeHTTP(w, r)
	})
}
