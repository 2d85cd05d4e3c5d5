package boltstore

import (
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/orch-dev/orch/internal/store"
	"github.com/orch-dev/orch/internal/store/storetest"
)

// openTest opens a store in a temporary dir and, when the test ends, checks
// the bbolt file's consistency (as bbolt's own test helper does).
func openTest(t *testing.T, opts Options) (*Store, string) {
	t.Helper()
	dir := t.TempDir()
	if opts.WALSize == 0 {
		opts.WALSize = 1 << 20 // tests open many stores; 16 MiB each adds up
	}
	s, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = s.Close()
		checkFile(t, dir)
	})
	return s, dir
}

func checkFile(t *testing.T, dir string) {
	t.Helper()
	db, err := bolt.Open(dir+"/orch.db", 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("reopen for check: %v", err)
	}
	defer func() { _ = db.Close() }()
	err = db.View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatalf("bbolt consistency check: %v", err)
	}
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, volatile []string) store.Store {
		s, _ := openTest(t, Options{VolatilePrefixes: volatile, CompactInterval: -1})
		return s
	})
}
