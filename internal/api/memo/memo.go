// Package memo remembers the results of recent computations by key, for
// the work every watcher of one change would otherwise repeat (decoding
// it, encoding it): the first caller computes, concurrent callers of the
// same key wait for it, and the oldest keys are forgotten once the ring is
// full.
package memo

import "sync"

// Ring memoizes up to size recent keys.
type Ring[K comparable, V any] struct {
	mu      sync.Mutex
	size    int
	entries map[K]*entry[V]
	// ring is the keys in the order they came, allocated at the first
	// (most of the API server's hundred resources are never watched);
	// ring[:filled] are in use.
	ring   []K
	filled int
	next   int
}

type entry[V any] struct {
	once  sync.Once
	value V
	err   error
}

// New makes a ring of size keys; it takes memory only once used.
func New[K comparable, V any](size int) *Ring[K, V] {
	return &Ring[K, V]{size: max(size, 1)}
}

// Get returns compute's result for key, computing it at most once while
// key stays among the most recent.
func (r *Ring[K, V]) Get(key K, compute func() (V, error)) (V, error) {
	r.mu.Lock()
	e := r.entries[key]
	if e == nil {
		if r.ring == nil {
			r.entries, r.ring = map[K]*entry[V]{}, make([]K, r.size)
		}
		e = &entry[V]{}
		if r.next < r.filled {
			delete(r.entries, r.ring[r.next])
		} else {
			r.filled++
		}
		r.ring[r.next] = key
		r.next = (r.next + 1) % r.size
		r.entries[key] = e
	}
	r.mu.Unlock()
	e.once.Do(func() { e.value, e.err = compute() })
	return e.value, e.err
}
