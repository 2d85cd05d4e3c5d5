package boltstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/store"
)

// TestWritersWatchersAndCompaction runs racing writers over a small key
// space, watchers started before and during the writes (the informer's
// list-then-watch), and compaction, then checks that every watcher's view
// rebuilt from its events equals a List at the same revision.
func TestWritersWatchersAndCompaction(t *testing.T) {
	s, _ := openTest(t, Options{VolatilePrefixes: []string{"/k/v"}, WatchRing: 64, CompactInterval: -1})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const writers, ops, keySpace = 8, 150, 40

	var watchers sync.WaitGroup
	views := make(chan map[string]string, 16)
	watch := func(from int64, view map[string]string) {
		w, err := s.Watch(ctx, "/k/", from)
		if err != nil {
			t.Error(err)
			return
		}
		watchers.Go(func() {
			defer w.Stop()
			last := from
			for ev := range w.Events() {
				if ev.Revision <= last {
					t.Errorf("watch from %d: revision %d after %d", from, ev.Revision, last)
				}
				last = ev.Revision
				if ev.Type == store.EventDelete {
					delete(view, ev.KV.Key)
				} else {
					view[ev.KV.Key] = string(ev.KV.Value)
				}
				if v, ok := view["/k/done"]; ok && v == "done" {
					views <- view
					return
				}
			}
			t.Errorf("watch from %d ended: %v", from, w.Err())
		})
	}
	for range 4 {
		watch(0, map[string]string{})
	}

	var writes sync.WaitGroup
	for w := range writers {
		writes.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for i := range ops {
				key := fmt.Sprintf("/k/%c%d", "dv"[r.IntN(2)], r.IntN(keySpace))
				val := fmt.Appendf(nil, "w%d-%d", w, i)
				cur, err := s.Get(ctx, key)
				switch {
				case errors.Is(err, store.ErrNotFound):
					_, err = s.Create(ctx, key, val)
				case err != nil:
				case r.IntN(4) == 0:
					_, _, err = s.Delete(ctx, key, cur.ModRevision)
				default:
					_, err = s.Update(ctx, key, val, cur.ModRevision)
				}
				if err != nil && !errors.Is(err, store.ErrConflict) && !errors.Is(err, store.ErrExists) && !errors.Is(err, store.ErrNotFound) {
					t.Error(err)
					return
				}
			}
		})
	}
	// Watchers that join mid-stream list first, then watch from the list.
	for range 4 {
		time.Sleep(5 * time.Millisecond)
		res, err := s.List(ctx, "/k/", store.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		view := map[string]string{}
		for _, kv := range res.KVs {
			view[kv.Key] = string(kv.Value)
		}
		watch(res.Revision, view)
	}
	compacting := make(chan struct{})
	go func() {
		defer close(compacting)
		for i := 0; ctx.Err() == nil && i < 20; i++ {
			time.Sleep(3 * time.Millisecond)
			if rev, _ := s.Revision(ctx); rev > 50 {
				if err := s.Compact(ctx, rev-50); err != nil && !errors.Is(err, store.ErrCompacted) {
					t.Error(err)
				}
			}
		}
	}()
	writes.Wait()
	<-compacting
	end, err := s.Create(ctx, "/k/done", []byte("done"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.List(ctx, "/k/", store.ListOptions{Revision: end.ModRevision})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, kv := range res.KVs {
		want[kv.Key] = string(kv.Value)
	}
	for range 8 {
		select {
		case view := <-views:
			if fmt.Sprint(view) != fmt.Sprint(want) {
				t.Fatalf("a watcher's view differs from the store:\n got %v\nwant %v", view, want)
			}
		case <-ctx.Done():
			t.Fatal("watchers did not finish")
		}
	}
	watchers.Wait()
}
