package boltstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/store"
	"github.com/orch-dev/orch/internal/store/storetest"
)

func reopen(t *testing.T, s *Store, dir string, opts Options) *Store {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s2.Close() })
	return s2
}

func TestReopenKeepsDurableForgetsVolatile(t *testing.T) {
	opts := Options{VolatilePrefixes: []string{"/leases/"}, CompactInterval: -1}
	s, dir := openTest(t, opts)
	ctx := context.Background()
	pod := storetest.MustCreate(t, s, "/pods/a", "pod")
	storetest.MustCreate(t, s, "/leases/n1", "lease")
	var last store.KeyValue
	for i := range 50 {
		var err error
		if last, err = s.Update(ctx, "/leases/n1", fmt.Appendf(nil, "renew %d", i), 0); err != nil {
			t.Fatal(err)
		}
	}
	s = reopen(t, s, dir, opts)
	if got, err := s.Get(ctx, "/pods/a"); err != nil || got.ModRevision != pod.ModRevision || string(got.Value) != "pod" {
		t.Fatalf("durable key after reopen = %+v, %v", got, err)
	}
	if _, err := s.Get(ctx, "/leases/n1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("volatile key survived reopen: %v", err)
	}
	// Revisions handed out to volatile writes are never handed out again.
	if rev, _ := s.Revision(ctx); rev < last.ModRevision {
		t.Fatalf("revision went back from %d to %d", last.ModRevision, rev)
	}
	next := storetest.MustCreate(t, s, "/pods/b", "pod")
	if next.ModRevision <= last.ModRevision {
		t.Fatalf("new write got revision %d, not above %d used before the restart", next.ModRevision, last.ModRevision)
	}
	// A watch that needs volatile history from before the restart must relist;
	// one over durable keys only can resume.
	if _, err := s.Watch(ctx, "/leases/", pod.ModRevision); !errors.Is(err, store.ErrCompacted) {
		t.Fatalf("watch of lost volatile history: %v, want ErrCompacted", err)
	}
	w, err := s.Watch(ctx, "/pods/", pod.ModRevision)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if ev := storetest.NextEvent(t, w); ev.Revision != next.ModRevision || ev.KV.Key != "/pods/b" {
		t.Fatalf("durable watch across restart got %+v", ev)
	}
}

func TestVolatileWritesRarelyTouchDisk(t *testing.T) {
	s, _ := openTest(t, Options{VolatilePrefixes: []string{"/leases/"}, CompactInterval: -1})
	ctx := context.Background()
	storetest.MustCreate(t, s, "/leases/n1", "x")
	before := s.Stats()
	for range 1000 {
		if _, err := s.Update(ctx, "/leases/n1", []byte("renew"), 0); err != nil {
			t.Fatal(err)
		}
	}
	after := s.Stats()
	if after.Writes-before.Writes != 1000 || after.Commits != before.Commits {
		t.Fatalf("1000 volatile writes took %d disk commits", after.Commits-before.Commits)
	}
}

func TestWatchReplaysOlderEventsFromDisk(t *testing.T) {
	s, _ := openTest(t, Options{WatchRing: 4, CompactInterval: -1})
	ctx := context.Background()
	first := storetest.MustCreate(t, s, "/a/0", "0")
	for i := 1; i < 20; i++ {
		storetest.MustCreate(t, s, fmt.Sprintf("/a/%d", i), "x")
		storetest.MustCreate(t, s, fmt.Sprintf("/b/%d", i), "x")
	}
	if _, err := s.Update(ctx, "/a/3", []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	w, err := s.Watch(ctx, "/a/", first.ModRevision)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	last := first.ModRevision
	for i := 1; i < 20; i++ {
		ev := storetest.NextEvent(t, w)
		if ev.KV.Key != fmt.Sprintf("/a/%d", i) || ev.Revision <= last || !ev.IsCreate() {
			t.Fatalf("replayed event %d = %+v after revision %d", i, ev, last)
		}
		last = ev.Revision
	}
	ev := storetest.NextEvent(t, w)
	if ev.KV.Key != "/a/3" || ev.PrevKV == nil || string(ev.PrevKV.Value) != "x" {
		t.Fatalf("update event from the ring = %+v", ev)
	}
}

func TestEvictedVolatileHistoryIsCompacted(t *testing.T) {
	s, _ := openTest(t, Options{WatchRing: 4, VolatilePrefixes: []string{"/leases/"}, CompactInterval: -1})
	start := storetest.MustCreate(t, s, "/pods/a", "x")
	for i := range 10 {
		storetest.MustCreate(t, s, fmt.Sprintf("/leases/%d", i), "x")
	}
	if _, err := s.Watch(context.Background(), "/leases/", start.ModRevision); !errors.Is(err, store.ErrCompacted) {
		t.Fatalf("watch past evicted volatile events: %v, want ErrCompacted", err)
	}
	if _, err := s.Watch(context.Background(), "/", start.ModRevision); !errors.Is(err, store.ErrCompacted) {
		t.Fatalf("watch of a prefix spanning both tiers: %v, want ErrCompacted", err)
	}
	w, err := s.Watch(context.Background(), "/pods/", start.ModRevision-1)
	if err != nil {
		t.Fatalf("durable-only watch should replay from disk: %v", err)
	}
	w.Stop()
}

func TestSecondOpenOfSameDirFails(t *testing.T) {
	_, dir := openTest(t, Options{CompactInterval: -1})
	start := time.Now()
	_, err := Open(dir, Options{})
	if err == nil || !strings.Contains(err.Error(), "another process") {
		t.Fatalf("second open: %v, want a clear in-use error", err)
	}
	if time.Since(start) > 10*time.Second {
		t.Fatal("second open hung")
	}
}

func TestSlowWatcherIsCutOffAndResumes(t *testing.T) {
	s, _ := openTest(t, Options{MaxWatchBacklog: 10, CompactInterval: -1})
	ctx := context.Background()
	slow, err := s.Watch(ctx, "/", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Stop()
	fast, err := s.Watch(ctx, "/", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fast.Stop()
	var fastSeen []int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range fast.Events() {
			if fastSeen = append(fastSeen, ev.Revision); len(fastSeen) == 100 {
				return
			}
		}
	}()
	for i := range 100 {
		storetest.MustCreate(t, s, fmt.Sprintf("/k%03d", i), "x") // writers never wait for the slow one
	}
	<-done
	var last int64
	for ev := range slow.Events() {
		last = ev.Revision
	}
	if !errors.Is(slow.Err(), store.ErrWatcherTooSlow) {
		t.Fatalf("slow watcher ended with %v, want ErrWatcherTooSlow", slow.Err())
	}
	resumed, err := s.Watch(ctx, "/", last)
	if err != nil {
		t.Fatal(err)
	}
	defer resumed.Stop()
	n := 0
	for last < fastSeen[len(fastSeen)-1] {
		ev := storetest.NextEvent(t, resumed)
		if ev.Revision != last+1 {
			t.Fatalf("resumed watch skipped from %d to %d", last, ev.Revision)
		}
		last, n = ev.Revision, n+1
	}
	if n == 0 {
		t.Fatal("nothing left to resume: the slow watcher was not cut off early")
	}
}

func TestConcurrentWritersShareCommits(t *testing.T) {
	s, _ := openTest(t, Options{CompactInterval: -1})
	const writers, each = 32, 30
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				if _, err := s.Create(context.Background(), fmt.Sprintf("/w%d/%d", w, i), []byte("v")); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	st := s.Stats()
	if st.Writes != writers*each {
		t.Fatalf("%d writes acknowledged, want %d", st.Writes, writers*each)
	}
	if st.Commits > st.Writes/2 {
		t.Fatalf("%d writers took %d commits for %d writes: no group commit", writers, st.Commits, st.Writes)
	}
	t.Logf("%d writes in %d commits", st.Writes, st.Commits)
}

func TestAutomaticCompaction(t *testing.T) {
	s, _ := openTest(t, Options{CompactInterval: 20 * time.Millisecond})
	first := storetest.MustCreate(t, s, "/a", "1")
	deadline := time.Now().Add(10 * time.Second)
	for s.CompactedRevision() < first.ModRevision {
		if time.Now().After(deadline) {
			t.Fatal("history was never compacted")
		}
		storetest.MustCreate(t, s, fmt.Sprintf("/tick/%d", time.Now().UnixNano()), "x")
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := s.Get(context.Background(), "/a"); err != nil {
		t.Fatalf("compaction lost current data: %v", err)
	}
}

// TestIdleCompactionWritesNothing: once durable history is forgotten, a
// store whose only writes are volatile (a quiet cluster's Lease renewals)
// compacts in memory and leaves the disk alone; durable keys stay readable
// and the volatile history is forgotten as before.
func TestIdleCompactionWritesNothing(t *testing.T) {
	s, _ := openTest(t, Options{VolatilePrefixes: []string{"/leases/"}, CompactInterval: 20 * time.Millisecond})
	ctx := context.Background()
	first := storetest.MustCreate(t, s, "/a", "1")
	storetest.MustCreate(t, s, "/leases/n1", "x")
	renew := func() int64 {
		kv, err := s.Update(ctx, "/leases/n1", []byte("renew"), 0)
		if err != nil {
			t.Fatal(err)
		}
		return kv.ModRevision
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.CompactedRevision() < first.ModRevision {
		if time.Now().After(deadline) {
			t.Fatal("durable history was never compacted")
		}
		renew()
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // the compaction's commits are done
	pagesWritten := func() int64 { st := s.db.Stats(); return st.TxStats.GetWrite() }
	writes, from := pagesWritten(), renew()
	for s.CompactedRevision() <= from {
		if time.Now().After(deadline) {
			t.Fatal("volatile history was never compacted")
		}
		renew()
		time.Sleep(5 * time.Millisecond)
	}
	if after := pagesWritten(); after != writes {
		t.Errorf("compacting volatile history only wrote %d pages to bbolt", after-writes)
	}
	if _, err := s.Get(ctx, "/a"); err != nil {
		t.Errorf("durable key after compaction: %v", err)
	}
	if _, err := s.List(ctx, "/leases/", store.ListOptions{Revision: from - 1}); !errors.Is(err, store.ErrCompacted) {
		t.Errorf("volatile keys read at compacted revision %d: %v, want ErrCompacted", from-1, err)
	}
}

// TestDurableCompactionWaits: reads below the compacted revision fail from
// the first interval, but bbolt forgets durable versions (rewriting their
// pages) only every compactDurableTicks intervals, so a board's start is
// not followed by a compaction of everything it wrote minutes later.
func TestDurableCompactionWaits(t *testing.T) {
	interval := 20 * time.Millisecond
	s, _ := openTest(t, Options{CompactInterval: interval})
	ctx := context.Background()
	first := storetest.MustCreate(t, s, "/a", "1")
	second, err := s.Update(ctx, "/a", []byte("2"), first.ModRevision)
	if err != nil {
		t.Fatal(err)
	}
	waiting := func() int {
		n, err := s.durableHistoryTo(second.ModRevision, compactDurableWrites)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// Writes go on all along, so every interval has something to compact.
	tick := func() {
		storetest.MustCreate(t, s, fmt.Sprintf("/tick/%d", time.Now().UnixNano()), "x")
		time.Sleep(interval / 4)
	}
	deadline := time.Now().Add(10 * time.Second)
	for waiting() < 2 { // the writes reach bbolt at the next checkpoint
		if time.Now().After(deadline) {
			t.Fatal("the writes never reached bbolt")
		}
		tick()
	}
	inBolt := time.Now()
	for s.CompactedRevision() < second.ModRevision {
		if time.Now().After(deadline) {
			t.Fatal("history was never compacted")
		}
		tick()
	}
	if _, err := s.List(ctx, "/a", store.ListOptions{Revision: first.ModRevision}); !errors.Is(err, store.ErrCompacted) {
		t.Fatalf("read at compacted revision %d: %v, want ErrCompacted", first.ModRevision, err)
	}
	if n := waiting(); n == 0 {
		t.Fatal("bbolt forgot durable history at the first compaction")
	}
	for waiting() > 0 {
		if time.Now().After(deadline) {
			t.Fatal("bbolt never forgot durable history")
		}
		tick()
	}
	if waited := time.Since(inBolt); waited < (compactDurableTicks-3)*interval {
		t.Errorf("bbolt forgot durable history %v after it had it, want about %d intervals", waited, compactDurableTicks)
	}
	kv, err := s.Get(ctx, "/a")
	if err != nil || string(kv.Value) != "2" {
		t.Fatalf("after compaction: %q %v", kv.Value, err)
	}
}

// TestListFromKeyAfterCheckpoint: a page may resume right after a key
// (key+"\x00", as the API server's filtered pages do), also once the keys
// are in bbolt, where a key's versions sort right after that point.
func TestListFromKeyAfterCheckpoint(t *testing.T) {
	opts := Options{CompactInterval: -1}
	s, dir := openTest(t, opts)
	for _, k := range []string{"/p/a", "/p/b", "/p/c"} {
		storetest.MustCreate(t, s, k, "v")
	}
	s = reopen(t, s, dir, opts) // everything checkpointed into bbolt
	rev, _ := s.Revision(context.Background())
	res, err := s.List(context.Background(), "/p/", store.ListOptions{Continue: store.EncodeContinue(rev, "/p/a\x00")})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, kv := range res.KVs {
		got = append(got, kv.Key)
	}
	if strings.Join(got, ",") != "/p/b,/p/c" {
		t.Fatalf("list after /p/a = %v", got)
	}
}
