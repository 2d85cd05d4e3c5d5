package etcdstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/internal/store"
)

// Defaults, the same as boltstore's where they mean the same.
const (
	DefaultCompactInterval = 5 * time.Minute
	DefaultMaxWatchBacklog = 10000
	DefaultMaxValueSize    = 4 << 20
	DefaultDialTimeout     = 10 * time.Second
	maxKeySize             = 4096
	// compactKey's version counts the compactions of every server sharing
	// the etcd; its value is the newest compacted revision.
	compactKey = "compact_rev_key"
)

// Options configure a Store.
type Options struct {
	// Endpoints of the etcd cluster (Open only).
	Endpoints []string
	// TLS for the client connection (Open only); nil dials plain gRPC.
	TLS *tls.Config
	// DialTimeout bounds Open's first connection.
	DialTimeout time.Duration
	// Prefix is put before every key, so that one etcd can hold other data
	// too (kube-apiserver's --etcd-prefix); the store's callers never see it.
	Prefix string
	// CompactInterval: every interval, history older than the previous
	// tick is compacted by one of the servers. Negative disables it.
	CompactInterval time.Duration
	// MaxWatchBacklog is how far a watcher may fall behind before it is
	// cut off with store.ErrWatcherTooSlow.
	MaxWatchBacklog int
	// MaxValueSize rejects larger values with store.ErrInvalid before
	// etcd does (its own limit is the server's --max-request-bytes).
	MaxValueSize int
	// Expiring gives the keys under a prefix a time to live from their
	// last write, after which etcd deletes them (events).
	Expiring map[string]time.Duration
	Logger   *slog.Logger
}

func (o *Options) setDefaults() {
	if o.CompactInterval == 0 {
		o.CompactInterval = DefaultCompactInterval
	}
	if o.MaxWatchBacklog <= 0 {
		o.MaxWatchBacklog = DefaultMaxWatchBacklog
	}
	if o.MaxValueSize <= 0 {
		o.MaxValueSize = DefaultMaxValueSize
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Store is a store.Store on an etcd cluster.
type Store struct {
	client    *clientv3.Client
	opts      Options
	compacted atomic.Int64
	// compactVersion is the version of compactKey this server last saw:
	// the compare of the next periodic compaction.
	compactVersion int64
	leases         *leases

	mu       sync.Mutex
	closed   bool
	watchers map[*watcher]struct{}
	nextID   uint64
	closing  chan struct{}
	wg       sync.WaitGroup
}

var _ store.Store = (*Store)(nil)

// Open connects to the etcd cluster at opts.Endpoints and checks it answers.
func Open(ctx context.Context, opts Options) (*Store, error) {
	opts.setDefaults()
	if len(opts.Endpoints) == 0 {
		return nil, errors.New("etcd store: no endpoints")
	}
	client, err := clientv3.New(clientv3.Config{
		Endpoints:   opts.Endpoints,
		TLS:         opts.TLS,
		DialTimeout: opts.DialTimeout,
		// A value of MaxValueSize plus the request around it.
		MaxCallSendMsgSize: opts.MaxValueSize + 1<<20,
		// etcd's client logs through zap; orch's errors carry what matters.
		Logger: zap.NewNop(),
		// A dead endpoint is found within 40 s even with no call in flight,
		// so a watch moves to another member.
		DialKeepAliveTime:    30 * time.Second,
		DialKeepAliveTimeout: 10 * time.Second,
	})
	if err != nil {
		return nil, fmt.Errorf("etcd client for %s: %w", strings.Join(opts.Endpoints, ","), err)
	}
	s, err := newStore(ctx, client, opts)
	if err != nil {
		_ = client.Close()
		if why := diagnose(opts.Endpoints[0], opts.TLS); why != nil {
			err = fmt.Errorf("%w (%w)", err, why)
		}
		return nil, fmt.Errorf("etcd at %s: %w", strings.Join(opts.Endpoints, ","), err)
	}
	return s, nil
}

func newStore(ctx context.Context, client *clientv3.Client, opts Options) (*Store, error) {
	s := &Store{client: client, opts: opts, leases: newLeases(client), watchers: map[*watcher]struct{}{}, closing: make(chan struct{})}
	// Reading the compaction key is the first call: it shows etcd answers
	// (the dial itself is lazy) and what was compacted before.
	octx, cancel := context.WithTimeout(ctx, opts.DialTimeout)
	defer cancel()
	resp, err := client.Get(octx, s.opts.Prefix+compactKey)
	if err != nil {
		return nil, mapErr(err)
	}
	if len(resp.Kvs) == 1 {
		s.compactVersion = resp.Kvs[0].Version
		if rev, err := strconv.ParseInt(string(resp.Kvs[0].Value), 10, 64); err == nil {
			s.compacted.Store(rev)
		}
	}
	if opts.CompactInterval > 0 {
		s.wg.Add(1)
		go s.compactLoop(opts.CompactInterval, resp.Header.Revision)
	}
	return s, nil
}

func (s *Store) check() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return store.ErrClosed
	}
	return nil
}

// mapErr turns etcd's errors into the store's.
func mapErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, rpctypes.ErrCompacted):
		return fmt.Errorf("%w: %w", store.ErrCompacted, err)
	case errors.Is(err, rpctypes.ErrFutureRev):
		return fmt.Errorf("%w: %w", store.ErrFutureRevision, err)
	case errors.Is(err, rpctypes.ErrRequestTooLarge), errors.Is(err, rpctypes.ErrEmptyKey):
		return fmt.Errorf("%w: %w", store.ErrInvalid, err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	}
	return fmt.Errorf("etcd: %w", err)
}

func (s *Store) checkWrite(key string, value []byte) error {
	switch {
	case key == "":
		return fmt.Errorf("empty key: %w", store.ErrInvalid)
	case len(key) > maxKeySize:
		return fmt.Errorf("key longer than %d bytes: %w", maxKeySize, store.ErrInvalid)
	case strings.IndexByte(key, 0) >= 0:
		return fmt.Errorf("key contains a NUL byte: %w", store.ErrInvalid)
	case len(value) > s.opts.MaxValueSize:
		return fmt.Errorf("value of %d bytes exceeds %d: %w", len(value), s.opts.MaxValueSize, store.ErrInvalid)
	}
	return s.check()
}

func (s *Store) kv(kv *mvccpb.KeyValue) store.KeyValue {
	return store.KeyValue{
		Key:            strings.TrimPrefix(string(kv.Key), s.opts.Prefix),
		Value:          kv.Value,
		CreateRevision: kv.CreateRevision,
		ModRevision:    kv.ModRevision,
	}
}

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, key string) (store.KeyValue, error) {
	if err := s.check(); err != nil {
		return store.KeyValue{}, err
	}
	resp, err := s.client.Get(ctx, s.opts.Prefix+key)
	if err != nil {
		return store.KeyValue{}, fmt.Errorf("get %s: %w", key, mapErr(err))
	}
	if len(resp.Kvs) == 0 {
		return store.KeyValue{}, fmt.Errorf("get %s: %w", key, store.ErrNotFound)
	}
	return s.kv(resp.Kvs[0]), nil
}

// rangeEnd is the end of the keys under prefix (etcd's prefix range end).
func (s *Store) rangeEnd(prefix string) string {
	return clientv3.GetPrefixRangeEnd(s.opts.Prefix + prefix)
}

// List implements store.Store.
func (s *Store) List(ctx context.Context, prefix string, opts store.ListOptions) (store.ListResult, error) {
	if err := s.check(); err != nil {
		return store.ListResult{}, err
	}
	if opts.Limit < 0 {
		return store.ListResult{}, fmt.Errorf("list limit %d: %w", opts.Limit, store.ErrInvalid)
	}
	if opts.Revision < 0 {
		return store.ListResult{}, fmt.Errorf("list at revision %d: %w", opts.Revision, store.ErrInvalid)
	}
	from, rev := prefix, opts.Revision
	if opts.Continue != "" {
		var err error
		if rev, from, err = store.DecodeContinue(opts.Continue); err != nil {
			return store.ListResult{}, err
		}
		if !strings.HasPrefix(from, prefix) {
			return store.ListResult{}, fmt.Errorf("continue token for another prefix: %w", store.ErrInvalid)
		}
	}
	start := s.opts.Prefix + from
	if start == "" {
		start = "\x00" // the whole key space: etcd refuses an empty key
	}
	ops := []clientv3.OpOption{clientv3.WithRange(s.rangeEnd(prefix)), clientv3.WithLimit(opts.Limit)}
	if rev > 0 {
		ops = append(ops, clientv3.WithRev(rev))
	}
	resp, err := s.client.Get(ctx, start, ops...)
	if err != nil {
		return store.ListResult{}, fmt.Errorf("list %s: %w", prefix, mapErr(err))
	}
	if rev == 0 {
		rev = resp.Header.Revision
	}
	res := store.ListResult{Revision: rev, KVs: make([]store.KeyValue, len(resp.Kvs))}
	for i, kv := range resp.Kvs {
		res.KVs[i] = s.kv(kv)
	}
	if resp.More && len(res.KVs) > 0 {
		res.Continue = store.EncodeContinue(rev, res.KVs[len(res.KVs)-1].Key+"\x00")
		res.Remaining = resp.Count - int64(len(res.KVs))
	}
	return res, nil
}

// Create implements store.Store.
func (s *Store) Create(ctx context.Context, key string, value []byte) (store.KeyValue, error) {
	if err := s.checkWrite(key, value); err != nil {
		return store.KeyValue{}, err
	}
	k := s.opts.Prefix + key
	resp, err := s.putWithLease(ctx, key, func(lease ...clientv3.OpOption) (*clientv3.TxnResponse, error) {
		return s.client.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(k), "=", 0)).
			Then(clientv3.OpPut(k, string(value), lease...)).
			Commit()
	})
	if err != nil {
		return store.KeyValue{}, fmt.Errorf("create %s: %w", key, mapErr(err))
	}
	if !resp.Succeeded {
		return store.KeyValue{}, fmt.Errorf("create %s: %w", key, store.ErrExists)
	}
	rev := resp.Header.Revision
	return store.KeyValue{Key: key, Value: value, CreateRevision: rev, ModRevision: rev}, nil
}

// guarded is the compare an update or delete makes: the expected mod
// revision, or only that the key exists.
func guarded(k string, expected int64) clientv3.Cmp {
	if expected == 0 {
		return clientv3.Compare(clientv3.ModRevision(k), ">", 0)
	}
	return clientv3.Compare(clientv3.ModRevision(k), "=", expected)
}

// failed says why a guarded transaction did not apply, from its Else get.
func failed(resp *clientv3.TxnResponse) error {
	if len(resp.Responses) == 1 {
		if r := resp.Responses[0].GetResponseRange(); r != nil && len(r.Kvs) > 0 {
			return store.ErrConflict
		}
	}
	return store.ErrNotFound
}

// Update implements store.Store.
func (s *Store) Update(ctx context.Context, key string, value []byte, expectedModRevision int64) (store.KeyValue, error) {
	if expectedModRevision < 0 {
		return store.KeyValue{}, fmt.Errorf("expected revision %d: %w", expectedModRevision, store.ErrInvalid)
	}
	if err := s.checkWrite(key, value); err != nil {
		return store.KeyValue{}, err
	}
	k := s.opts.Prefix + key
	resp, err := s.putWithLease(ctx, key, func(lease ...clientv3.OpOption) (*clientv3.TxnResponse, error) {
		return s.client.Txn(ctx).
			If(guarded(k, expectedModRevision)).
			Then(clientv3.OpPut(k, string(value), append(lease, clientv3.WithPrevKV())...)).
			Else(clientv3.OpGet(k, clientv3.WithKeysOnly())).
			Commit()
	})
	if err != nil {
		return store.KeyValue{}, fmt.Errorf("update %s: %w", key, mapErr(err))
	}
	if !resp.Succeeded {
		return store.KeyValue{}, fmt.Errorf("update %s: %w", key, failed(resp))
	}
	rev := resp.Header.Revision
	created := rev
	if put := resp.Responses[0].GetResponsePut(); put != nil && put.PrevKv != nil {
		created = put.PrevKv.CreateRevision
	}
	return store.KeyValue{Key: key, Value: value, CreateRevision: created, ModRevision: rev}, nil
}

// Delete implements store.Store.
func (s *Store) Delete(ctx context.Context, key string, expectedModRevision int64) (store.KeyValue, int64, error) {
	if expectedModRevision < 0 {
		return store.KeyValue{}, 0, fmt.Errorf("expected revision %d: %w", expectedModRevision, store.ErrInvalid)
	}
	if err := s.checkWrite(key, nil); err != nil {
		return store.KeyValue{}, 0, err
	}
	k := s.opts.Prefix + key
	resp, err := s.client.Txn(ctx).
		If(guarded(k, expectedModRevision)).
		Then(clientv3.OpDelete(k, clientv3.WithPrevKV())).
		Else(clientv3.OpGet(k, clientv3.WithKeysOnly())).
		Commit()
	if err != nil {
		return store.KeyValue{}, 0, fmt.Errorf("delete %s: %w", key, mapErr(err))
	}
	if !resp.Succeeded {
		return store.KeyValue{}, 0, fmt.Errorf("delete %s: %w", key, failed(resp))
	}
	del := resp.Responses[0].GetResponseDeleteRange()
	if del == nil || len(del.PrevKvs) != 1 {
		// Only a concurrent delete between compare and apply could do
		// this, and a transaction rules that out.
		return store.KeyValue{}, 0, fmt.Errorf("delete %s: etcd returned no previous value", key)
	}
	return s.kv(del.PrevKvs[0]), resp.Header.Revision, nil
}

// Revision implements store.Store: a linearizable read's header.
func (s *Store) Revision(ctx context.Context) (int64, error) {
	if err := s.check(); err != nil {
		return 0, err
	}
	resp, err := s.client.Get(ctx, s.opts.Prefix+compactKey, clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("revision: %w", mapErr(err))
	}
	return resp.Header.Revision, nil
}

// Compact implements store.Store. Its revision is recorded in compactKey
// (one more write) for the servers that open later.
func (s *Store) Compact(ctx context.Context, revision int64) error {
	if err := s.check(); err != nil {
		return err
	}
	if revision <= 0 {
		return fmt.Errorf("compact at %d: %w", revision, store.ErrInvalid)
	}
	if _, err := s.client.Compact(ctx, revision); err != nil {
		return fmt.Errorf("compact at %d: %w", revision, mapErr(err))
	}
	s.noteCompacted(revision)
	k := s.opts.Prefix + compactKey
	resp, err := s.client.Put(ctx, k, strconv.FormatInt(revision, 10), clientv3.WithPrevKV())
	if err != nil {
		return fmt.Errorf("record compaction at %d: %w", revision, mapErr(err))
	}
	s.mu.Lock()
	if resp.PrevKv != nil {
		s.compactVersion = resp.PrevKv.Version + 1
	} else {
		s.compactVersion = 1
	}
	s.mu.Unlock()
	return nil
}

func (s *Store) noteCompacted(rev int64) {
	for {
		old := s.compacted.Load()
		if rev <= old || s.compacted.CompareAndSwap(old, rev) {
			return
		}
	}
}

// CompactedRevision implements store.Store: the newest compaction this
// server made or saw (another server's shows at its next tick).
func (s *Store) CompactedRevision() int64 { return s.compacted.Load() }

// compactLoop compacts, every interval, the history older than the
// previous tick, when this server wins that interval's compare-and-swap.
func (s *Store) compactLoop(every time.Duration, prev int64) {
	defer s.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		select {
		case <-s.closing:
			return
		case <-t.C:
		}
		now, err := s.claimCompaction(ctx, prev)
		if err != nil && ctx.Err() == nil {
			s.opts.Logger.Error("store compaction failed", "revision", prev, "err", err)
		}
		if now > 0 {
			prev = now
		}
	}
}

// claimCompaction compacts at rev if no other server compacted since this
// one last looked; it returns the current revision.
func (s *Store) claimCompaction(ctx context.Context, rev int64) (int64, error) {
	k := s.opts.Prefix + compactKey
	s.mu.Lock()
	version := s.compactVersion
	s.mu.Unlock()
	resp, err := s.client.Txn(ctx).
		If(clientv3.Compare(clientv3.Version(k), "=", version)).
		Then(clientv3.OpPut(k, strconv.FormatInt(rev, 10))).
		Else(clientv3.OpGet(k)).
		Commit()
	if err != nil {
		return 0, mapErr(err)
	}
	now := resp.Header.Revision
	if !resp.Succeeded {
		// Another server compacted in this interval: take its count.
		if r := resp.Responses[0].GetResponseRange(); r != nil && len(r.Kvs) == 1 {
			s.mu.Lock()
			s.compactVersion = r.Kvs[0].Version
			s.mu.Unlock()
			if done, err := strconv.ParseInt(string(r.Kvs[0].Value), 10, 64); err == nil {
				s.noteCompacted(done)
			}
		}
		return now, nil
	}
	s.mu.Lock()
	s.compactVersion = version + 1
	s.mu.Unlock()
	if rev <= s.compacted.Load() {
		return now, nil
	}
	if _, err := s.client.Compact(ctx, rev); err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
		return now, fmt.Errorf("compact at %d: %w", rev, mapErr(err))
	}
	s.noteCompacted(rev)
	return now, nil
}

// Close implements store.Store: watches end with store.ErrClosed.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closing)
	ws := make([]*watcher, 0, len(s.watchers))
	for w := range s.watchers {
		ws = append(ws, w)
	}
	s.mu.Unlock()
	for _, w := range ws {
		w.stop(store.ErrClosed)
	}
	s.wg.Wait()
	return s.client.Close()
}

// Snapshot writes etcd's snapshot of its whole key space (the file
// `etcdutl snapshot restore` takes) and returns a revision it includes.
func (s *Store) Snapshot(ctx context.Context, w io.Writer) (int64, error) {
	rev, err := s.Revision(ctx)
	if err != nil {
		return 0, err
	}
	rc, err := s.client.Snapshot(ctx)
	if err != nil {
		return 0, fmt.Errorf("etcd snapshot: %w", mapErr(err))
	}
	defer func() { _ = rc.Close() }()
	if _, err := io.Copy(w, rc); err != nil {
		return 0, fmt.Errorf("etcd snapshot: %w", mapErr(err))
	}
	return rev, nil
}

// diagnose says why an endpoint did not answer, where gRPC only says its
// deadline passed: no connection, or the TLS handshake's error (with TLS
// 1.3 a refused client certificate shows at the first read).
func diagnose(endpoint string, cfg *tls.Config) error {
	host := endpoint
	if i := strings.Index(host, "://"); i >= 0 {
		host = host[i+3:]
	}
	conn, err := net.DialTimeout("tcp", host, 3*time.Second)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	if cfg == nil {
		return nil
	}
	cfg = cfg.Clone()
	if cfg.ServerName == "" {
		cfg.ServerName, _, _ = net.SplitHostPort(host)
	}
	cfg.NextProtos = []string{"h2"}
	tc := tls.Client(conn, cfg)
	_ = tc.SetDeadline(time.Now().Add(3 * time.Second))
	if err := tc.Handshake(); err != nil {
		return err
	}
	if _, err := tc.Read(make([]byte, 1)); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		var netErr net.Error
		if !errors.As(err, &netErr) || !netErr.Timeout() {
			return err
		}
	}
	return nil
}

// SetEndpoints sends the store's requests and watches to other members
// from now on (a server's own member, once it votes).
func (s *Store) SetEndpoints(endpoints ...string) { s.client.SetEndpoints(endpoints...) }
