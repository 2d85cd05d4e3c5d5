package boltstore

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/orch-dev/orch/internal/store"
)

// volatileTier keeps every version of the volatile keys since the last
// compaction, in memory. The committer is its only writer.
type volatileTier struct {
	mu        sync.RWMutex
	keys      map[string][]version // oldest first
	compacted int64
}

func newVolatileTier(compacted int64) *volatileTier {
	return &volatileTier{keys: map[string][]version{}, compacted: compacted}
}

func (t *volatileTier) checkReadable(rev int64) error {
	if rev < t.compacted {
		return fmt.Errorf("read at revision %d, compacted at %d: %w", rev, t.compacted, store.ErrCompacted)
	}
	return nil
}

// newest returns key's newest version at or below atRev, tombstones
// included. The caller holds mu.
func (t *volatileTier) newest(key string, atRev int64) (version, bool) {
	vs := t.keys[key]
	i := sort.Search(len(vs), func(i int) bool { return vs[i].rev > atRev })
	if i == 0 {
		return version{}, false
	}
	return vs[i-1], true
}

func (t *volatileTier) get(key string, atRev int64) (version, bool, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if err := t.checkReadable(atRev); err != nil {
		return version{}, false, err
	}
	v, ok := t.newest(key, atRev)
	if !ok || v.tombstone {
		return version{}, false, nil
	}
	return v, true, nil
}

func (t *volatileTier) list(prefix, startKey string, atRev int64, limit int) ([]store.KeyValue, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if err := t.checkReadable(atRev); err != nil {
		return nil, err
	}
	var names []string
	for k := range t.keys {
		if strings.HasPrefix(k, prefix) && k >= startKey {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	var out []store.KeyValue
	for _, k := range names {
		if limit > 0 && len(out) >= limit {
			break
		}
		if v, ok := t.newest(k, atRev); ok && !v.tombstone {
			out = append(out, v.keyValue(k))
		}
	}
	return out, nil
}

// volatileWrite is one version the committer has made durable-in-order.
type volatileWrite struct {
	key string
	v   version
}

func (t *volatileTier) apply(ws []volatileWrite) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, w := range ws {
		t.keys[w.key] = append(t.keys[w.key], w.v)
	}
}

// compact forgets versions superseded at or below rev, and tombstones that
// are a key's newest version at or below rev.
func (t *volatileTier) compact(rev int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.compacted = max(t.compacted, rev)
	for k, vs := range t.keys {
		i := sort.Search(len(vs), func(i int) bool { return vs[i].rev > rev })
		if i == 0 {
			continue
		}
		keep := i - 1 // newest version at or below rev
		if vs[keep].tombstone {
			keep++
		}
		if keep == len(vs) {
			delete(t.keys, k)
			continue
		}
		t.keys[k] = slices.Clone(vs[keep:])
	}
}
