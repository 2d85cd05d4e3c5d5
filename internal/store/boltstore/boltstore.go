package boltstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/orch-dev/orch/internal/store"
)

// Defaults for Options.
const (
	DefaultCompactInterval = 5 * time.Minute
	DefaultWatchRing       = 4096
	DefaultMaxWatchBacklog = 10000
	DefaultMaxValueSize    = 4 << 20
	// volatileReserve revisions are reserved on disk at a time for volatile
	// writes: at a lease renewal every 10 s on 10 nodes, one write a day.
	volatileReserve = 10000
	maxKeySize      = 4096
	maxBatch        = 1024
	// checkpointEvery bounds how long logged writes wait in memory before
	// bbolt gets them: fewer, larger writes to an SD card.
	checkpointEvery = time.Second
	compactBatch    = 10000
	// Durable history is compacted every compactDurableTicks compaction
	// intervals (an hour by default), or at the first interval when
	// compactDurableWrites versions wait; the intervals between compact
	// memory only. Forgetting versions in bbolt rewrites the pages that
	// hold them: fewer, larger compactions rewrite fewer pages per version
	// forgotten, and a board's first compaction, of everything its start
	// wrote (660-820 KB of pages on a board with 30 pods), comes in its first hour's last minutes,
	// not in its fifth.
	compactDurableTicks  = 12
	compactDurableWrites = 10000
)

// The store's files under its directory.
const (
	dbFile  = "orch.db"
	walFile = "orch.wal"
)

// Exists reports whether dir holds a store (Open would make an empty one).
func Exists(dir string) (bool, error) {
	_, err := os.Stat(filepath.Join(dir, dbFile))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// Options configures a Store. The zero value is usable.
type Options struct {
	// VolatilePrefixes name the keys kept in memory only.
	VolatilePrefixes []string
	// CompactInterval: every interval, history older than the previous
	// tick is compacted, keeping between one and two intervals of it; in
	// bbolt only every 12 intervals or once 10,000 writes wait (reads
	// below the compacted revision fail all the same). Negative disables
	// automatic compaction.
	CompactInterval time.Duration
	// WatchRing is how many recent events are kept in memory for new
	// watches; older durable events are replayed from disk.
	WatchRing int
	// MaxWatchBacklog is how far a watcher may fall behind before it is
	// cut off with store.ErrWatcherTooSlow.
	MaxWatchBacklog int
	// MaxValueSize rejects larger values with store.ErrInvalid.
	MaxValueSize int
	// WALSize is the write-ahead log's fixed size, written out in full
	// when it is created.
	WALSize int64
	Logger  *slog.Logger
}

func (o *Options) setDefaults() {
	if o.CompactInterval == 0 {
		o.CompactInterval = DefaultCompactInterval
	}
	if o.WatchRing <= 0 {
		o.WatchRing = DefaultWatchRing
	}
	if o.MaxWatchBacklog <= 0 {
		o.MaxWatchBacklog = DefaultMaxWatchBacklog
	}
	if o.MaxValueSize <= 0 {
		o.MaxValueSize = DefaultMaxValueSize
	}
	if o.WALSize <= 0 {
		o.WALSize = DefaultWALSize
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Store is the bbolt-backed store.Store.
type Store struct {
	opts Options
	db   *bolt.DB
	wal  *wal
	mem  *memTier
	hub  *hub
	// readMu is held for reading across a read of memory and bbolt, and
	// for writing while memory forgets what a checkpoint gave bbolt.
	readMu sync.RWMutex

	current   atomic.Int64 // newest revision visible to reads
	compacted atomic.Int64
	commits   atomic.Int64 // disk commits of writes, for Stats
	written   atomic.Int64 // acknowledged writes, for Stats

	writes chan *writeOp
	// snapshots are answered by the committer between commits.
	snapshots chan snapshotRequest
	// enqueue holds a read lock while queueing a write, and Close takes the
	// write lock to set closed, so every queued write precedes closing and
	// the committer's final drain answers it.
	enqueue sync.RWMutex
	closed  bool
	closing chan struct{}
	wg      sync.WaitGroup
	close   sync.Once

	// owned by the committer goroutine
	lastRev   int64
	ceiling   int64
	unapplied []memWrite // logged, in memory, not yet in bbolt; oldest first
}

var _ store.Store = (*Store)(nil)

// Open opens or creates the store in dir. A second process opening the
// same dir gets an error instead of waiting.
func Open(dir string, opts Options) (*Store, error) {
	opts.setDefaults()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create store dir: %w", err)
	}
	path := filepath.Join(dir, dbFile)
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout:        time.Second,
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
	})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("open %s: another process is using this data dir", path)
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	s := &Store{opts: opts, db: db, writes: make(chan *writeOp, maxBatch), snapshots: make(chan snapshotRequest), closing: make(chan struct{})}
	if err := s.recover(filepath.Join(dir, walFile)); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open %s: %w", dir, err)
	}
	s.current.Store(s.lastRev)
	s.mem = newMemTier(s.compacted.Load(), s.isVolatile)
	s.hub = newHub(s.lastRev, opts.WatchRing, opts.MaxWatchBacklog)
	s.wg.Add(1)
	go s.commitLoop()
	if opts.CompactInterval > 0 {
		s.wg.Add(1)
		go s.compactLoop(opts.CompactInterval)
	}
	return s, nil
}

// recover reads the state bbolt has, then moves into it whatever the WAL
// logged after bbolt's last checkpoint.
func (s *Store) recover(walPath string) error {
	var applied int64
	err := s.db.Update(func(tx *bolt.Tx) error {
		if err := initBuckets(tx); err != nil {
			return err
		}
		applied = metaInt(tx, metaRev)
		s.ceiling = metaInt(tx, metaCeiling)
		s.compacted.Store(metaInt(tx, metaCompacted))
		return nil
	})
	if err != nil {
		return err
	}
	w, logged, err := openWAL(walPath, s.opts.WALSize)
	if err != nil {
		return err
	}
	s.wal = w
	s.lastRev = max(applied, s.ceiling)
	var missing []memWrite
	for _, wv := range logged {
		if wv.v.rev > applied {
			missing = append(missing, wv)
			s.lastRev = max(s.lastRev, wv.v.rev)
		}
	}
	if len(missing) > 0 {
		if err := s.writeBolt(missing, s.lastRev); err != nil {
			_ = w.close()
			return err
		}
	}
	if err := w.reset(); err != nil {
		_ = w.close()
		return err
	}
	return nil
}

// Close stops the watchers and the committer, then closes the file. Writes
// already acknowledged are on disk.
func (s *Store) Close() error {
	var err error
	s.close.Do(func() {
		s.enqueue.Lock()
		s.closed = true
		s.enqueue.Unlock()
		close(s.closing)
		s.wg.Wait()
		s.hub.close(store.ErrClosed)
		err = errors.Join(s.wal.close(), s.db.Close())
	})
	return err
}

func (s *Store) isVolatile(key string) bool {
	for _, p := range s.opts.VolatilePrefixes {
		if strings.HasPrefix(key, p) {
			return true
		}
	}
	return false
}

// spans says which tiers can hold keys under prefix.
func (s *Store) spans(prefix string) (durable, volatile bool) {
	durable = true
	for _, p := range s.opts.VolatilePrefixes {
		if strings.HasPrefix(prefix, p) {
			return false, true
		}
		if strings.HasPrefix(p, prefix) {
			volatile = true
		}
	}
	return durable, volatile
}

func (s *Store) readRevision(rev int64) (int64, error) {
	cur := s.current.Load()
	switch {
	case rev == 0:
		return cur, nil
	case rev < 0:
		return 0, fmt.Errorf("revision %d: %w", rev, store.ErrInvalid)
	case rev > cur:
		return 0, fmt.Errorf("revision %d, newest is %d: %w", rev, cur, store.ErrFutureRevision)
	}
	return rev, nil
}

func (s *Store) open() error {
	select {
	case <-s.closing:
		return store.ErrClosed
	default:
		return nil
	}
}

// Get reads key's current value.
func (s *Store) Get(ctx context.Context, key string) (store.KeyValue, error) {
	if err := s.open(); err != nil {
		return store.KeyValue{}, err
	}
	var v version
	var ok bool
	var err error
	// A read of the newest revision can be overtaken by compaction when
	// its goroutine stalls for longer than the compaction interval; it is
	// read again at the then newest revision, never failed.
	for {
		rev := s.current.Load()
		s.readMu.RLock()
		v, ok, err = s.mem.get(key, rev)
		if err == nil && !ok && !s.isVolatile(key) {
			err = s.db.View(func(tx *bolt.Tx) error {
				v, ok, err = durableGet(tx, key, rev)
				return err
			})
		}
		s.readMu.RUnlock()
		if !errors.Is(err, store.ErrCompacted) {
			break
		}
	}
	if err != nil {
		return store.KeyValue{}, fmt.Errorf("get %q: %w", key, err)
	}
	if !ok || v.tombstone {
		return store.KeyValue{}, fmt.Errorf("get %q: %w", key, store.ErrNotFound)
	}
	return v.keyValue(key), nil
}

// Revision is the newest revision every read sees.
func (s *Store) Revision(ctx context.Context) (int64, error) {
	if err := s.open(); err != nil {
		return 0, err
	}
	return s.current.Load(), nil
}

// Stats counts the store's work since it opened.
type Stats struct {
	// Writes acknowledged, and the disk commits they took: concurrent
	// writers share commits, and volatile writes need almost none.
	Writes, Commits int64
	// FileBytes is the database file's size on disk.
	FileBytes int64
}

// Stats reports the store's counters and its file's size.
func (s *Store) Stats() Stats {
	st := Stats{Writes: s.written.Load(), Commits: s.commits.Load()}
	if fi, err := os.Stat(s.db.Path()); err == nil {
		st.FileBytes = fi.Size()
	}
	return st
}

// CompactedRevision is the newest revision forgotten by compaction.
func (s *Store) CompactedRevision() int64 { return s.compacted.Load() }

// List reads the keys under prefix at one revision, a page at a time.
func (s *Store) List(ctx context.Context, prefix string, opts store.ListOptions) (store.ListResult, error) {
	if err := s.open(); err != nil {
		return store.ListResult{}, err
	}
	if opts.Limit < 0 {
		return store.ListResult{}, fmt.Errorf("list limit %d: %w", opts.Limit, store.ErrInvalid)
	}
	rev, start := opts.Revision, prefix
	if opts.Continue != "" {
		var err error
		if rev, start, err = store.DecodeContinue(opts.Continue); err != nil {
			return store.ListResult{}, err
		}
	}
	rev, err := s.readRevision(rev)
	if err != nil {
		return store.ListResult{}, fmt.Errorf("list %q: %w", prefix, err)
	}
	// One more than asked tells whether another page follows. A limit
	// past 32-bit int (a 32-bit ARM board's) is as good as none.
	want := 0
	if opts.Limit > 0 && opts.Limit < math.MaxInt32 {
		want = int(opts.Limit) + 1
	}
	kvs, err := s.listTiers(prefix, start, rev, want)
	for errors.Is(err, store.ErrCompacted) && opts.Revision == 0 && opts.Continue == "" {
		// As in Get: a list of the newest revision is not failed by a
		// compaction that overtook it.
		rev = s.current.Load()
		kvs, err = s.listTiers(prefix, start, rev, want)
	}
	if err != nil {
		return store.ListResult{}, fmt.Errorf("list %q: %w", prefix, err)
	}
	res := store.ListResult{KVs: kvs, Revision: rev}
	if want > 0 && len(kvs) == want {
		res.KVs = kvs[:opts.Limit]
		res.Continue = store.EncodeContinue(rev, kvs[opts.Limit].Key)
		rest, err := s.listTiers(prefix, kvs[opts.Limit].Key, rev, 0)
		if err != nil {
			return store.ListResult{}, fmt.Errorf("list %q: %w", prefix, err)
		}
		res.Remaining = int64(len(rest))
	}
	return res, nil
}

// listTiers merges memory's keys with bbolt's, skipping in bbolt every key
// whose state at rev memory decides.
func (s *Store) listTiers(prefix, start string, rev int64, limit int) ([]store.KeyValue, error) {
	s.readMu.RLock()
	defer s.readMu.RUnlock()
	fromMemory, err := s.mem.list(prefix, start, rev, limit)
	if err != nil {
		return nil, err
	}
	if durable, _ := s.spans(prefix); !durable {
		return fromMemory, nil
	}
	var fromDisk []store.KeyValue
	skip := func(key string) bool { return s.isVolatile(key) || s.mem.knows(key, rev) }
	err = s.db.View(func(tx *bolt.Tx) error {
		fromDisk, err = durableList(tx, prefix, start, rev, limit, skip)
		return err
	})
	if err != nil {
		return nil, err
	}
	return mergeSorted(fromDisk, fromMemory, limit), nil
}

// mergeSorted merges two key-ordered lists, keeping at most limit (0: all).
func mergeSorted(a, b []store.KeyValue, limit int) []store.KeyValue {
	out := make([]store.KeyValue, 0, len(a)+len(b))
	for len(a) > 0 || len(b) > 0 {
		if limit > 0 && len(out) == limit {
			break
		}
		if len(b) == 0 || (len(a) > 0 && a[0].Key < b[0].Key) {
			out, a = append(out, a[0]), a[1:]
		} else {
			out, b = append(out, b[0]), b[1:]
		}
	}
	return out
}

// Watch streams the events under prefix after afterRevision.
func (s *Store) Watch(ctx context.Context, prefix string, afterRevision int64) (store.Watcher, error) {
	if err := s.open(); err != nil {
		return nil, err
	}
	if afterRevision < 0 {
		return nil, fmt.Errorf("watch from %d: %w", afterRevision, store.ErrInvalid)
	}
	if afterRevision == 0 {
		afterRevision = s.current.Load()
	}
	w, err := s.startWatch(prefix, afterRevision)
	if err != nil {
		return nil, fmt.Errorf("watch %q from %d: %w", prefix, afterRevision, err)
	}
	context.AfterFunc(ctx, w.Stop)
	return w, nil
}

// startWatch registers a watcher so that no event after afterRev is lost or
// doubled: events older than the ring come from disk, the rest from the
// ring, and the watcher joins the fan-out under the same lock that
// publishing takes.
func (s *Store) startWatch(prefix string, afterRev int64) (*watcher, error) {
	_, spansVolatile := s.spans(prefix)
	var backlog []store.Event
	from := afterRev
	for {
		if afterRev < s.compacted.Load() {
			return nil, fmt.Errorf("compacted at %d: %w", s.compacted.Load(), store.ErrCompacted)
		}
		h := s.hub
		h.mu.Lock()
		if h.closed {
			h.mu.Unlock()
			return nil, store.ErrClosed
		}
		if spansVolatile && from < h.volatileLost {
			h.mu.Unlock()
			return nil, fmt.Errorf("volatile history before %d is gone: %w", h.volatileLost+1, store.ErrCompacted)
		}
		first := h.firstInRing()
		if from+1 >= first {
			backlog = append(backlog, h.ringSince(prefix, from)...)
			w := newWatcher(h, prefix, afterRev, backlog)
			h.watchers[w] = struct{}{}
			h.mu.Unlock()
			return w, nil
		}
		h.mu.Unlock()
		// Everything in (from, first) is durable: volatile events there
		// would have been caught by volatileLost above.
		err := s.db.View(func(tx *bolt.Tx) error {
			return durableReplay(tx, prefix, from, first-1, func(ev store.Event) {
				backlog = append(backlog, ev)
			})
		})
		if err != nil {
			return nil, err
		}
		from = first - 1
	}
}

// Compact forgets history at or below rev.
func (s *Store) Compact(ctx context.Context, rev int64) error {
	if err := s.open(); err != nil {
		return err
	}
	if rev > s.current.Load() {
		return fmt.Errorf("compact to %d: %w", rev, store.ErrFutureRevision)
	}
	if rev <= s.compacted.Load() {
		return fmt.Errorf("compact to %d, already at %d: %w", rev, s.compacted.Load(), store.ErrCompacted)
	}
	return s.compact(ctx, rev)
}

func (s *Store) compact(ctx context.Context, rev int64) error {
	// Mark first, in its own commit, so reads below rev fail before any
	// version they need is deleted.
	err := s.db.Update(func(tx *bolt.Tx) error {
		if metaInt(tx, metaCompacted) >= rev {
			return fmt.Errorf("already compacted at %d: %w", metaInt(tx, metaCompacted), store.ErrCompacted)
		}
		return putMetaInt(tx, metaCompacted, rev)
	})
	if err != nil {
		return fmt.Errorf("compact to %d: %w", rev, err)
	}
	s.advanceCompacted(rev)
	for more := true; more; {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("compact to %d: %w", rev, err)
		}
		err := s.db.Update(func(tx *bolt.Tx) (err error) {
			more, err = compactChunk(tx, rev, compactBatch)
			return err
		})
		if err != nil {
			return fmt.Errorf("compact to %d: %w", rev, err)
		}
	}
	return nil
}

// durableHistoryTo counts, up to limit, the writes bbolt holds at or below
// rev that compaction would go through: on an idle cluster the revisions
// since the last compaction are the volatile Lease renewals', and none is.
func (s *Store) durableHistoryTo(rev int64, limit int) (int, error) {
	n := 0
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketLog).Cursor()
		for k, _ := c.First(); k != nil && n < limit && int64(binary.BigEndian.Uint64(k)) <= rev; k, _ = c.Next() {
			n++
		}
		return nil
	})
	return n, err
}

// advanceCompacted moves the compacted revision up to rev, never down (an
// explicit Compact and the loop's may race), and has memory forget.
func (s *Store) advanceCompacted(rev int64) {
	for c := s.compacted.Load(); c < rev; c = s.compacted.Load() {
		if s.compacted.CompareAndSwap(c, rev) {
			break
		}
	}
	s.mem.compact(rev)
}

// autoCompact is the loop's compaction to rev; due says the durable
// history's turn has come. When bbolt holds nothing at or below rev to
// forget, or too little for its turn, only memory forgets and the disk is
// not written (two commits every interval on an idle board's SD card);
// bbolt's own mark stays behind, and a read it then allows below rev finds
// every durable version there. It reports whether no durable history is
// left waiting.
func (s *Store) autoCompact(ctx context.Context, rev int64, due bool) bool {
	n, err := s.durableHistoryTo(rev, compactDurableWrites)
	if err == nil && (n == 0 || n < compactDurableWrites && !due) {
		s.advanceCompacted(rev)
		return n == 0
	}
	if err == nil {
		err = s.compact(ctx, rev)
	}
	if err != nil && !errors.Is(err, store.ErrCompacted) && ctx.Err() == nil {
		s.opts.Logger.Error("store compaction failed", "revision", rev, "err", err)
	}
	return err == nil
}

func (s *Store) compactLoop(every time.Duration) {
	defer s.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-s.closing
		cancel()
	}()
	prev := s.current.Load()
	waited := 0 // intervals since durable history was last compacted
	for {
		select {
		case <-s.closing:
			return
		case <-t.C:
		}
		waited++
		if prev > s.compacted.Load() && s.autoCompact(ctx, prev, waited >= compactDurableTicks) {
			waited = 0
		}
		prev = s.current.Load()
	}
}
