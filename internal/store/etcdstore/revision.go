package etcdstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// revisionReadTimeout bounds one shared read; each caller also gives up
// with its own context.
const revisionReadTimeout = 30 * time.Second

// revisionReads shares linearizable reads of the store's revision among
// the callers that ask for it at once. A caller may take the result of a
// read that began after it asked, and no other: that read's revision
// includes every write acknowledged before the caller asked, as a read of
// its own would. So one read is in flight at a time; the callers arriving
// meanwhile share the next, which begins as it ends. Under load (every
// write's admission asks for one) this is a round trip for many instead
// of one each, and each caller still waits at most two round trips.
type revisionReads struct {
	read func(context.Context) (int64, error)
	stop <-chan struct{}

	mu       sync.Mutex
	inFlight bool
	next     *revisionRead // the read the callers arriving now share
}

type revisionRead struct {
	done chan struct{}
	rev  int64
	err  error
}

func (r *revisionReads) get(ctx context.Context) (int64, error) {
	r.mu.Lock()
	if r.next == nil {
		r.next = &revisionRead{done: make(chan struct{})}
	}
	mine := r.next
	if !r.inFlight {
		r.start()
	}
	r.mu.Unlock()
	select {
	case <-mine.done:
		return mine.rev, mine.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// start begins the read of r.next; called with r.mu held.
func (r *revisionReads) start() {
	current := r.next
	r.next, r.inFlight = nil, true
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), revisionReadTimeout)
		defer cancel()
		go func() {
			select {
			case <-r.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		current.rev, current.err = r.read(ctx)
		close(current.done)
		r.mu.Lock()
		r.inFlight = false
		if r.next != nil {
			r.start()
		}
		r.mu.Unlock()
	}()
}

// Revision implements store.Store: a linearizable read, shared with the
// callers asking at the same time (revisionReads).
func (s *Store) Revision(ctx context.Context) (int64, error) {
	if err := s.check(); err != nil {
		return 0, err
	}
	return s.revisions.get(ctx)
}

func (s *Store) readRevision(ctx context.Context) (int64, error) {
	resp, err := s.client.Get(ctx, s.opts.Prefix+compactKey, clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("revision: %w", mapErr(err))
	}
	return resp.Header.Revision, nil
}
