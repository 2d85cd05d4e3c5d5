package boltstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/orch-dev/orch/internal/store"
)

// TestSnapshotWhileWriting: a snapshot taken while writers go on holds
// every write acknowledged before it and is a sound store; restored in
// place of a store that went on after it, the snapshot's keys come back,
// revisions go on past both, and a watch from the old history is told it
// is gone (410 for the API's clients, which list again).
func TestSnapshotWhileWriting(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := Open(dir, Options{WALSize: 1 << 20, CompactInterval: -1, VolatilePrefixes: []string{"/volatile/"}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		if _, err := s.Create(ctx, fmt.Sprintf("/registry/before/%03d", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Create(ctx, "/volatile/lease", []byte("l")); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := s.Create(ctx, fmt.Sprintf("/registry/during/%06d", i), []byte("v")); err != nil {
				t.Error(err)
				return
			}
		}
	})
	var snap bytes.Buffer
	rev, err := s.Snapshot(ctx, &snap)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	// The store goes on after the snapshot.
	after, err := s.Create(ctx, "/registry/after", []byte("v"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "snap.db")
	if err := os.WriteFile(file, snap.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Restore(dir, file); err != nil {
		t.Fatal(err)
	}
	checkFile(t, dir)
	r, err := Open(dir, Options{WALSize: 1 << 20, CompactInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Close() }()
	list, err := r.List(ctx, "/registry/before/", store.ListOptions{})
	if err != nil || len(list.KVs) != 100 {
		t.Fatalf("the snapshot's keys: %d, %v", len(list.KVs), err)
	}
	during, _ := r.List(ctx, "/registry/during/", store.ListOptions{})
	for _, kv := range during.KVs {
		if kv.ModRevision > rev {
			t.Fatalf("%s at %d is past the snapshot's revision %d", kv.Key, kv.ModRevision, rev)
		}
	}
	if _, err := r.Get(ctx, "/registry/after"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a write after the snapshot came back: %v", err)
	}
	if _, err := r.Get(ctx, "/volatile/lease"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a volatile key is in the snapshot: %v", err)
	}
	kv, err := r.Create(ctx, "/registry/new", []byte("v"))
	if err != nil || kv.ModRevision <= after.ModRevision {
		t.Errorf("a write after the restore at %d, the replaced store was at %d: %v", kv.ModRevision, after.ModRevision, err)
	}
	if _, err := r.Watch(ctx, "/registry/", after.ModRevision); !errors.Is(err, store.ErrCompacted) {
		t.Errorf("a watch from the replaced history: %v, want compacted", err)
	}
}

func TestRestoreRefusesWhatIsNoStore(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(t.TempDir(), "bad.db")
	if err := os.WriteFile(bad, []byte("not a store"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Restore(dir, bad); err == nil {
		t.Fatal("restored from a file that is no store")
	}
	if _, err := os.Stat(filepath.Join(dir, "orch.db")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed restore left a store: %v", err)
	}
}
