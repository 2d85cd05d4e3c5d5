package boltstore

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/orch-dev/orch/internal/store"
)

// memTier holds, in memory, every version of the volatile keys since the
// last compaction, and the versions of durable keys logged to the WAL but
// not yet checkpointed into bbolt. For any key it holds, its newest version
// at or below a revision is newer than anything bbolt has. The committer is
// its only writer.
type memTier struct {
	mu         sync.RWMutex
	keys       map[string][]version // oldest first
	compacted  int64
	isVolatile func(string) bool
}

func newMemTier(compacted int64, isVolatile func(string) bool) *memTier {
	return &memTier{keys: map[string][]version{}, compacted: compacted, isVolatile: isVolatile}
}

func (t *memTier) checkReadable(rev int64) error {
	if rev < t.compacted {
		return fmt.Errorf("read at revision %d, compacted at %d: %w", rev, t.compacted, store.ErrCompacted)
	}
	return nil
}

// newest returns key's newest version at or below atRev, tombstones
// included. The caller holds mu.
func (t *memTier) newest(key string, atRev int64) (version, bool) {
	vs := t.keys[key]
	i := sort.Search(len(vs), func(i int) bool { return vs[i].rev > atRev })
	if i == 0 {
		return version{}, false
	}
	return vs[i-1], true
}

// get reports whether memory knows key at atRev; if it does, v is the
// answer (a tombstone means the key does not exist).
func (t *memTier) get(key string, atRev int64) (v version, known bool, err error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if err := t.checkReadable(atRev); err != nil {
		return version{}, false, err
	}
	v, known = t.newest(key, atRev)
	return v, known, nil
}

// knows reports whether memory decides key's state at atRev.
func (t *memTier) knows(key string, atRev int64) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	_, ok := t.newest(key, atRev)
	return ok
}

// list returns the live keys memory decides under prefix from startKey.
func (t *memTier) list(prefix, startKey string, atRev int64, limit int) ([]store.KeyValue, error) {
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

// memWrite is one version the committer has made durable (or, for a
// volatile key, decided).
type memWrite struct {
	key string
	v   version
}

func (t *memTier) apply(ws []memWrite) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, w := range ws {
		t.keys[w.key] = append(t.keys[w.key], w.v)
	}
}

// forgetCheckpointed drops durable versions at or below rev: bbolt has them.
func (t *memTier) forgetCheckpointed(rev int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, vs := range t.keys {
		if t.isVolatile(k) {
			continue
		}
		i := sort.Search(len(vs), func(i int) bool { return vs[i].rev > rev })
		if i == len(vs) {
			delete(t.keys, k)
		} else if i > 0 {
			t.keys[k] = slices.Clone(vs[i:])
		}
	}
}

// compact forgets volatile versions superseded at or below rev, and
// tombstones that are a key's newest version at or below rev. Durable
// versions stay until checkpointed: bbolt may still hold older ones they
// hide.
func (t *memTier) compact(rev int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.compacted = max(t.compacted, rev)
	for k, vs := range t.keys {
		if !t.isVolatile(k) {
			continue
		}
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
