package registry

import (
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
)

// recentDecodes lets the watchers of a resource decode each change once:
// every store watcher receives the same bytes for a change, and without
// this each of 500 watchers would decode them again. The objects are
// shared, so nothing downstream of a watch may modify them.
type recentDecodes struct {
	mu      sync.Mutex
	entries map[decodeKey]*decoded
	ring    []decodeKey // the oldest entry goes first once full
	next    int
}

// decodeKey names one stored version of one object: a key at the revision
// the decoded object reports (a deletion reports the deleting revision).
type decodeKey struct {
	key string
	rev int64
}

type decoded struct {
	once sync.Once
	obj  runtime.Object
	err  error
}

func newRecentDecodes(size int) *recentDecodes {
	return &recentDecodes{entries: make(map[decodeKey]*decoded, size), ring: make([]decodeKey, size)}
}

// decodeShared is decodeAt for watch events: concurrent watchers of one
// change wait for a single decode and all get its object.
func (s *Storage) decodeShared(key string, value []byte, rev int64) (runtime.Object, error) {
	c := s.recent
	k := decodeKey{key, rev}
	c.mu.Lock()
	d := c.entries[k]
	if d == nil {
		d = &decoded{}
		if old := c.ring[c.next]; old.key != "" {
			delete(c.entries, old)
		}
		c.ring[c.next] = k
		c.next = (c.next + 1) % len(c.ring)
		c.entries[k] = d
	}
	c.mu.Unlock()
	d.once.Do(func() { d.obj, d.err = s.decodeAt(value, rev) })
	return d.obj, d.err
}
