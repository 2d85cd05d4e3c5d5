package boltstore

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"time"

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
	tick := time.NewTicker(checkpointEvery)
	defer tick.Stop()
	batch := make([]*writeOp, 0, maxBatch)
	for {
		select {
		case <-s.closing:
			s.failQueued()
			if err := s.checkpoint(); err != nil {
				s.opts.Logger.Error("store checkpoint at close failed", "err", err)
			}
			return
		case <-tick.C:
			if err := s.checkpoint(); err != nil {
				s.opts.Logger.Error("store checkpoint failed", "err", err)
			}
			continue
		case req := <-s.snapshots:
			s.serveSnapshot(req)
			continue
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
	s       *Store
	read    *bolt.Tx // for compare-and-swap checks of durable keys
	rev     int64
	pending map[string]version // versions written earlier in this batch
	writes  []memWrite
	durable []memWrite
	events  []ringEntry
}

// newest returns key's newest version: this batch's, memory's, or bbolt's.
func (b *batchState) newest(key string, vol bool) (version, bool, error) {
	if v, ok := b.pending[key]; ok {
		return v, true, nil
	}
	if v, ok, _ := b.s.mem.get(key, b.rev); ok || vol {
		return v, ok, nil
	}
	if b.read == nil {
		tx, err := b.s.db.Begin(false)
		if err != nil {
			return version{}, false, fmt.Errorf("begin read: %w", err)
		}
		b.read = tx
	}
	return latestVersion(b.read.Bucket(bucketKV).Cursor(), key, b.rev)
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
	b.rev = rev
	b.pending[op.key] = next
	b.writes = append(b.writes, memWrite{op.key, next})
	if !vol {
		b.durable = append(b.durable, memWrite{op.key, next})
	}
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
	if b.read != nil {
		_ = b.read.Rollback()
	}
	logged, err := s.persist(b)
	if err != nil {
		s.opts.Logger.Error("store commit failed", "err", err)
		for i := range results {
			if results[i].err == nil {
				results[i] = writeResult{err: err}
			}
		}
	} else if b.rev > s.lastRev {
		s.written.Add(b.rev - s.lastRev)
		s.lastRev = b.rev
		s.mem.apply(b.writes)
		if logged {
			s.unapplied = append(s.unapplied, b.durable...)
		}
		// Watches replay from bbolt what the ring no longer holds, so the
		// ring must never drop an event bbolt lacks.
		if len(s.unapplied) > 0 && s.lastRev-s.unapplied[0].v.rev >= int64(s.opts.WatchRing/2) {
			if err := s.checkpoint(); err != nil {
				s.opts.Logger.Error("store checkpoint failed", "err", err)
			}
		}
		s.current.Store(b.rev)
		s.hub.publish(b.events)
	}
	for i, op := range ops {
		op.done <- results[i]
	}
}

// persist makes a batch's durable versions survive a crash: one WAL record
// and one fdatasync, or a bbolt commit when the record is too big for the
// log (then logged is false: there is nothing left to checkpoint). It also
// reserves revisions on disk for volatile writes.
func (s *Store) persist(b *batchState) (logged bool, err error) {
	if len(b.writes) > len(b.durable) && b.rev > s.ceiling {
		if err := s.reserveRevisions(b.rev + volatileReserve); err != nil {
			return false, err
		}
	}
	if len(b.durable) == 0 {
		return false, nil
	}
	payload := encodeWALPayload(b.durable)
	if !s.wal.fits(len(payload)) {
		if err := s.checkpoint(); err != nil {
			return false, err
		}
	}
	if s.wal.fits(len(payload)) {
		s.commits.Add(1)
		return true, s.wal.append(payload)
	}
	return false, s.writeBolt(b.durable, b.rev)
}

func (s *Store) reserveRevisions(ceiling int64) error {
	s.commits.Add(1)
	err := s.db.Update(func(tx *bolt.Tx) error { return putMetaInt(tx, metaCeiling, ceiling) })
	if err != nil {
		return fmt.Errorf("reserve revisions: %w", err)
	}
	s.ceiling = ceiling
	return nil
}

// checkpoint writes the logged versions into bbolt and empties the log.
func (s *Store) checkpoint() error {
	if len(s.unapplied) == 0 {
		return nil
	}
	if err := s.writeBolt(s.unapplied, s.lastRev); err != nil {
		return err
	}
	s.unapplied = s.unapplied[:0]
	if err := s.wal.reset(); err != nil {
		return err
	}
	// Readers hold readMu across memory and bbolt, so none sees a version
	// vanish from memory before bbolt has it.
	s.readMu.Lock()
	s.mem.forgetCheckpointed(s.lastRev)
	s.readMu.Unlock()
	return nil
}

// writeBolt commits versions to bbolt with rev as its newest revision.
func (s *Store) writeBolt(vs []memWrite, rev int64) error {
	s.commits.Add(1)
	err := s.db.Update(func(tx *bolt.Tx) error {
		for _, w := range vs {
			if err := durablePut(tx, w.key, w.v); err != nil {
				return err
			}
		}
		return putMetaInt(tx, metaRev, rev)
	})
	if err != nil {
		return fmt.Errorf("checkpoint to revision %d: %w", rev, err)
	}
	return nil
}
