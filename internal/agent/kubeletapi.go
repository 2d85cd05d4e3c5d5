package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/orch-dev/orch/internal/agent/logs"
	"github.com/orch-dev/orch/internal/agent/pods"
	"k8s.io/cri-streaming/pkg/streaming/portforward"
	"k8s.io/cri-streaming/pkg/streaming/remotecommand"
	"k8s.io/klog/v2"
	"k8s.io/streaming/pkg/httpstream/wsstream"
)

// apiServerGroup is the group of the client certificate the API server
// presents to nodes; the :10250 API answers nobody else (a node's own
// certificate, signed by the same CA, is refused).
const apiServerGroup = "system:masters"

// kubeletAPI is the node's :10250 API, which the API server proxies
// pods/log (and later exec and port-forward) to.
type kubeletAPI struct {
	pods atomic.Pointer[pods.Manager]
	log  *slog.Logger
	// node and started are what the Summary API says of the node.
	node    string
	started time.Time
	// handshake has the serving certificate it presents and the CAs it
	// takes client certificates of, replaced when renewed.
	handshake atomic.Pointer[tls.Config]
}

// useCredentials serves with renewed credentials' certificate, and
// trusts their CA bundle, from now on.
func (a *kubeletAPI) useCredentials(creds *Credentials) {
	cfg, err := handshakeConfig(creds)
	if err != nil {
		a.log.Warn("the renewed credentials do not load: keeping the old ones", "err", err)
		return
	}
	a.handshake.Store(cfg)
}

// handshakeConfig serves creds' serving certificate to clients with a
// certificate of their CA.
func handshakeConfig(creds *Credentials) (*tls.Config, error) {
	cert, err := tls.X509KeyPair(creds.ServingCert, creds.ServingKey)
	if err != nil {
		return nil, fmt.Errorf("kubelet API certificate: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(creds.CA) {
		return nil, errors.New("kubelet API: no CA certificate")
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert,
		MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}, nil
}

// serveKubeletAPI listens on port (0: any free one) with the node's
// serving certificate, requiring a client certificate from the cluster
// CA, and returns the port it listens on.
func serveKubeletAPI(ctx context.Context, port int, creds *Credentials, log *slog.Logger) (*kubeletAPI, int, error) {
	cfg, err := handshakeConfig(creds)
	if err != nil {
		return nil, 0, err
	}
	ln, err := net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(port)))
	if err != nil {
		return nil, 0, fmt.Errorf("kubelet API: %w", err)
	}
	api := &kubeletAPI{log: log}
	api.handshake.Store(cfg)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("GET /containerLogs/{namespace}/{pod}/{container}", api.containerLogs)
	mux.HandleFunc("/exec/{namespace}/{pod}/{container}", api.exec)
	mux.HandleFunc("/attach/{namespace}/{pod}/{container}", api.attach)
	mux.HandleFunc("/portForward/{namespace}/{pod}", api.portForward)
	mux.HandleFunc("GET /podTunnel/{namespace}/{pod}/{port}", api.podTunnel)
	mux.HandleFunc("DELETE /localVolumes/{name}", api.removeLocalVolume)
	mux.HandleFunc("GET /stats/summary", api.summary)
	api.metricsHandlers(mux)
	srv := &http.Server{
		Handler:           api.authorized(mux),
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig:         &tls.Config{MinVersion: tls.VersionTLS12, GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return api.handshake.Load(), nil }},
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	context.AfterFunc(ctx, func() { _ = srv.Close() })
	return api, ln.Addr().(*net.TCPAddr).Port, nil
}

// authorized lets through only the API server's certificate.
func (a *kubeletAPI) authorized(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 || !slices.Contains(r.TLS.PeerCertificates[0].Subject.Organization, apiServerGroup) {
			http.Error(w, "Forbidden: only the API server may use the kubelet API", http.StatusForbidden)
			return
		}
		// The streaming library logs to the request's logger, as errors,
		// what is a session ending (its socket closed under its reader).
		next.ServeHTTP(w, r.WithContext(klog.NewContext(r.Context(), logr.FromSlogHandler(debugLevel{a.log.Handler()}))))
	})
}

// debugLevel logs every record at debug level.
type debugLevel struct{ slog.Handler }

func (h debugLevel) Enabled(ctx context.Context, _ slog.Level) bool {
	return h.Handler.Enabled(ctx, slog.LevelDebug)
}

func (h debugLevel) Handle(ctx context.Context, r slog.Record) error {
	if !h.Handler.Enabled(ctx, slog.LevelDebug) {
		return nil // logr hands errors over whatever the level
	}
	r.Level = slog.LevelDebug
	return h.Handler.Handle(ctx, r)
}

func (h debugLevel) WithAttrs(attrs []slog.Attr) slog.Handler {
	return debugLevel{h.Handler.WithAttrs(attrs)}
}

func (h debugLevel) WithGroup(name string) slog.Handler { return debugLevel{h.Handler.WithGroup(name)} }

// containerLogs serves a container's log with the kubelet's query
// parameters (follow, previous, tailLines, timestamps, sinceSeconds,
// sinceTime, limitBytes), streaming while it follows.
// summary serves the storage part of the kubelet's Summary API.
func (a *kubeletAPI) summary(w http.ResponseWriter, r *http.Request) {
	m := a.pods.Load()
	if m == nil {
		http.Error(w, "the node is not running pods yet", http.StatusServiceUnavailable)
		return
	}
	s, err := m.Summary(r.Context(), a.node, a.started)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(s)
}

// removeLocalVolume removes the data of a deleted local-path volume: the
// server's volume loop asks before it deletes the volume.
func (a *kubeletAPI) removeLocalVolume(w http.ResponseWriter, r *http.Request) {
	m := a.pods.Load()
	if m == nil {
		http.Error(w, "the node is not running pods yet", http.StatusServiceUnavailable)
		return
	}
	if err := m.RemoveLocalVolume(r.PathValue("name")); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (a *kubeletAPI) containerLogs(w http.ResponseWriter, r *http.Request) {
	m := a.pods.Load()
	if m == nil {
		http.Error(w, "the node is not running pods yet", http.StatusServiceUnavailable)
		return
	}
	q := r.URL.Query()
	req := pods.LogRequest{Namespace: r.PathValue("namespace"), Pod: r.PathValue("pod"), Container: r.PathValue("container"),
		Previous: q.Get("previous") == "true", Options: logs.Options{Follow: q.Get("follow") == "true", Timestamps: q.Get("timestamps") == "true", Tail: -1}}
	var err error
	if v := q.Get("tailLines"); v != "" {
		if req.Tail, err = strconv.ParseInt(v, 10, 64); err != nil || req.Tail < 0 {
			http.Error(w, "tailLines must be a non-negative integer", http.StatusBadRequest)
			return
		}
	}
	if v := q.Get("limitBytes"); v != "" {
		if req.LimitBytes, err = strconv.ParseInt(v, 10, 64); err != nil || req.LimitBytes < 1 {
			http.Error(w, "limitBytes must be a positive integer", http.StatusBadRequest)
			return
		}
	}
	if v := q.Get("sinceSeconds"); v != "" {
		s, err := strconv.ParseInt(v, 10, 64)
		if err != nil || s < 1 {
			http.Error(w, "sinceSeconds must be a positive integer", http.StatusBadRequest)
			return
		}
		req.Since = time.Now().Add(-time.Duration(s) * time.Second)
	}
	if v := q.Get("sinceTime"); v != "" {
		if req.Since, err = time.Parse(time.RFC3339, v); err != nil {
			http.Error(w, "sinceTime must be an RFC 3339 time", http.StatusBadRequest)
			return
		}
	}
	w.Header().Set("Content-Type", "text/plain")
	out := &flushWriter{w: w, rc: http.NewResponseController(w)}
	if err := m.ContainerLog(r.Context(), req, out); err != nil {
		var le *pods.LogError
		if !out.wrote && errors.As(err, &le) {
			http.Error(w, le.Message, http.StatusBadRequest)
			return
		}
		if !out.wrote {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
		a.log.Debug("container log", "err", err)
	}
}

// streamIdle and streamCreation are the kubelet's streaming timeouts
// (streamingConnectionIdleTimeout's default is four hours; a stream must
// be opened within 30 s).
const (
	streamIdle     = 4 * time.Hour
	streamCreation = 30 * time.Second
)

// exec runs a command in a container over SPDY or a (v4) websocket, the
// kubelet's streaming protocols (kubectl exec, through the API server).
func (a *kubeletAPI) exec(w http.ResponseWriter, r *http.Request) {
	m, uid, ok := a.pod(w, r)
	if !ok {
		return
	}
	opts, err := remotecommand.NewOptions(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	name, container, command := r.PathValue("namespace")+"/"+r.PathValue("pod"), r.PathValue("container"), r.URL.Query()["command"]
	if wsstream.IsWebSocketRequestWithStreamCloseProtocol(r) {
		a.websocketV5(w, r, opts, func(stdin io.Reader, stdout, stderr io.WriteCloser, resize <-chan remotecommand.TerminalSize) error {
			return m.ExecInContainer(r.Context(), name, uid, container, command, stdin, stdout, stderr, opts.TTY, resize, 0)
		})
		return
	}
	remotecommand.ServeExec(w, r, m, name, uid, container, command, opts, streamIdle, streamCreation, remotecommand.SupportedStreamingProtocols)
}

// attach connects to a running container's own streams (kubectl attach,
// kubectl run -i), over the same protocols as exec.
func (a *kubeletAPI) attach(w http.ResponseWriter, r *http.Request) {
	m, uid, ok := a.pod(w, r)
	if !ok {
		return
	}
	opts, err := remotecommand.NewOptions(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	name, container := r.PathValue("namespace")+"/"+r.PathValue("pod"), r.PathValue("container")
	if wsstream.IsWebSocketRequestWithStreamCloseProtocol(r) {
		a.websocketV5(w, r, opts, func(stdin io.Reader, stdout, stderr io.WriteCloser, resize <-chan remotecommand.TerminalSize) error {
			return m.AttachContainer(r.Context(), name, uid, container, stdin, stdout, stderr, opts.TTY, resize)
		})
		return
	}
	remotecommand.ServeAttach(w, r, m, name, uid, container, opts, streamIdle, streamCreation, remotecommand.SupportedStreamingProtocols)
}

// portForward forwards the pod's ports (kubectl port-forward).
func (a *kubeletAPI) portForward(w http.ResponseWriter, r *http.Request) {
	m, uid, ok := a.pod(w, r)
	if !ok {
		return
	}
	opts, err := portforward.NewV4Options(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	portforward.ServePortForward(w, r, m, r.PathValue("namespace")+"/"+r.PathValue("pod"), uid, opts, streamIdle, streamCreation, portforward.SupportedProtocols)
}

// TunnelProtocol is the upgrade a /podTunnel request asks for: after the
// 101 answer the connection carries the bytes of a TCP connection to the
// pod's port, both ways.
const TunnelProtocol = "orch-pod-tcp"

// podTunnel connects the API server to a port of a pod on this node, for
// a server whose machine is not on the pod network (--disable-agent):
// its admission and conversion webhooks, pods/proxy and services/proxy
// reach pods this way, as k3s's egress selector sends them through the
// agent. Only pods of this node are reached, and only the API server may
// ask (authorized).
func (a *kubeletAPI) podTunnel(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), TunnelProtocol) {
		http.Error(w, "want Upgrade: "+TunnelProtocol, http.StatusBadRequest)
		return
	}
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		http.Error(w, fmt.Sprintf("port %q: want a number from 1 to 65535", r.PathValue("port")), http.StatusBadRequest)
		return
	}
	m, uid, ok := a.pod(w, r)
	if !ok {
		return
	}
	pod, err := m.DialPod(r.Context(), r.PathValue("namespace")+"/"+r.PathValue("pod"), uid, port)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer func() { _ = pod.Close() }()
	conn, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		http.Error(w, "the connection cannot be taken over: "+err.Error(), http.StatusInternalServerError)
		return
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Time{})
	if _, err := rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + TunnelProtocol + "\r\n\r\n"); err != nil {
		return
	}
	if err := rw.Flush(); err != nil {
		return
	}
	go func() {
		// What the client sent with its request, then the rest; its end
		// is passed on as a half close, its failure closes the pod's side.
		if _, err := io.Copy(pod, rw.Reader); err != nil {
			_ = pod.Close()
		} else if tcp, ok := pod.(*net.TCPConn); ok {
			_ = tcp.CloseWrite()
		}
	}()
	_, _ = io.Copy(conn, pod)
}

// pod finds the pod a streaming request names.
func (a *kubeletAPI) pod(w http.ResponseWriter, r *http.Request) (*pods.Manager, string, bool) {
	m := a.pods.Load()
	if m == nil {
		http.Error(w, "the node is not running pods yet", http.StatusServiceUnavailable)
		return nil, "", false
	}
	uid, ok := m.Pod(r.PathValue("namespace"), r.PathValue("pod"))
	if !ok {
		http.Error(w, fmt.Sprintf("pod %q in namespace %q is not running on this node", r.PathValue("pod"), r.PathValue("namespace")), http.StatusNotFound)
		return nil, "", false
	}
	return m, uid, true
}

// flushWriter sends each write at once, so that a followed log streams.
type flushWriter struct {
	w     http.ResponseWriter
	rc    *http.ResponseController
	wrote bool
}

func (f *flushWriter) Write(p []byte) (int, error) {
	f.wrote = true
	n, err := f.w.Write(p)
	if err == nil {
		err = f.rc.Flush()
	}
	return n, err
}
