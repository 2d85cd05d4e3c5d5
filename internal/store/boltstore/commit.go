package boltstore

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	bolt "go.etcd.io/bbolt"

	"github.com/orch-dev/orch/internal/store"
)

type opKind uint8

const (
	opCreate opKind = iota + 1
	opUpdate
	opDelete
)

type writeOp struct {
	kind   opKind
	key    string
	value  []byte
	expect int64 // expected ModRevision; 0: any
	done   chan writeResult
}

type writeResult struct {
	kv  store.KeyValue // the new version; for a delete, the deleted one
	rev int64
	err error
}

// Create writes key if it does not exist.
func (s *Store) Create(ctx context.Context, key string, value []byte) (store.KeyValue, error) {
	r := s.write(ctx, &writeOp{kind: opCreate, key: key, value: value})
	if r.err != nil {
		return store.KeyValue{}, fmt.Errorf("create %q: %w", key, r.err)
	}
	return r.kv, nil
}

// Update replaces key's value if its ModRevision is expectedModRevision.
func (s *Store) Update(ctx context.Context, key string, value []byte, expectedModRevision int64) (store.KeyValue, error) {
	r := s.write(ctx, &writeOp{kind: opUpdate, key: key, value: value, expect: expectedModRevision})
	if r.err != nil {
		return store.KeyValue{}, fmt.Errorf("update %q: %w", key, r.err)
	}
	return r.kv, nil
}

// Delete removes key if its ModRevision is expectedModRevision.
func (s *Store) Delete(ctx context.Context, key string, expectedModRevision int64) (store.KeyValue, int64, error) {
	r := s.write(ctx, &writeOp{kind: opDelete, key: key, expect: expectedModRevision})
	if r.err != nil {
		return store.KeyValue{}, 0, fmt.Errorf("delete %q: %w", key, r.err)
	}
	return r.kv, r.rev, nil
}

func (s *Store) validate(op *writeOp) error {
	switch {
	case op.key == "":
		return fmt.Errorf("empty key: %w", store.ErrInvalid)
	case len(op.key) > maxKeySize:
		return fmt.Errorf("key longer than %d bytes: %w", maxKeySize, store.ErrInvalid)
	case strings.IndexByte(op.key, 0) >= 0:
		return fmt.Errorf("key contains a NUL byte: %w", store.ErrInvalid)
	case len(op.value) > s.opts.MaxValueSize:
		return fmt.Errorf("value of %d bytes exceeds %d: %w", len(op.value), s.opts.MaxValueSize, store.ErrInvalid)
	case op.expect < 0:
		return fmt.Errorf("expected revision %d: %w", op.expect, store.ErrInvalid)
	}
	return nil
}

// write queues op for the committer and waits for its answer. Once queued,
// the answer is awaited even if ctx ends, so a caller never mistakes a
// committed write for a failed one.
func (s *Store) write(ctx context.Context, op *writeOp) writeResult {
	if err := s.validate(op); err != nil {
		return writeResult{err: err}
	}
	op.value = bytes.Clone(op.value)
	op.done = make(chan writeResult, 1)
	s.enqueue.RLock()
	if s.closed {
		s.enqueue.RUnlock()
		return writeResult{err: store.ErrClosed}
	}
	select {
	case s.writes <- op:
	case <-ctx.Done():
		s.enqueue.RUnlock()
		return writeResult{err: ctx.Err()}
	}
	s.enqueue.RUnlock()
	return <-op.done
}

func (s *Store) commitLoop() {
	defer s.wg.Done()
	batch := make([]*writeOp, 0, maxBatch)
	for {
		select {
		case <-s.closing:
			s.failQueued()
			return
		case op := <-s.writes:
			batch = append(batch[:0], op)
		}
		// Take whatever queued while the last commit synced: concurrent
		// writers share one sync, and a lone writer waits for none.
	drain:
		for len(batch) < maxBatch {
			select {
			case op := <-s.writes:
				batch = append(batch, op)
			default:
				break drain
			}
		}
		s.commit(batch)
	}
}

func (s *Store) failQueued() {
	for {
		select {
		case op := <-s.writes:
			op.done <- writeResult{err: store.ErrClosed}
		default:
			return
		}
	}
}

// batchState is one commit being built.
type batchState struct {
	s        *Store
	tx       *bolt.Tx
	rev      int64
	pending  map[string]version // volatile versions written in this batch
	volatile []volatileWrite
	events   []ringEntry
	durable  bool
}

func (b *batchState) writeTx() (*bolt.Tx, error) {
	if b.tx == nil {
		tx, err := b.s.db.Begin(true)
		if err != nil {
			return nil, fmt.Errorf("begin commit: %w", err)
		}
		b.tx = tx
	}
	return b.tx, nil
}

// newest returns key's newest version including this batch's writes.
func (b *batchState) newest(key string, vol bool) (version, bool, error) {
	if !vol {
		tx, err := b.writeTx()
		if err != nil {
			return version{}, false, err
		}
		return latestVersion(tx.Bucket(bucketKV).Cursor(), key, b.rev)
	}
	if v, ok := b.pending[key]; ok {
		return v, true, nil
	}
	b.s.volatile.mu.RLock()
	defer b.s.volatile.mu.RUnlock()
	v, ok := b.s.volatile.newest(key, b.rev)
	return v, ok, nil
}

// apply checks op against the state so far and stages its version.
func (b *batchState) apply(op *writeOp) writeResult {
	vol := b.s.isVolatile(op.key)
	cur, ok, err := b.newest(op.key, vol)
	if err != nil {
		return writeResult{err: err}
	}
	live := ok && !cur.tombstone
	switch {
	case op.kind == opCreate && live:
		return writeResult{err: store.ErrExists}
	case op.kind != opCreate && !live:
		return writeResult{err: store.ErrNotFound}
	case op.kind != opCreate && op.expect != 0 && op.expect != cur.rev:
		return writeResult{err: fmt.Errorf("%w: expected %d, is %d", store.ErrConflict, op.expect, cur.rev)}
	}
	rev := b.rev + 1
	next := version{rev: rev, createRev: rev, value: op.value}
	switch op.kind {
	case opUpdate:
		next.createRev = cur.createRev
	case opDelete:
		next = version{rev: rev, createRev: cur.createRev, tombstone: true}
	}
	if vol {
		b.pending[op.key] = next
		b.volatile = append(b.volatile, volatileWrite{op.key, next})
	} else {
		tx, err := b.writeTx()
		if err != nil {
			return writeResult{err: err}
		}
		if err := durablePut(tx, op.key, next); err != nil {
			return writeResult{err: err}
		}
		b.durable = true
	}
	b.rev = rev
	ev := store.Event{Type: store.EventPut, KV: next.keyValue(op.key), Revision: rev}
	if live {
		prev := cur.keyValue(op.key)
		ev.PrevKV = &prev
	}
	if op.kind == opDelete {
		ev.Type, ev.KV = store.EventDelete, store.KeyValue{Key: op.key, ModRevision: rev}
		b.events = append(b.events, ringEntry{ev, vol})
		return writeResult{kv: *ev.PrevKV, rev: rev}
	}
	b.events = append(b.events, ringEntry{ev, vol})
	return writeResult{kv: ev.KV, rev: rev}
}

// commit makes a batch durable, then visible, then answers its writers.
func (s *Store) commit(ops []*writeOp) {
	b := &batchState{s: s, rev: s.lastRev, pending: map[string]version{}}
	results := make([]writeResult, len(ops))
	for i, op := range ops {
		results[i] = b.apply(op)
	}
	if err := b.finish(); err != nil {
		s.opts.Logger.Error("store commit failed", "err", err)
		for i := range results {
			if results[i].err == nil {
				results[i] = writeResult{err: err}
			}
		}
	} else if b.rev > s.lastRev {
		s.written.Add(b.rev - s.lastRev)
		s.lastRev = b.rev
		s.volatile.apply(b.volatile)
		s.current.Store(b.rev)
		s.hub.publish(b.events)
	}
	for i, op := range ops {
		op.done <- results[i]
	}
}

// finish records the revision on disk and commits, or rolls back on error.
func (b *batchState) finish() error {
	needCeiling := len(b.volatile) > 0 && b.rev > b.s.ceiling
	if needCeiling {
		if _, err := b.writeTx(); err != nil {
			return err
		}
	}
	if b.tx == nil {
		return nil
	}
	err := func() error {
		if b.durable {
			if err := putMetaInt(b.tx, metaRev, b.rev); err != nil {
				return err
			}
		}
		if needCeiling {
			if err := putMetaInt(b.tx, metaCeiling, b.rev+volatileReserve); err != nil {
				return err
			}
		}
		if !b.durable && !needCeiling {
			return b.tx.Rollback()
		}
		b.s.commits.Add(1)
		return b.tx.Commit()
	}()
	if err != nil {
		_ = b.tx.Rollback()
		return fmt.Errorf("commit revision %d: %w", b.rev, err)
	}
	if needCeiling {
		b.s.ceiling = b.rev + volatileReserve
	}
	return nil
}
