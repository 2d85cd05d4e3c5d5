package boltstore

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

func TestWALReplayStopsAtTornOrStaleRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wal")
	w, logged, err := openWAL(path, 1<<16)
	if err != nil || len(logged) != 0 {
		t.Fatalf("new wal: %v, %d versions", err, len(logged))
	}
	if err := w.reset(); err != nil {
		t.Fatal(err)
	}
	record := func(rev int64) []byte {
		return encodeWALPayload([]memWrite{{fmt.Sprintf("/k%d", rev), version{rev: rev, createRev: rev, value: []byte("v")}}})
	}
	for rev := int64(1); rev <= 3; rev++ {
		if err := w.append(record(rev)); err != nil {
			t.Fatal(err)
		}
	}
	tornAt := w.offset
	if err := w.append(record(4)); err != nil {
		t.Fatal(err)
	}
	_ = w.close()

	// A torn last write: its bytes are half there.
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{0xff, 0xff}, tornAt+10); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	w, logged, err = openWAL(path, 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	if len(logged) != 3 || logged[2].v.rev != 3 || string(logged[0].v.value) != "v" {
		t.Fatalf("replayed %+v, want revisions 1-3", logged)
	}

	// After a reset, the old generation's records are not replayed even
	// though their bytes are still in the file.
	if err := w.reset(); err != nil {
		t.Fatal(err)
	}
	if err := w.append(record(9)); err != nil {
		t.Fatal(err)
	}
	_ = w.close()
	w, logged, err = openWAL(path, 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.close() }()
	if len(logged) != 1 || logged[0].v.rev != 9 {
		t.Fatalf("replayed %+v after reset, want only revision 9", logged)
	}
}

func TestBatchTooBigForWALGoesToBolt(t *testing.T) {
	opts := Options{CompactInterval: -1, WALSize: 1 << 20}
	s, dir := openTest(t, opts)
	big := make([]byte, 1<<20+1)
	for i := range 3 {
		if _, err := s.Create(t.Context(), fmt.Sprintf("/big/%d", i), big); err != nil {
			t.Fatal(err)
		}
	}
	// Each went to bbolt once, directly: none is left to checkpoint again.
	if st := s.Stats(); st.Commits != 3 || len(s.unapplied) != 0 {
		t.Fatalf("3 oversized writes took %d commits, %d left unapplied", st.Commits, len(s.unapplied))
	}
	s = reopen(t, s, dir, opts)
	for i := range 3 {
		if kv, err := s.Get(t.Context(), fmt.Sprintf("/big/%d", i)); err != nil || len(kv.Value) != len(big) {
			t.Fatalf("big value %d after reopen: %v", i, err)
		}
	}
}
