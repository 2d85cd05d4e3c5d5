package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/store"
	"github.com/orch-dev/orch/internal/store/etcdstore"
	"github.com/orch-dev/orch/internal/store/etcdstore/etcdtest"
	"github.com/orch-dev/orch/internal/store/storetest"
)

// endpoint is the client URL of the one-member etcd the package's tests
// share; each store gets a key prefix of its own on it.
var endpoint string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "etcdstore-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	e, err := etcdtest.StartIn(dir, etcdtest.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	endpoint = e.Endpoint
	code := m.Run()
	e.Close()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

var stores atomic.Int64

func open(t *testing.T, opts etcdstore.Options) *etcdstore.Store {
	t.Helper()
	opts.Endpoints = []string{endpoint}
	if opts.Prefix == "" {
		opts.Prefix = fmt.Sprintf("/test%d", stores.Add(1))
	}
	if opts.CompactInterval == 0 {
		opts.CompactInterval = -1
	}
	s, err := etcdstore.Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, _ []string) store.Store { return open(t, etcdstore.Options{}) })
}

func TestOpenUnreachable(t *testing.T) {
	start := time.Now()
	_, err := etcdstore.Open(context.Background(), etcdstore.Options{Endpoints: []string{"127.0.0.1:1"}, DialTimeout: time.Second})
	if err == nil {
		t.Fatal("opened a store on a port where no etcd listens")
	}
	if time.Since(start) > 10*time.Second {
		t.Fatalf("took %s to fail", time.Since(start))
	}
}

// A value over the limit is refused by orch with ErrInvalid, before etcd
// sees it (etcd's own answer would be "request is too large").
func TestValueTooLarge(t *testing.T) {
	s := open(t, etcdstore.Options{MaxValueSize: 1024})
	defer func() { _ = s.Close() }()
	_, err := s.Create(context.Background(), "/big", make([]byte, 1025))
	if !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("create of 1025 bytes: %v, want ErrInvalid", err)
	}
}

// Stores sharing one etcd share its state: what one server writes another
// reads and watches, as several servers on one etcd do.
func TestServersShareState(t *testing.T) {
	a := open(t, etcdstore.Options{Prefix: "/shared"})
	defer func() { _ = a.Close() }()
	b := open(t, etcdstore.Options{Prefix: "/shared"})
	defer func() { _ = b.Close() }()
	ctx := context.Background()
	w, err := b.Watch(ctx, "/registry/", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	kv := storetest.MustCreate(t, a, "/registry/x", "1")
	if ev := storetest.NextEvent(t, w); ev.Revision != kv.ModRevision || string(ev.KV.Value) != "1" {
		t.Fatalf("b saw %+v, want a's create at %d", ev, kv.ModRevision)
	}
	if _, err := b.Update(ctx, "/registry/x", []byte("2"), kv.ModRevision); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Update(ctx, "/registry/x", []byte("3"), kv.ModRevision); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a's stale update: %v, want ErrConflict", err)
	}
}

// Periodic compaction runs, and a server opened later knows what was
// compacted.
func TestPeriodicCompaction(t *testing.T) {
	ctx := context.Background()
	a := open(t, etcdstore.Options{Prefix: "/compacting", CompactInterval: 200 * time.Millisecond})
	defer func() { _ = a.Close() }()
	first := storetest.MustCreate(t, a, "/k", "v")
	deadline := time.Now().Add(10 * time.Second)
	for a.CompactedRevision() < first.ModRevision {
		if time.Now().After(deadline) {
			t.Fatalf("nothing compacted past %d in 10s (at %d)", first.ModRevision, a.CompactedRevision())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := a.List(ctx, "/", store.ListOptions{Revision: first.ModRevision - 1}); !errors.Is(err, store.ErrCompacted) {
		t.Fatalf("list below the compaction: %v, want ErrCompacted", err)
	}
	c := open(t, etcdstore.Options{Prefix: "/compacting"})
	defer func() { _ = c.Close() }()
	if c.CompactedRevision() < first.ModRevision {
		t.Fatalf("a server opened later knows compaction at %d, want at least %d", c.CompactedRevision(), first.ModRevision)
	}
}

// Of servers sharing an etcd, one compacts per interval: the first to
// claim the tick; another, whose claim is stale, takes note instead, and
// wins the next.
func TestCompactionClaimedByOne(t *testing.T) {
	ctx := context.Background()
	a := open(t, etcdstore.Options{Prefix: "/claims"})
	defer func() { _ = a.Close() }()
	b := open(t, etcdstore.Options{Prefix: "/claims"})
	defer func() { _ = b.Close() }()
	one := storetest.MustCreate(t, a, "/k1", "v")
	if _, err := a.ClaimCompaction(ctx, one.ModRevision); err != nil {
		t.Fatal(err)
	}
	if a.CompactedRevision() != one.ModRevision {
		t.Fatalf("a compacted at %d, want %d", a.CompactedRevision(), one.ModRevision)
	}
	two := storetest.MustCreate(t, a, "/k2", "v")
	if _, err := b.ClaimCompaction(ctx, two.ModRevision); err != nil {
		t.Fatal(err)
	}
	if b.CompactedRevision() != one.ModRevision {
		t.Fatalf("b, whose claim was stale, is at %d: want a's %d (b must not compact this tick)", b.CompactedRevision(), one.ModRevision)
	}
	if _, err := a.List(ctx, "/", store.ListOptions{Revision: two.ModRevision - 1}); err != nil {
		t.Fatalf("history after a's compaction is gone: %v", err)
	}
	if _, err := b.ClaimCompaction(ctx, two.ModRevision); err != nil {
		t.Fatal(err)
	}
	if b.CompactedRevision() != two.ModRevision {
		t.Fatalf("b's next claim compacted at %d, want %d", b.CompactedRevision(), two.ModRevision)
	}
}

// A watcher that does not read is cut off at its backlog limit instead of
// holding every event in memory.
func TestSlowWatcherCutOff(t *testing.T) {
	s := open(t, etcdstore.Options{MaxWatchBacklog: 50})
	defer func() { _ = s.Close() }()
	w, err := s.Watch(context.Background(), "/", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for i := range 200 {
		storetest.MustCreate(t, s, fmt.Sprintf("/k%03d", i), "v")
	}
	// Only now does the consumer read: it gets what was buffered, then the end.
	deadline := time.After(10 * time.Second)
	for n := 0; ; n++ {
		select {
		case _, ok := <-w.Events():
			if !ok {
				if !errors.Is(w.Err(), store.ErrWatcherTooSlow) || n >= 200 {
					t.Fatalf("watch ended with %v after %d events, want ErrWatcherTooSlow before 200", w.Err(), n)
				}
				return
			}
		case <-deadline:
			t.Fatal("a watcher 150 events behind was not cut off")
		}
	}
}

// TestHoldKey: a held key is there while its holder lives, goes at once
// when it lets go, and goes by itself a TTL after its holder is cut off
// (a death: nothing revoked). Renewals write nothing: the revision stays.
func TestHoldKey(t *testing.T) {
	a := open(t, etcdstore.Options{Prefix: "/hold"})
	defer func() { _ = a.Close() }()
	watcher := open(t, etcdstore.Options{Prefix: "/hold"})
	defer func() { _ = watcher.Close() }()
	present := func() bool {
		_, err := watcher.Get(context.Background(), "/servers/a")
		return err == nil
	}
	hold := func(s *etcdstore.Store) (letGo func()) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.HoldKey(ctx, "/servers/a", []byte("a"), 2*time.Second) }()
		deadline := time.Now().Add(10 * time.Second)
		for !present() {
			if time.Now().After(deadline) {
				t.Fatal("the held key never appeared")
			}
			time.Sleep(20 * time.Millisecond)
		}
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("HoldKey: %v", err)
			}
		}
	}

	letGo := hold(a)
	rev, err := watcher.Revision(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // past the TTL: renewed meanwhile
	if !present() {
		t.Fatal("the held key expired while held")
	}
	if now, _ := watcher.Revision(context.Background()); now != rev {
		t.Errorf("holding the key wrote: revision %d, then %d", rev, now)
	}
	letGo()
	if present() {
		t.Error("the key is there after its holder let go")
	}

	b := open(t, etcdstore.Options{Prefix: "/hold"})
	defer func() { _ = b.Close() }()
	letGo = hold(b)
	defer letGo()
	if err := b.Disconnect(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for present() {
		if time.Now().After(deadline) {
			t.Fatal("the key of a holder cut off never went")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Keys of an expiring prefix are deleted by etcd a TTL after their last
// write, as kube-apiserver's events: the watchers see the deletion, other
// keys stay, the writes of a moment share one lease, and a lease etcd no
// longer has is replaced on the next write.
func TestExpiringKeys(t *testing.T) {
	ctx := context.Background()
	s := open(t, etcdstore.Options{Prefix: "/expire", Expiring: map[string]time.Duration{"/events/": 2 * time.Second}})
	defer func() { _ = s.Close() }()
	rev, err := s.Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w, err := s.Watch(ctx, "/events/", rev)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for _, key := range []string{"/events/a", "/events/b", "/kept/c"} {
		if _, err := s.Create(ctx, key, []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	a, _ := s.LeaseOf(ctx, "/events/a")
	b, _ := s.LeaseOf(ctx, "/events/b")
	c, _ := s.LeaseOf(ctx, "/kept/c")
	if a == 0 || a != b || c != 0 {
		t.Fatalf("leases: /events/a %x, /events/b %x (want one shared), /kept/c %x (want none)", a, b, c)
	}
	if err := s.RevokeLease(ctx, a); err != nil { // deletes both at once
		t.Fatal(err)
	}
	if _, err := s.Create(ctx, "/events/d", []byte("v")); err != nil {
		t.Fatalf("a write after etcd lost the lease: %v", err)
	}
	if d, _ := s.LeaseOf(ctx, "/events/d"); d == 0 || d == a {
		t.Fatalf("/events/d on lease %x after %x was revoked", d, a)
	}
	// An update keeps the key expiring (a put without a lease would not).
	if _, err := s.Update(ctx, "/events/d", []byte("v2"), 0); err != nil {
		t.Fatal(err)
	}
	deleted := map[string]bool{}
	timeout := time.After(20 * time.Second)
	for len(deleted) < 3 {
		select {
		case e := <-w.Events():
			if e.Type == store.EventDelete {
				deleted[e.KV.Key] = true
			}
		case <-timeout:
			t.Fatalf("deletions seen within 20 s: %v (want /events/a, b and d)", deleted)
		}
	}
	if _, err := s.Get(ctx, "/kept/c"); err != nil {
		t.Errorf("a key of no expiring prefix: %v", err)
	}
}
