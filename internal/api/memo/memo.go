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
	entries map[K]*entry[V]
	ring    []K
	used    []bool
	next    int
}

type entry[V any] struct {
	once  sync.Once
	value V
	err   error
}

// New makes a ring of size keys.
func New[K comparable, V any](size int) *Ring[K, V] {
	return &Ring[K, V]{entries: make(map[K]*entry[V], size), ring: make([]K, size), used: make([]bool, size)}
}

// Get returns compute's result for key, computing it at most once while
// key stays among the most recent.
func (r *Ring[K, V]) Get(key K, compute func() (V, error)) (V, error) {
	r.mu.Lock()
	e := r.entries[key]
	if e == nil {
		e = &entry[V]{}
		if r.used[r.next] {
			delete(r.entries, r.ring[r.next])
		}
		r.ring[r.next], r.used[r.next] = key, true
		r.next = (r.next + 1) % len(r.ring)
		r.entries[key] = e
	}
	r.mu.Unlock()
	e.once.Do(func() { e.value, e.err = compute() })
	return e.value, e.err
}
