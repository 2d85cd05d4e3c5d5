package rest

import (
	"errors"
	"io"
	"net/http"
	"net/url"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/streaming/pkg/httpstream/wsstream"
)

// logOverWebSocket serves a pod's log to a websocket client, as
// kube-apiserver serves any stream: the node's answer to a plain GET,
// copied into websocket messages (binary.k8s.io, or base64.binary.k8s.io
// for clients that take text), the socket closed at its end. An answer
// other than 200 (the node's error) goes back as it came, before any
// upgrade.
func (q *request) logOverWebSocket(node *corev1.Node, path string, query url.Values) error {
	plain := q.r.Clone(q.r.Context())
	for _, h := range []string{"Connection", "Upgrade", "Sec-Websocket-Key", "Sec-Websocket-Version", "Sec-Websocket-Protocol", "Sec-Websocket-Extensions"} {
		plain.Header.Del(h)
	}
	body, pw := io.Pipe()
	answer := &pipedResponse{header: http.Header{}, status: make(chan int, 1), body: pw}
	failed := make(chan error, 1)
	go func() {
		defer func() {
			// The proxy gives up on a reader gone away (the client closed
			// its socket) by panicking with ErrAbortHandler, as in a
			// handler of its own.
			if v := recover(); v != nil && v != http.ErrAbortHandler { //nolint:errorlint // a panic value, compared as net/http does
				panic(v)
			}
			_ = pw.Close()
		}()
		if err := q.h.opts.Kubelets.Proxy(answer, plain, node, path, query); err != nil {
			failed <- err
			answer.WriteHeader(0)
		}
	}()
	code := <-answer.status
	if code == 0 {
		return <-failed
	}
	if code != http.StatusOK {
		for k, v := range answer.header {
			q.w.Header()[k] = v
		}
		q.w.WriteHeader(code)
		_, _ = io.Copy(q.w, body)
		return nil
	}
	defer func() { _ = body.Close() }()
	if err := wsstream.NewReader(body, true, wsstream.NewDefaultReaderProtocols()).Copy(q.w, q.r); err != nil && !errors.Is(err, io.ErrClosedPipe) {
		q.h.opts.Logger.Debug("pod log over websocket", "err", err)
	}
	return nil
}

// pipedResponse is a ResponseWriter whose status is told on a channel
// (once) and whose body goes into a pipe.
type pipedResponse struct {
	header http.Header
	status chan int
	once   sync.Once
	body   *io.PipeWriter
}

func (p *pipedResponse) Header() http.Header { return p.header }

func (p *pipedResponse) WriteHeader(code int) { p.once.Do(func() { p.status <- code }) }

func (p *pipedResponse) Write(b []byte) (int, error) {
	p.WriteHeader(http.StatusOK)
	return p.body.Write(b)
}

// Flush is a no-op: every write goes straight into the pipe.
func (p *pipedResponse) Flush() {}
