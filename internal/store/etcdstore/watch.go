package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"

	"github.com/orch-dev/orch/internal/store"
)

// progressRetry is how often an unanswered progress request is sent
// again: etcd answers one only once the watcher has caught up.
const progressRetry = 100 * time.Millisecond

// Watch implements store.Store.
func (s *Store) Watch(ctx context.Context, prefix string, afterRevision int64) (store.Watcher, error) {
	if afterRevision < 0 {
		return nil, fmt.Errorf("watch from %d: %w", afterRevision, store.ErrInvalid)
	}
	if err := s.check(); err != nil {
		return nil, err
	}
	if afterRevision == 0 {
		// "From now" is from a revision read before Watch returns, so that
		// a write the caller makes next is seen even if etcd registers the
		// watch after it.
		rev, err := s.Revision(ctx)
		if err != nil {
			return nil, err
		}
		afterRevision = rev
	} else if err := s.checkHistory(ctx, afterRevision); err != nil {
		return nil, fmt.Errorf("watch %q from %d: %w", prefix, afterRevision, err)
	}

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, store.ErrClosed
	}
	s.nextID++
	// A stream of its own (clientv3 shares one among watches with the same
	// metadata), so that a progress request reaches this watcher only.
	wctx := metadata.AppendToOutgoingContext(clientv3.WithRequireLeader(ctx), "orch-watch", strconv.FormatUint(s.nextID, 10))
	wctx, cancel := context.WithCancel(wctx)
	w := &watcher{s: s, ctx: wctx, cancel: cancel, events: make(chan store.Event, 16), progress: make(chan struct{}, 1)}
	s.watchers[w] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()

	start := s.opts.Prefix + prefix
	if start == "" {
		start = "\x00"
	}
	in := s.client.Watch(wctx, start, clientv3.WithRange(s.rangeEnd(prefix)), clientv3.WithRev(afterRevision+1), clientv3.WithPrevKV())
	go w.run(in)
	return w, nil
}

// checkHistory fails with store.ErrCompacted when events after rev are
// forgotten. etcd would serve a watch from exactly its compaction revision
// (whose deletions it no longer has), so ask with a read at rev, which it
// refuses below the compaction revision as the store's contract does.
func (s *Store) checkHistory(ctx context.Context, rev int64) error {
	if rev < s.compacted.Load() {
		return fmt.Errorf("compacted at %d: %w", s.compacted.Load(), store.ErrCompacted)
	}
	_, err := s.client.Get(ctx, s.opts.Prefix+compactKey, clientv3.WithRev(rev), clientv3.WithCountOnly())
	switch {
	case err == nil, errors.Is(err, rpctypes.ErrFutureRev):
		// A future revision is waited for, as boltstore does.
		return nil
	case errors.Is(err, rpctypes.ErrCompacted):
		return fmt.Errorf("%w: %w", store.ErrCompacted, err)
	}
	return mapErr(err)
}

// watcher queues etcd's events between its stream and the consumer, so a
// slow consumer is cut off at the backlog limit instead of growing
// clientv3's unbounded buffers.
type watcher struct {
	s        *Store
	ctx      context.Context
	cancel   context.CancelFunc
	events   chan store.Event
	progress chan struct{}

	mu      sync.Mutex
	stopped bool
	err     error
}

func (w *watcher) Events() <-chan store.Event { return w.events }

func (w *watcher) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

func (w *watcher) RequestProgress() {
	select {
	case w.progress <- struct{}{}:
	default:
	}
}

func (w *watcher) Stop() { w.stop(nil) }

// stop ends the watch with err unless it already ended.
func (w *watcher) stop(err error) {
	w.fail(err)
	w.cancel()
}

// fail records why the watch ended; the first reason wins.
func (w *watcher) fail(err error) {
	w.mu.Lock()
	if !w.stopped {
		w.stopped, w.err = true, err
	}
	w.mu.Unlock()
}

func (w *watcher) run(in clientv3.WatchChan) {
	defer w.s.wg.Done()
	defer func() {
		w.s.mu.Lock()
		delete(w.s.watchers, w)
		w.s.mu.Unlock()
		w.cancel()
		close(w.events)
	}()
	var queue []store.Event
	var retry <-chan time.Time
	var retryTimer *time.Timer
	defer func() {
		if retryTimer != nil {
			retryTimer.Stop()
		}
	}()
	requestProgress := func() {
		if err := w.s.client.RequestProgress(w.ctx); err != nil {
			return // the stream is ending; its end says why
		}
		if retryTimer == nil {
			retryTimer = time.NewTimer(progressRetry)
		} else {
			retryTimer.Reset(progressRetry)
		}
		retry = retryTimer.C
	}
	pending := false
	for {
		var out chan<- store.Event
		var next store.Event
		if len(queue) > 0 {
			out, next = w.events, queue[0]
		}
		select {
		case out <- next:
			queue[0] = store.Event{}
			queue = queue[1:]
		case <-w.progress:
			pending = true
			requestProgress()
		case <-retry:
			retry = nil
			if pending {
				requestProgress()
			}
		case <-w.ctx.Done():
			return
		case resp, ok := <-in:
			if !ok {
				if w.ctx.Err() == nil {
					w.fail(fmt.Errorf("etcd watch ended: %w", store.ErrClosed))
				}
				w.drain(queue)
				return
			}
			if resp.CompactRevision != 0 {
				w.s.noteCompacted(resp.CompactRevision)
				w.fail(fmt.Errorf("compacted at %d: %w", resp.CompactRevision, store.ErrCompacted))
				w.drain(queue)
				return
			}
			if err := resp.Err(); err != nil {
				w.fail(fmt.Errorf("etcd watch: %w", mapErr(err)))
				w.drain(queue)
				return
			}
			if resp.IsProgressNotify() {
				if pending {
					pending = false
					queue = append(queue, store.Event{Type: store.EventProgress, Revision: resp.Header.Revision})
				}
				continue
			}
			for _, ev := range resp.Events {
				queue = append(queue, w.s.event(ev))
			}
			if len(queue) > w.s.opts.MaxWatchBacklog {
				w.fail(fmt.Errorf("%d events behind: %w", len(queue), store.ErrWatcherTooSlow))
				return
			}
		}
	}
}

// drain hands the events etcd sent before ending the watch to the consumer
// while it still wants them.
func (w *watcher) drain(queue []store.Event) {
	for _, ev := range queue {
		select {
		case w.events <- ev:
		case <-w.ctx.Done():
			return
		}
	}
}

func (s *Store) event(ev *clientv3.Event) store.Event {
	out := store.Event{Type: store.EventPut, KV: s.kv(ev.Kv), Revision: ev.Kv.ModRevision}
	if ev.Type == mvccpb.DELETE {
		out.Type = store.EventDelete
	}
	if ev.PrevKv != nil {
		prev := s.kv(ev.PrevKv)
		out.PrevKV = &prev
	}
	return out
}
