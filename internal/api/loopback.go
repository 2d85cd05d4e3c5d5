package api

import (
	"io"
	"net/http"
	"sync"

	"github.com/orch-dev/orch/internal/api/auth"
	"k8s.io/client-go/rest"
)

// Loopback is the client config of the server's own control loops. Their
// requests go straight into the API handler in this process, with no
// socket and no TLS, as system:orch-loops: authorization, admission and
// validation treat them like any client's, so a loop cannot write what a
// user could not.
func (s *Server) Loopback() *rest.Config {
	return s.loopbackAs(auth.User{Name: auth.LoopsUser})
}

// adminLoopback is the loopback as system:admin (system:masters): what
// root on the server's machine asks through the control socket (orch
// upgrade apply), as it could with the admin kubeconfig.
func (s *Server) adminLoopback() *rest.Config {
	return s.loopbackAs(auth.User{Name: "system:admin", Groups: []string{auth.GroupMasters, auth.GroupAuthenticated}})
}

func (s *Server) loopbackAs(user auth.User) *rest.Config {
	return &rest.Config{
		Host:      "https://orch.loopback",
		Transport: &loopbackTransport{handler: s.handler, user: user},
		ContentConfig: rest.ContentConfig{
			ContentType:        "application/vnd.kubernetes.protobuf",
			AcceptContentTypes: "application/vnd.kubernetes.protobuf,application/json",
		},
		QPS:       -1,
		UserAgent: "orch-loops",
	}
}

// loopbackTransport serves each request by calling the handler in a
// goroutine, streaming its response through a pipe: watches stay open as
// long as the client reads them.
type loopbackTransport struct {
	handler http.Handler
	user    auth.User
}

func (t *loopbackTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := auth.InProcess(req.Context(), t.user)
	r := req.Clone(ctx)
	if r.Body == nil {
		r.Body = http.NoBody
	}
	r.RequestURI = r.URL.RequestURI()
	r.RemoteAddr = "loopback"
	body, out := io.Pipe()
	w := &pipeResponse{header: http.Header{}, out: out, started: make(chan struct{})}
	go func() {
		defer func() {
			w.WriteHeader(http.StatusOK) // a handler that wrote nothing
			_ = out.Close()
		}()
		t.handler.ServeHTTP(w, r)
	}()
	<-w.started
	return &http.Response{
		Status: http.StatusText(w.code), StatusCode: w.code, Header: w.sent,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Body: body, ContentLength: -1, Request: req,
	}, nil
}

// pipeResponse is the handler's side of a loopback response.
type pipeResponse struct {
	header  http.Header
	out     *io.PipeWriter
	once    sync.Once
	started chan struct{}
	code    int
	sent    http.Header
}

func (w *pipeResponse) Header() http.Header { return w.header }

func (w *pipeResponse) WriteHeader(code int) {
	w.once.Do(func() {
		w.code, w.sent = code, w.header.Clone()
		close(w.started)
	})
}

func (w *pipeResponse) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.out.Write(b)
}

// Flush is a no-op: the pipe hands each write to the reader as it happens.
func (w *pipeResponse) Flush() {}
