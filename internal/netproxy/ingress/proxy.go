// Package ingress is a node's HTTP and HTTPS proxy for the cluster's
// Ingresses, as an ingress controller's proxy: it serves the Ingresses of
// the classes whose controller is orch's (internal/ingressclass) on ports
// 80 and 443 of every node, routing by host and path to the ready
// endpoints of the Services they name, directly (no second hop through
// the node's NAT), with TLS from kubernetes.io/tls Secrets chosen by SNI.
// It is configured from informers, so it keeps serving what it last saw
// while the server is away.
package ingress

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/orch-dev/orch/internal/gatewayapi"
	"github.com/orch-dev/orch/internal/ingressclass"
	"github.com/orch-dev/orch/internal/kube"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	toolscache "k8s.io/client-go/tools/cache"
)

// Config is what a node's ingress proxy needs.
type Config struct {
	// Node are informers over the node's own identity (Ingresses,
	// IngressClasses); Services may be shared with the service proxy
	// (Services, EndpointSlices).
	Node, Services *kube.Informers
	// Secret reads a TLS Secret an Ingress names (the node authorizer
	// lets a node read those).
	Secret func(ctx context.Context, namespace, name string) (*corev1.Secret, error)
	// HTTPAddr and HTTPSAddr are where it listens for Ingresses (":80",
	// ":443"); GatewayHost the host part of the Gateways' listener
	// addresses ("" for every address).
	HTTPAddr, HTTPSAddr, GatewayHost string
	// StatePath, when set, is where the routes are kept, so that an agent
	// started while the server is away serves them (without TLS: no key
	// is kept).
	StatePath string
	Logger    *slog.Logger
}

// Limits on what a client may cost, as ingress controllers have them.
const (
	maxHeaderBytes    = 64 << 10
	readHeaderTimeout = 10 * time.Second
	idleTimeout       = 90 * time.Second
	// secretRefresh is how often the TLS Secrets are read again, so that
	// a renewed certificate is served.
	secretRefresh = time.Minute
	// offlineAfter is how long the proxy waits to hear from the server
	// before it serves the routes kept on disk.
	offlineAfter = 5 * time.Second
)

// Proxy serves the Ingresses.
type Proxy struct {
	cfg     Config
	log     *slog.Logger
	synced  []toolscache.InformerSynced
	changed chan struct{}
	list    func() cluster
	table   atomic.Pointer[table]
	// mirrorClient sends the copies of mirrored requests.
	mirrorClient *http.Client
	// fallback is the certificate of a name no Ingress has one for.
	fallback *tls.Certificate
	proxy    *httputil.ReverseProxy

	mu sync.Mutex
	// secrets are the TLS Secrets' certificates as last read.
	secrets map[string]*heldCert
	// servers are the listeners by address: the Ingresses' while some
	// IngressClass is orch's, and each Gateway listener port's.
	servers map[string]*server
}

type server struct {
	*http.Server
	tls bool
}

type heldCert struct {
	cert *tls.Certificate
	err  error
	read time.Time
}

// New registers the proxy's informers; Run serves.
func New(cfg Config) (*Proxy, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	p, err := newProxy(cfg)
	if err != nil {
		return nil, err
	}
	ings, classes := cfg.Node.Ingresses(), cfg.Node.IngressClasses()
	routes := cfg.Node.ConfigMapNamedIn(gatewayapi.ConfigNamespace, gatewayapi.ConfigName)
	svcs, eps := cfg.Services.Services(), cfg.Services.EndpointSlices()
	p.synced = []toolscache.InformerSynced{ings.Informer().HasSynced, classes.Informer().HasSynced, routes.Informer().HasSynced,
		svcs.Informer().HasSynced, eps.Informer().HasSynced}
	p.list = func() cluster {
		c := cluster{
			service: func(namespace, name string) *corev1.Service {
				svc, _ := svcs.Lister().Services(namespace).Get(name)
				return svc
			},
			slices: func(namespace, service string) []*discoveryv1.EndpointSlice {
				out, _ := eps.Lister().EndpointSlices(namespace).List(labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: service}))
				return out
			},
		}
		c.ingresses, _ = ings.Lister().List(labels.Everything())
		c.classes, _ = classes.Lister().List(labels.Everything())
		if cm, err := routes.Lister().ConfigMaps(gatewayapi.ConfigNamespace).Get(gatewayapi.ConfigName); err == nil {
			if err := json.Unmarshal([]byte(cm.Data[gatewayapi.ConfigKey]), &c.gateways); err != nil {
				p.log.Warn("the Gateway routes cannot be read", "err", err)
			}
		}
		return c
	}
	wake := toolscache.ResourceEventHandlerFuncs{AddFunc: func(any) { p.wake() }, UpdateFunc: func(any, any) { p.wake() }, DeleteFunc: func(any) { p.wake() }}
	for _, inf := range []toolscache.SharedIndexInformer{ings.Informer(), classes.Informer(), routes.Informer(), svcs.Informer(), eps.Informer()} {
		if _, err := inf.AddEventHandler(wake); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// newProxy is a proxy with an empty table and no informers.
func newProxy(cfg Config) (*Proxy, error) {
	fallback, err := selfSigned()
	if err != nil {
		return nil, err
	}
	p := &Proxy{cfg: cfg, log: cfg.Logger.With("component", "ingress"), changed: make(chan struct{}, 1), fallback: fallback, secrets: map[string]*heldCert{},
		servers: map[string]*server{}}
	p.table.Store(&table{defaultCert: fallback})
	tr := newTransport()
	p.proxy = &httputil.ReverseProxy{Rewrite: rewrite, Transport: tr, ErrorHandler: p.proxyError, ModifyResponse: modifyResponse,
		ErrorLog: slog.NewLogLogger(p.log.Handler(), slog.LevelDebug)}
	p.mirrorClient = &http.Client{Transport: tr.http1, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return p, nil
}

func (p *Proxy) wake() {
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

// Run serves until ctx ends: the table rebuilt after each change (at most
// ten times a second) and each time the Secrets are read again.
func (p *Proxy) Run(ctx context.Context) {
	defer p.listen(nil)
	var written []byte
	if p.cfg.StatePath != "" {
		wait, cancel := context.WithTimeout(ctx, offlineAfter)
		synced := toolscache.WaitForCacheSync(wait.Done(), p.synced...)
		cancel()
		if !synced && ctx.Err() == nil {
			written = p.serveKept()
		}
	}
	if !toolscache.WaitForCacheSync(ctx.Done(), p.synced...) {
		return
	}
	refresh := time.NewTicker(secretRefresh)
	defer refresh.Stop()
	for {
		ours := p.rebuild(ctx)
		rebuilt := time.Now()
		p.listen(p.wanted(ours))
		if p.cfg.StatePath != "" {
			var err error
			if written, err = keep(p.cfg.StatePath, p.table.Load(), ours, written); err != nil {
				p.log.Warn("the ingress routes are not kept for a restart offline", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-p.changed:
		case <-refresh.C:
			p.mu.Lock()
			for _, h := range p.secrets {
				h.read = time.Time{}
			}
			p.mu.Unlock()
		}
		// A change after a quiet spell is served at once; a burst of
		// changes is a rebuild each 100 ms.
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(rebuilt.Add(rebuildEvery))):
		}
	}
}

// rebuildEvery is how often, at most, the table is rebuilt.
const rebuildEvery = 100 * time.Millisecond

// serveKept serves the routes kept on disk, the server being away, and
// returns what was read.
func (p *Proxy) serveKept() []byte {
	t, listening, data, err := restore(p.cfg.StatePath)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			p.log.Warn("the ingress routes kept on disk cannot be read", "err", err)
		}
		return nil
	}
	t.defaultCert = p.fallback
	p.table.Store(t)
	p.log.Warn("the API server is unreachable: serving the Ingresses kept on disk (HTTPS waits for the server)", "ingresses", t.ingresses)
	p.listen(p.wanted(listening))
	return data
}

// rebuild makes the table again from the informers' objects, and
// reports whether some IngressClass is orch's.
func (p *Proxy) rebuild(ctx context.Context) (ours bool) {
	c := p.list()
	c.certificate = func(namespace, name string) (*tls.Certificate, error) { return p.certificate(ctx, namespace, name) }
	t, problems := build(c)
	if t.defaultCert == nil {
		t.defaultCert = p.fallback
	}
	p.table.Store(t)
	for _, pr := range problems {
		p.log.Warn("an Ingress is served without a part", "ingress", pr.ingress, "err", pr.err)
	}
	return len(ingressclass.Ours(c.classes)) > 0
}

// certificate is a TLS Secret's certificate, read again when it is older
// than secretRefresh; while the Secret cannot be read (the server away),
// the one read before.
func (p *Proxy) certificate(ctx context.Context, namespace, name string) (*tls.Certificate, error) {
	key := namespace + "/" + name
	p.mu.Lock()
	held := p.secrets[key]
	p.mu.Unlock()
	if held != nil && time.Since(held.read) < secretRefresh {
		return held.cert, held.err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	secret, err := p.cfg.Secret(ctx, namespace, name)
	fresh := &heldCert{read: time.Now()}
	switch {
	case err != nil && held != nil && held.cert != nil:
		fresh.cert = held.cert // keep serving it
	case err != nil:
		fresh.err = err
	case secret.Type != corev1.SecretTypeTLS && (len(secret.Data[corev1.TLSCertKey]) == 0 || len(secret.Data[corev1.TLSPrivateKeyKey]) == 0):
		fresh.err = fmt.Errorf("not a %s Secret", corev1.SecretTypeTLS)
	default:
		cert, err := tls.X509KeyPair(secret.Data[corev1.TLSCertKey], secret.Data[corev1.TLSPrivateKeyKey])
		if err != nil {
			fresh.err = fmt.Errorf("its certificate and key: %w", err)
		} else {
			fresh.cert = &cert
		}
	}
	p.mu.Lock()
	p.secrets[key] = fresh
	p.mu.Unlock()
	return fresh.cert, fresh.err
}

// wanted are the addresses to listen on, with whether each is TLS: the
// Ingresses' while some IngressClass is orch's (so that --disable
// ingress leaves ports 80 and 443 to another controller), and each port
// of the Gateways' listeners.
func (p *Proxy) wanted(ingress bool) map[string]bool {
	want := map[string]bool{}
	if ingress {
		want[p.cfg.HTTPAddr], want[p.cfg.HTTPSAddr] = false, true
	}
	for port, https := range p.table.Load().gatewayPorts {
		addr := net.JoinHostPort(p.cfg.GatewayHost, strconv.Itoa(int(port)))
		if _, taken := want[addr]; !taken {
			want[addr] = https
		}
	}
	return want
}

// listen opens the listeners wanted and closes the others.
func (p *Proxy) listen(want map[string]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for addr, s := range p.servers {
		if tls, ok := want[addr]; !ok || tls != s.tls {
			_ = s.Close()
			delete(p.servers, addr)
		}
	}
	for addr, tls := range want {
		if p.servers[addr] != nil {
			continue
		}
		s := &http.Server{Addr: addr, Handler: p, ReadHeaderTimeout: readHeaderTimeout, IdleTimeout: idleTimeout, MaxHeaderBytes: maxHeaderBytes,
			ErrorLog: slog.NewLogLogger(p.log.Handler(), slog.LevelDebug), ConnContext: connContext}
		if tls {
			s.TLSConfig = p.tlsConfig()
		} else {
			s.Protocols = new(http.Protocols)
			s.Protocols.SetHTTP1(true)
			s.Protocols.SetUnencryptedHTTP2(true) // gRPC clients over h2c
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			p.log.Error("ingress: cannot listen (another controller on the port? orch server --disable ingress leaves ports 80 and 443)", "addr", addr, "err", err)
			continue
		}
		p.servers[addr] = &server{Server: s, tls: tls}
		go func() {
			var err error
			if tls {
				err = s.ServeTLS(l, "", "")
			} else {
				err = s.Serve(l)
			}
			if err != nil && !errors.Is(err, http.ErrServerClosed) {
				p.log.Error("ingress listener stopped", "addr", addr, "err", err)
			}
		}()
		p.log.Info("serving Ingresses and Gateways", "addr", l.Addr().String(), "tls", tls)
	}
}

// tlsConfig chooses the certificate by the client's SNI name.
func (p *Proxy) tlsConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			t := p.table.Load()
			if hello.Conn != nil {
				dest := originalDestination(hello.Conn)
				if s := t.sites[siteKey{dest.Addr().Unmap().String(), int32(dest.Port())}]; s != nil {
					if l := s.listener(normalizeHost(hello.ServerName)); l != nil && len(l.certs) > 0 {
						return l.certs[0], nil
					}
					return p.fallback, nil
				}
			}
			return t.certificate(hello.ServerName), nil
		}}
}

// backendKey carries a request's backend to the transport.
type backendKey struct{}

// ServeHTTP routes one request.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	t := p.table.Load()
	if dest := connOf(r).dest; dest.IsValid() {
		if s := t.sites[siteKey{dest.Addr().Unmap().String(), int32(dest.Port())}]; s != nil {
			p.serveGateway(w, r, s, int32(dest.Port()), r.TLS != nil)
			return
		}
	}
	_, be := t.route(r.Host, r.URL.Path)
	switch {
	case be == nil:
		http.Error(w, "404 page not found: no Ingress rule matches "+r.Host+r.URL.Path, http.StatusNotFound)
		return
	case len(be.endpoints) == 0:
		be.unavailable(w)
		return
	}
	p.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), backendKey{}, be)))
}

// unavailable answers 503 for a backend with no ready endpoint, saying
// why.
func (be *backend) unavailable(w http.ResponseWriter) {
	why := "no ready endpoints of service " + be.service.String()
	if be.problem != "" {
		why = be.problem
	}
	http.Error(w, "503 service unavailable: "+why, http.StatusServiceUnavailable)
}

// rewrite makes the request to the backend: the client's Host kept, the
// X-Forwarded headers set (the client's address appended to a chain it
// sent, as ingress-nginx does).
func rewrite(pr *httputil.ProxyRequest) {
	be := pr.In.Context().Value(backendKey{}).(*backend)
	pr.Out.URL.Scheme, pr.Out.URL.Host = "http", be.endpoints[0]
	pr.Out.Host = pr.In.Host
	if prior := pr.In.Header["X-Forwarded-For"]; len(prior) > 0 {
		pr.Out.Header["X-Forwarded-For"] = prior
	}
	pr.SetXForwarded()
}

func (p *Proxy) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) {
		return // the client went away
	}
	if errors.Is(err, context.DeadlineExceeded) {
		http.Error(w, "504 gateway timeout: the route's timeout passed", http.StatusGatewayTimeout)
		return
	}
	p.log.Debug("ingress: backend failed", "host", r.Host, "path", r.URL.Path, "err", err)
	http.Error(w, "502 bad gateway: "+err.Error(), http.StatusBadGateway)
}
