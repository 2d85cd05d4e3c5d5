// Package storetest is the conformance suite for store.Store backends: the
// semantics the API server relies on, checked the same way on every backend.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/store"
)

// Factory opens an empty store whose keys under volatilePrefixes are
// volatile. The suite closes it.
type Factory func(t *testing.T, volatilePrefixes []string) store.Store

// VolatilePrefix is the prefix the suite declares volatile.
const VolatilePrefix = "/v/"

// Run runs the whole suite.
func Run(t *testing.T, open Factory) {
	t.Run("CreateGet", func(t *testing.T) { testCreateGet(t, open) })
	t.Run("Update", func(t *testing.T) { testUpdate(t, open) })
	t.Run("Delete", func(t *testing.T) { testDelete(t, open) })
	t.Run("InvalidInput", func(t *testing.T) { testInvalid(t, open) })
	t.Run("List", func(t *testing.T) { testList(t, open) })
	t.Run("ListPagingIsOneSnapshot", func(t *testing.T) { testListPaging(t, open) })
	t.Run("Watch", func(t *testing.T) { testWatch(t, open) })
	t.Run("WatchStop", func(t *testing.T) { testWatchStop(t, open) })
	t.Run("Compact", func(t *testing.T) { testCompact(t, open) })
	t.Run("Close", func(t *testing.T) { testClose(t, open) })
}

// tiers runs fn once with durable keys and once with volatile ones: both
// tiers promise the same semantics.
func tiers(t *testing.T, open Factory, fn func(t *testing.T, s store.Store, prefix string)) {
	for _, prefix := range []string{"/d/", VolatilePrefix} {
		t.Run(prefix, func(t *testing.T) {
			s := open(t, []string{VolatilePrefix})
			t.Cleanup(func() { _ = s.Close() })
			fn(t, s, prefix)
		})
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// MustCreate creates key or fails the test.
func MustCreate(t *testing.T, s store.Store, key, value string) store.KeyValue {
	t.Helper()
	kv, err := s.Create(ctx(t), key, []byte(value))
	if err != nil {
		t.Fatalf("create %s: %v", key, err)
	}
	return kv
}

func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: got error %v, want %v", what, err, want)
	}
}

func testCreateGet(t *testing.T, open Factory) {
	tiers(t, open, func(t *testing.T, s store.Store, p string) {
		c := ctx(t)
		rev0, err := s.Revision(c)
		if err != nil {
			t.Fatal(err)
		}
		kv := MustCreate(t, s, p+"a", "one")
		if kv.CreateRevision != rev0+1 || kv.ModRevision != rev0+1 || string(kv.Value) != "one" {
			t.Fatalf("created %+v, want revisions %d", kv, rev0+1)
		}
		got, err := s.Get(c, p+"a")
		if err != nil || !equalKV(got, kv) {
			t.Fatalf("get = %+v, %v; want %+v", got, err, kv)
		}
		_, err = s.Create(c, p+"a", []byte("two"))
		wantErr(t, "create existing", err, store.ErrExists)
		_, err = s.Get(c, p+"missing")
		wantErr(t, "get missing", err, store.ErrNotFound)
		if rev, _ := s.Revision(c); rev != rev0+1 {
			t.Fatalf("revision %d after one write and failures, want %d", rev, rev0+1)
		}
		empty := MustCreate(t, s, p+"empty", "")
		if got, err := s.Get(c, p+"empty"); err != nil || len(got.Value) != 0 || got.ModRevision != empty.ModRevision {
			t.Fatalf("empty value: %+v, %v", got, err)
		}
	})
}

func testUpdate(t *testing.T, open Factory) {
	tiers(t, open, func(t *testing.T, s store.Store, p string) {
		c := ctx(t)
		kv := MustCreate(t, s, p+"a", "v1")
		cases := []struct {
			name    string
			key     string
			expect  int64
			wantErr error
		}{
			{"wrong revision conflicts", p + "a", kv.ModRevision + 100, store.ErrConflict},
			{"missing key", p + "nope", 0, store.ErrNotFound},
			{"matching revision", p + "a", kv.ModRevision, nil},
			{"old revision after update", p + "a", kv.ModRevision, store.ErrConflict},
			{"zero accepts any", p + "a", 0, nil},
		}
		for i, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				before, _ := s.Revision(c)
				got, err := s.Update(c, tc.key, fmt.Appendf(nil, "v%d", i+2), tc.expect)
				if tc.wantErr != nil {
					wantErr(t, tc.name, err, tc.wantErr)
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if got.ModRevision != before+1 || got.CreateRevision != kv.CreateRevision {
					t.Fatalf("updated %+v; want mod %d create %d", got, before+1, kv.CreateRevision)
				}
			})
		}
	})
}

func testDelete(t *testing.T, open Factory) {
	tiers(t, open, func(t *testing.T, s store.Store, p string) {
		c := ctx(t)
		kv := MustCreate(t, s, p+"a", "v")
		_, _, err := s.Delete(c, p+"a", kv.ModRevision+5)
		wantErr(t, "stale delete", err, store.ErrConflict)
		prev, rev, err := s.Delete(c, p+"a", kv.ModRevision)
		if err != nil || !equalKV(prev, kv) || rev != kv.ModRevision+1 {
			t.Fatalf("delete = %+v, %d, %v", prev, rev, err)
		}
		_, err = s.Get(c, p+"a")
		wantErr(t, "get deleted", err, store.ErrNotFound)
		_, _, err = s.Delete(c, p+"a", 0)
		wantErr(t, "delete twice", err, store.ErrNotFound)
		_, err = s.Update(c, p+"a", []byte("x"), 0)
		wantErr(t, "update deleted", err, store.ErrNotFound)
		again := MustCreate(t, s, p+"a", "again")
		if again.CreateRevision != rev+1 {
			t.Fatalf("recreated with create revision %d, want %d", again.CreateRevision, rev+1)
		}
	})
}

func testInvalid(t *testing.T, open Factory) {
	s := open(t, nil)
	defer func() { _ = s.Close() }()
	c := ctx(t)
	MustCreate(t, s, "/k", "v")
	cases := []struct {
		name string
		err  error
	}{
		{"empty key", func() error { _, err := s.Create(c, "", []byte("v")); return err }()},
		{"NUL in key", func() error { _, err := s.Create(c, "/a\x00b", []byte("v")); return err }()},
		{"negative expected revision", func() error { _, err := s.Update(c, "/k", nil, -1); return err }()},
		{"negative list limit", func() error { _, err := s.List(c, "/", store.ListOptions{Limit: -1}); return err }()},
		{"garbage continue token", func() error {
			_, err := s.List(c, "/", store.ListOptions{Continue: "!!not-base64"})
			return err
		}()},
		{"negative watch revision", func() error { _, err := s.Watch(c, "/", -3); return err }()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { wantErr(t, tc.name, tc.err, store.ErrInvalid) })
	}
	_, err := s.List(c, "/", store.ListOptions{Revision: 1 << 40})
	wantErr(t, "list at a future revision", err, store.ErrFutureRevision)
}

func keys(kvs []store.KeyValue) []string {
	out := make([]string, len(kvs))
	for i, kv := range kvs {
		out[i] = kv.Key
	}
	return out
}

func testList(t *testing.T, open Factory) {
	tiers(t, open, func(t *testing.T, s store.Store, p string) {
		c := ctx(t)
		for _, k := range []string{"b", "a", "c/1", "c/2", "cc"} {
			MustCreate(t, s, p+k, k)
		}
		outside := MustCreate(t, s, "/other/x", "x")
		if _, _, err := s.Delete(c, p+"b", 0); err != nil {
			t.Fatal(err)
		}
		afterDelete, _ := s.Revision(c)
		cases := []struct {
			name   string
			prefix string
			opts   store.ListOptions
			want   []string
		}{
			{"whole prefix sorted, deleted key gone", p, store.ListOptions{}, []string{"a", "c/1", "c/2", "cc"}},
			{"sub-prefix", p + "c/", store.ListOptions{}, []string{"c/1", "c/2"}},
			{"no match", p + "zzz", store.ListOptions{}, nil},
			{"at a past revision the deleted key is back", p, store.ListOptions{Revision: outside.ModRevision}, []string{"a", "b", "c/1", "c/2", "cc"}},
			{"limit larger than result", p, store.ListOptions{Limit: 10}, []string{"a", "c/1", "c/2", "cc"}},
			// On a 32-bit board a limit past int's range must not wrap
			// round to a small or negative one.
			{"limit past 32 bits", p, store.ListOptions{Limit: 1<<32 + 1}, []string{"a", "c/1", "c/2", "cc"}},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				res, err := s.List(c, tc.prefix, tc.opts)
				if err != nil {
					t.Fatal(err)
				}
				var want []string
				for _, k := range tc.want {
					want = append(want, tc.prefix[:len(p)]+k)
				}
				if fmt.Sprint(keys(res.KVs)) != fmt.Sprint(want) || res.Continue != "" {
					t.Fatalf("list = %v (continue %q), want %v", keys(res.KVs), res.Continue, want)
				}
				wantRev := tc.opts.Revision
				if wantRev == 0 {
					wantRev = afterDelete
				}
				if res.Revision != wantRev {
					t.Fatalf("read at %d, want %d", res.Revision, wantRev)
				}
			})
		}
	})
}

func testListPaging(t *testing.T, open Factory) {
	tiers(t, open, func(t *testing.T, s store.Store, p string) {
		c := ctx(t)
		var want []string
		for i := range 10 {
			k := fmt.Sprintf("%sk%02d", p, i)
			MustCreate(t, s, k, "orig")
			want = append(want, k)
		}
		var got []string
		opts := store.ListOptions{Limit: 3}
		for page := 0; ; page++ {
			res, err := s.List(c, p, opts)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.KVs) > 3 {
				t.Fatalf("page of %d over limit 3", len(res.KVs))
			}
			for _, kv := range res.KVs {
				if string(kv.Value) != "orig" {
					t.Fatalf("page %d saw a later write to %s", page, kv.Key)
				}
				got = append(got, kv.Key)
			}
			// What follows the page, counted in the same snapshot (etcd's
			// count less the page; Kubernetes' remainingItemCount).
			if wantRest := int64(len(want) - len(got)); res.Continue != "" && res.Remaining != wantRest {
				t.Fatalf("page %d: %d remaining, want %d", page, res.Remaining, wantRest)
			}
			if res.Continue == "" {
				break
			}
			// Writes between pages must not show: the list is one snapshot.
			if page == 0 {
				if _, err := s.Update(c, p+"k05", []byte("changed"), 0); err != nil {
					t.Fatal(err)
				}
				if _, _, err := s.Delete(c, p+"k07", 0); err != nil {
					t.Fatal(err)
				}
				MustCreate(t, s, p+"k055", "new")
			}
			opts.Continue = res.Continue
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("paged list = %v, want %v", got, want)
		}
	})
}

// NextEvent waits for one event or fails the test.
func NextEvent(t *testing.T, w store.Watcher) store.Event {
	t.Helper()
	select {
	case ev, ok := <-w.Events():
		if !ok {
			t.Fatalf("watch ended early: %v", w.Err())
		}
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no event within 10s")
	}
	return store.Event{}
}

func testWatch(t *testing.T, open Factory) {
	tiers(t, open, func(t *testing.T, s store.Store, p string) {
		c := ctx(t)
		// Watching after revision 0 means "from now", so start later.
		MustCreate(t, s, "/elsewhere/first", "x")
		a := MustCreate(t, s, p+"a", "1")
		MustCreate(t, s, "/elsewhere/a", "x")
		a2, err := s.Update(c, p+"a", []byte("2"), 0)
		if err != nil {
			t.Fatal(err)
		}
		_, delRev, err := s.Delete(c, p+"a", 0)
		if err != nil {
			t.Fatal(err)
		}

		// From before the writes: every event, in order, with previous values.
		w, err := s.Watch(c, p, a.ModRevision-1)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		checks := []struct {
			typ     store.EventType
			rev     int64
			value   string
			prevRev int64
		}{
			{store.EventPut, a.ModRevision, "1", 0},
			{store.EventPut, a2.ModRevision, "2", a.ModRevision},
			{store.EventDelete, delRev, "", a2.ModRevision},
		}
		for _, want := range checks {
			ev := NextEvent(t, w)
			if ev.Type != want.typ || ev.Revision != want.rev || ev.KV.ModRevision != want.rev || string(ev.KV.Value) != want.value || ev.KV.Key != p+"a" {
				t.Fatalf("event %+v, want %+v", ev, want)
			}
			if (ev.PrevKV == nil) != (want.prevRev == 0) || (ev.PrevKV != nil && ev.PrevKV.ModRevision != want.prevRev) {
				t.Fatalf("event at %d has prev %+v, want prev at %d", ev.Revision, ev.PrevKV, want.prevRev)
			}
		}
		// Live events follow the replayed ones; keys outside the prefix do not show.
		MustCreate(t, s, "/elsewhere/b", "x")
		b := MustCreate(t, s, p+"b", "live")
		if ev := NextEvent(t, w); ev.Revision != b.ModRevision || !ev.IsCreate() {
			t.Fatalf("live event %+v, want create at %d", ev, b.ModRevision)
		}
		// Progress says everything up to now was delivered.
		w.RequestProgress()
		if ev := NextEvent(t, w); ev.Type != store.EventProgress || ev.Revision < b.ModRevision {
			t.Fatalf("progress %+v, want at least %d", ev, b.ModRevision)
		}

		// From now (0): only later events.
		now, err := s.Watch(c, p, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer now.Stop()
		later := MustCreate(t, s, p+"later", "x")
		if ev := NextEvent(t, now); ev.Revision != later.ModRevision {
			t.Fatalf("watch from now got %+v, want revision %d", ev, later.ModRevision)
		}
	})
}

func testWatchStop(t *testing.T, open Factory) {
	s := open(t, nil)
	defer func() { _ = s.Close() }()
	w, err := s.Watch(ctx(t), "/", 0)
	if err != nil {
		t.Fatal(err)
	}
	w.Stop()
	if _, ok := <-w.Events(); ok {
		t.Fatal("event after Stop")
	}
	if w.Err() != nil {
		t.Fatalf("stopped watch has error %v", w.Err())
	}
	wctx, cancel := context.WithCancel(ctx(t))
	w2, err := s.Watch(wctx, "/", 0)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case _, ok := <-w2.Events():
		if ok {
			t.Fatal("event after cancel")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("watch did not end with its context")
	}
}

func testCompact(t *testing.T, open Factory) {
	tiers(t, open, func(t *testing.T, s store.Store, p string) {
		c := ctx(t)
		a := MustCreate(t, s, p+"a", "1")
		if _, err := s.Update(c, p+"a", []byte("2"), 0); err != nil {
			t.Fatal(err)
		}
		b := MustCreate(t, s, p+"b", "1")
		if _, _, err := s.Delete(c, p+"b", 0); err != nil {
			t.Fatal(err)
		}
		at, _ := s.Revision(c)
		after := MustCreate(t, s, p+"c", "1")
		if err := s.Compact(c, at); err != nil {
			t.Fatal(err)
		}
		if s.CompactedRevision() != at {
			t.Fatalf("compacted revision %d, want %d", s.CompactedRevision(), at)
		}
		_, err := s.List(c, p, store.ListOptions{Revision: b.ModRevision})
		wantErr(t, "list below compaction", err, store.ErrCompacted)
		_, err = s.Watch(c, p, a.ModRevision)
		wantErr(t, "watch below compaction", err, store.ErrCompacted)
		wantErr(t, "compact again", s.Compact(c, at), store.ErrCompacted)
		wantErr(t, "compact the future", s.Compact(c, after.ModRevision+100), store.ErrFutureRevision)

		// The state at and after the compaction point is intact.
		res, err := s.List(c, p, store.ListOptions{Revision: at})
		if err != nil || fmt.Sprint(keys(res.KVs)) != fmt.Sprint([]string{p + "a"}) || string(res.KVs[0].Value) != "2" {
			t.Fatalf("list at compaction point = %+v, %v", res.KVs, err)
		}
		w, err := s.Watch(c, p, at)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		if ev := NextEvent(t, w); ev.Revision != after.ModRevision {
			t.Fatalf("watch from compaction point got %+v", ev)
		}
		upd, err := s.Update(c, p+"a", []byte("3"), 0)
		if err != nil || upd.CreateRevision != a.CreateRevision {
			t.Fatalf("update after compaction = %+v, %v", upd, err)
		}
		if ev := NextEvent(t, w); ev.PrevKV == nil || string(ev.PrevKV.Value) != "2" {
			t.Fatalf("event after compaction lost its previous value: %+v", ev)
		}

		// A key deleted after one compaction stays deleted after the next.
		if _, _, err := s.Delete(c, p+"c", 0); err != nil {
			t.Fatal(err)
		}
		rev, _ := s.Revision(c)
		if err := s.Compact(c, rev); err != nil {
			t.Fatal(err)
		}
		_, err = s.Get(c, p+"c")
		wantErr(t, "get of a key deleted between compactions", err, store.ErrNotFound)
	})
}

func testClose(t *testing.T, open Factory) {
	s := open(t, nil)
	c := ctx(t)
	w, err := s.Watch(c, "/", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case _, ok := <-w.Events():
		if ok {
			t.Fatal("event after close")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("watch did not end with the store")
	}
	wantErr(t, "watch error after close", w.Err(), store.ErrClosed)
	_, err = s.Create(c, "/x", nil)
	wantErr(t, "create after close", err, store.ErrClosed)
	_, err = s.Get(c, "/x")
	wantErr(t, "get after close", err, store.ErrClosed)
}

func equalKV(a, b store.KeyValue) bool {
	return a.Key == b.Key && bytes.Equal(a.Value, b.Value) && a.CreateRevision == b.CreateRevision && a.ModRevision == b.ModRevision
}
