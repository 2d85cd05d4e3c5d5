package boltstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/orch-dev/orch/internal/store"
)

// model is the simplest store that could work: a map and a counter.
type model struct {
	rev  int64
	keys map[string]store.KeyValue
}

var fuzzKeys = []string{"/d/a", "/d/b", "/d/c/x", "/d/c/y", "/v/a", "/v/b", "/v/c/x"}
var fuzzPrefixes = []string{"/", "/d/", "/d/c/", "/v/", "/v/c/", "/x/"}

// FuzzStoreAgainstModel decodes the input as a sequence of operations, runs
// them against the store and a model, and fails on the first difference.
func FuzzStoreAgainstModel(f *testing.F) {
	f.Add([]byte{0, 0, 1, 0, 2, 1, 3, 0, 4, 0})
	f.Add([]byte{0, 4, 0, 4, 1, 4, 5, 0, 6, 3, 2, 4, 7, 0, 0, 1, 4, 3})
	f.Add([]byte{0, 1, 0, 2, 0, 3, 5, 1, 6, 0, 1, 2, 2, 1, 0, 1, 7, 1, 5, 0})
	f.Fuzz(func(t *testing.T, program []byte) {
		if len(program) > 200 {
			program = program[:200]
		}
		opts := Options{VolatilePrefixes: []string{"/v/"}, CompactInterval: -1, WatchRing: 8}
		s, dir := openTest(t, opts)
		ctx := context.Background()
		m := &model{keys: map[string]store.KeyValue{}}
		w, err := s.Watch(ctx, "/", 0)
		if err != nil {
			t.Fatal(err)
		}
		view := map[string]store.KeyValue{}
		for i := 0; i+1 < len(program); i += 2 {
			op, arg := program[i]%8, int(program[i+1])
			key := fuzzKeys[arg%len(fuzzKeys)]
			var step string
			switch op {
			case 0, 1: // create, or update with a right (1) or wrong expectation
				got, err := s.Create(ctx, key, fmt.Appendf(nil, "c%d", i))
				step = checkWrite(t, m, key, store.KeyValue{}, got, err, true, 0, fmt.Sprintf("c%d", i))
			case 2, 3:
				cur := m.keys[key].ModRevision
				expect := cur
				if op == 3 {
					expect = []int64{cur + 1, 0, cur}[arg%3] // wrong, any, right
				}
				got, err := s.Update(ctx, key, fmt.Appendf(nil, "u%d", i), expect)
				step = checkWrite(t, m, key, store.KeyValue{}, got, err, false, expect, fmt.Sprintf("u%d", i))
			case 4:
				prev, _, err := s.Delete(ctx, key, m.keys[key].ModRevision)
				step = checkWrite(t, m, key, prev, store.KeyValue{}, err, false, m.keys[key].ModRevision, "")
			case 5:
				checkList(t, s, m, fuzzPrefixes[arg%len(fuzzPrefixes)], int64(arg%4))
				step = "list"
			case 6:
				if m.rev > s.CompactedRevision() {
					if err := s.Compact(ctx, m.rev); err != nil {
						t.Fatalf("compact to %d: %v", m.rev, err)
					}
				}
				step = "compact"
			case 7: // restart: volatile keys are gone, revisions go on
				drain(t, w, view)
				s = reopen(t, s, dir, opts)
				for k := range m.keys {
					if strings.HasPrefix(k, "/v/") {
						delete(m.keys, k)
					}
				}
				rev, _ := s.Revision(ctx)
				if rev < m.rev {
					t.Fatalf("revision went back from %d to %d on restart", m.rev, rev)
				}
				m.rev = rev
				if w, err = s.Watch(ctx, "/", 0); err != nil {
					t.Fatal(err)
				}
				view = maps.Clone(m.keys)
				step = "restart"
			}
			got, err := s.Get(ctx, key)
			want, ok := m.keys[key]
			if ok != (err == nil) || (ok && !sameKV(got, want)) {
				t.Fatalf("after %s: get %s = %+v, %v; model has %+v", step, key, got, err, want)
			}
		}
		drain(t, w, view)
		if !maps.EqualFunc(view, m.keys, sameKV) {
			t.Fatalf("state rebuilt from watch events differs:\n got %v\nwant %v", view, m.keys)
		}
	})
}

// checkWrite applies a write to the model and compares the store's answer.
func checkWrite(t *testing.T, m *model, key string, prev, got store.KeyValue, err error, create bool, expect int64, value string) string {
	t.Helper()
	cur, exists := m.keys[key]
	var wantErr error
	switch {
	case create && exists:
		wantErr = store.ErrExists
	case !create && !exists:
		wantErr = store.ErrNotFound
	case !create && expect != 0 && expect != cur.ModRevision:
		wantErr = store.ErrConflict
	}
	if wantErr != nil || err != nil {
		if !errors.Is(err, wantErr) || wantErr == nil {
			t.Fatalf("write %s: error %v, model wants %v", key, err, wantErr)
		}
		return "failed write"
	}
	m.rev++
	switch {
	case create:
		m.keys[key] = store.KeyValue{Key: key, Value: []byte(value), CreateRevision: m.rev, ModRevision: m.rev}
	case value == "": // delete
		if !sameKV(prev, cur) {
			t.Fatalf("delete %s returned %+v, model had %+v", key, prev, cur)
		}
		delete(m.keys, key)
		return "delete"
	default:
		m.keys[key] = store.KeyValue{Key: key, Value: []byte(value), CreateRevision: cur.CreateRevision, ModRevision: m.rev}
	}
	if !sameKV(got, m.keys[key]) {
		t.Fatalf("write %s returned %+v, model has %+v", key, got, m.keys[key])
	}
	return "write"
}

func checkList(t *testing.T, s *Store, m *model, prefix string, limit int64) {
	t.Helper()
	var want []string
	for k := range m.keys {
		if strings.HasPrefix(k, prefix) {
			want = append(want, k)
		}
	}
	slices.Sort(want)
	var got []string
	opts := store.ListOptions{Limit: limit}
	for {
		res, err := s.List(context.Background(), prefix, opts)
		if err != nil {
			t.Fatalf("list %s: %v", prefix, err)
		}
		for _, kv := range res.KVs {
			if !sameKV(kv, m.keys[kv.Key]) {
				t.Fatalf("list %s: %+v, model has %+v", prefix, kv, m.keys[kv.Key])
			}
			got = append(got, kv.Key)
		}
		if res.Continue == "" {
			break
		}
		opts.Continue = res.Continue
	}
	if !slices.Equal(got, want) {
		t.Fatalf("list %s (limit %d) = %v, model has %v", prefix, limit, got, want)
	}
}

// drain applies every event the watcher has been sent, then stops it.
func drain(t *testing.T, w store.Watcher, view map[string]store.KeyValue) {
	t.Helper()
	w.RequestProgress()
	for ev := range w.Events() {
		switch ev.Type {
		case store.EventProgress:
			w.Stop()
		case store.EventDelete:
			delete(view, ev.KV.Key)
		default:
			view[ev.KV.Key] = ev.KV
		}
	}
}

func sameKV(a, b store.KeyValue) bool {
	return a.Key == b.Key && string(a.Value) == string(b.Value) && a.CreateRevision == b.CreateRevision && a.ModRevision == b.ModRevision
}
