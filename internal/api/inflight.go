package api

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/orch-dev/orch/internal/api/auth"
	"github.com/orch-dev/orch/internal/api/rest"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Edge-sized defaults of Kubernetes' --max-requests-inflight (400) and
// --max-mutating-requests-inflight (200): a board has a tenth of a
// control-plane machine's memory.
const (
	DefaultMaxRequestsInFlight         = 40
	DefaultMaxMutatingRequestsInFlight = 20
)

// inFlight is Kubernetes' max-in-flight filter: at most so many reads and
// so many writes are served at once; beyond that a request gets 429 with
// Retry-After, which client-go waits out and retries. Long-running
// requests (watches, logs, exec, attach, port-forward) are not counted,
// and neither are system:masters nor the server's own loops, as in
// Kubernetes.
type inFlight struct {
	reads, writes chan struct{}
	// active counts every request served but the long-running ones, which
	// a stopping server waits for.
	active atomic.Int64
}

func newInFlight(reads, writes int) *inFlight {
	if reads <= 0 {
		reads = DefaultMaxRequestsInFlight
	}
	if writes <= 0 {
		writes = DefaultMaxMutatingRequestsInFlight
	}
	return &inFlight{reads: make(chan struct{}, reads), writes: make(chan struct{}, writes)}
}

// serve runs next within the limits, or answers 429.
func (f *inFlight) serve(w http.ResponseWriter, r *http.Request, u auth.User, info rest.RequestInfo, next http.Handler) {
	if !longRunning(info) {
		f.active.Add(1)
		defer f.active.Add(-1)
	}
	// The masters and the server's own loops are never turned away.
	if auth.Privileged(u) || u.Name == auth.LoopsUser || longRunning(info) {
		next.ServeHTTP(w, r)
		return
	}
	seats, kind := f.reads, "read"
	switch info.Verb {
	case "create", "update", "patch", "delete", "deletecollection":
		seats, kind = f.writes, "mutating"
	}
	select {
	case seats <- struct{}{}:
		defer func() { <-seats }()
		next.ServeHTTP(w, r)
	default:
		w.Header().Set("Retry-After", "1")
		rest.WriteError(w, r, apierrors.NewTooManyRequests(fmt.Sprintf("too many %s requests in flight (%d), please try again later", kind, cap(seats)), 1))
	}
}

// drained waits until no request but the long-running ones is being
// served, or ctx ends.
func (f *inFlight) drained(ctx context.Context) {
	for f.active.Load() > 0 {
		select {
		case <-ctx.Done():
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// longRunning are the requests Kubernetes' max-in-flight filter does not
// count: watches, and pods' log, exec, attach and port-forward.
func longRunning(info rest.RequestInfo) bool {
	if info.Verb == "watch" {
		return true
	}
	switch info.Subresource {
	case "log", "exec", "attach", "portforward", "proxy":
		return true
	}
	return false
}
