package boltstore

import (
	"strings"
	"sync"

	"github.com/orch-dev/orch/internal/store"
)

// watchBuffer events wait in a watcher's channel before it needs its queue.
const watchBuffer = 32

// hub fans committed events out to watchers and keeps the newest ones in a
// ring, so most watches start without reading the disk.
type hub struct {
	mu        sync.Mutex
	ring      []ringEntry // circular, len == capacity
	head      int         // index of the oldest entry
	size      int
	published int64 // revision of the newest event published
	// volatileLost: volatile events at or below it can no longer be
	// replayed (evicted from the ring, or from before a restart).
	volatileLost int64
	watchers     map[*watcher]struct{}
	closed       bool
	maxBacklog   int
}

type ringEntry struct {
	ev       store.Event
	volatile bool
}

func newHub(published int64, ringSize, maxBacklog int) *hub {
	return &hub{
		ring:         make([]ringEntry, ringSize),
		published:    published,
		volatileLost: published,
		watchers:     map[*watcher]struct{}{},
		maxBacklog:   maxBacklog,
	}
}

// firstInRing is the oldest revision the ring holds; published+1 when empty.
// Revisions in the ring are contiguous: every write is one event.
func (h *hub) firstInRing() int64 { return h.published - int64(h.size) + 1 }

func (h *hub) publish(entries []ringEntry) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, e := range entries {
		if h.size == len(h.ring) {
			old := h.ring[h.head]
			if old.volatile {
				h.volatileLost = old.ev.Revision
			}
			h.ring[h.head] = ringEntry{}
			h.head = (h.head + 1) % len(h.ring)
			h.size--
		}
		h.ring[(h.head+h.size)%len(h.ring)] = e
		h.size++
		h.published = e.ev.Revision
		for w := range h.watchers {
			if strings.HasPrefix(e.ev.KV.Key, w.prefix) && e.ev.Revision > w.after {
				if !w.enqueue(e.ev, h.maxBacklog) {
					delete(h.watchers, w)
				}
			}
		}
	}
}

// ringSince copies the ring's events under prefix with a revision above
// afterRev. The caller holds mu.
func (h *hub) ringSince(prefix string, afterRev int64) []store.Event {
	var out []store.Event
	for i := range h.size {
		e := h.ring[(h.head+i)%len(h.ring)].ev
		if e.Revision > afterRev && strings.HasPrefix(e.KV.Key, prefix) {
			out = append(out, e)
		}
	}
	return out
}

func (h *hub) remove(w *watcher) {
	h.mu.Lock()
	delete(h.watchers, w)
	h.mu.Unlock()
}

func (h *hub) requestProgress(w *watcher) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.watchers[w]; ok {
		w.enqueue(store.Event{Type: store.EventProgress, Revision: h.published}, h.maxBacklog)
	}
}

// close ends every watcher with err.
func (h *hub) close(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for w := range h.watchers {
		w.end(err)
		delete(h.watchers, w)
	}
}

// watcher hands events straight to its buffered channel while the consumer
// keeps up; once the buffer is full they queue (up to maxBacklog) and its
// own goroutine pumps them on in order, so publishing never waits on a
// consumer.
type watcher struct {
	hub    *hub
	prefix string
	after  int64 // deliver only revisions above it

	mu     sync.Mutex
	queue  []store.Event
	busy   bool // the pump holds events not yet in out
	ended  bool
	err    error
	signal chan struct{} // cap 1: queue or ended changed
	stop   chan struct{} // closed by Stop
	once   sync.Once
	out    chan store.Event
	done   chan struct{} // closed when pump exits
}

func newWatcher(h *hub, prefix string, after int64, backlog []store.Event) *watcher {
	w := &watcher{
		hub: h, prefix: prefix, after: after, queue: backlog,
		signal: make(chan struct{}, 1), stop: make(chan struct{}),
		out: make(chan store.Event, watchBuffer), done: make(chan struct{}),
	}
	go w.pump()
	return w
}

// enqueue adds ev; it reports false, and ends the watcher, when the
// consumer is maxBacklog events behind.
func (w *watcher) enqueue(ev store.Event, maxBacklog int) bool {
	w.mu.Lock()
	if w.ended {
		w.mu.Unlock()
		return false
	}
	if len(w.queue) == 0 && !w.busy {
		select {
		case w.out <- ev: // in order: nothing is queued or in the pump
			w.mu.Unlock()
			return true
		default:
		}
	}
	if len(w.queue) >= maxBacklog {
		w.mu.Unlock()
		w.end(store.ErrWatcherTooSlow)
		return false
	}
	w.queue = append(w.queue, ev)
	w.mu.Unlock()
	w.wake()
	return true
}

func (w *watcher) wake() {
	select {
	case w.signal <- struct{}{}:
	default:
	}
}

// end stops new events; the pump delivers what is queued, then closes out.
func (w *watcher) end(err error) {
	w.mu.Lock()
	if !w.ended {
		w.ended, w.err = true, err
	}
	w.mu.Unlock()
	w.wake()
}

func (w *watcher) pump() {
	defer close(w.done)
	defer close(w.out)
	for {
		w.mu.Lock()
		q, ended := w.queue, w.ended
		w.queue, w.busy = nil, len(q) > 0
		w.mu.Unlock()
		for _, ev := range q {
			select {
			case w.out <- ev:
			case <-w.stop:
				return
			}
		}
		if len(q) > 0 {
			continue
		}
		if ended {
			return
		}
		select {
		case <-w.signal:
		case <-w.stop:
			return
		}
	}
}

func (w *watcher) Events() <-chan store.Event { return w.out }

func (w *watcher) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

func (w *watcher) RequestProgress() { w.hub.requestProgress(w) }

// Stop ends the watch at once, dropping anything queued.
func (w *watcher) Stop() {
	w.once.Do(func() {
		w.hub.remove(w)
		w.end(nil)
		close(w.stop)
	})
	<-w.done
}
