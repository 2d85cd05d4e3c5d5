package boltstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/orch-dev/orch/internal/store"
	bolt "go.etcd.io/bbolt"
)

// snapshotRequest asks the committer for a read transaction that sees
// every acknowledged durable write.
type snapshotRequest struct {
	done chan snapshotTx
}

type snapshotTx struct {
	tx  *bolt.Tx
	err error
}

// Snapshot writes a consistent copy of the durable keys to w while the
// store serves: the committer checkpoints what the log holds, then a read
// transaction of that state is copied (writers go on meanwhile). Volatile
// keys (leases, events) are not in it. It returns the revision the copy
// holds everything up to.
func (s *Store) Snapshot(ctx context.Context, w io.Writer) (int64, error) {
	req := snapshotRequest{done: make(chan snapshotTx, 1)}
	s.enqueue.RLock()
	if s.closed {
		s.enqueue.RUnlock()
		return 0, store.ErrClosed
	}
	select {
	case s.snapshots <- req:
		s.enqueue.RUnlock()
	case <-ctx.Done():
		s.enqueue.RUnlock()
		return 0, ctx.Err()
	}
	got := <-req.done
	if got.err != nil {
		return 0, got.err
	}
	defer func() { _ = got.tx.Rollback() }()
	rev := metaInt(got.tx, metaRev)
	if _, err := got.tx.WriteTo(w); err != nil {
		return 0, fmt.Errorf("copy the store: %w", err)
	}
	return rev, nil
}

// serveSnapshot answers a snapshot request in the committer.
func (s *Store) serveSnapshot(req snapshotRequest) {
	if err := s.checkpoint(); err != nil {
		req.done <- snapshotTx{err: fmt.Errorf("checkpoint before a snapshot: %w", err)}
		return
	}
	tx, err := s.db.Begin(false)
	req.done <- snapshotTx{tx: tx, err: err}
}

// SnapshotFile copies the store in dir to w without serving it: for a
// store no process has open.
func SnapshotFile(ctx context.Context, dir string, w io.Writer) (int64, error) {
	s, err := Open(dir, Options{CompactInterval: -1})
	if err != nil {
		return 0, err
	}
	defer func() { _ = s.Close() }()
	return s.Snapshot(ctx, w)
}

// Restore replaces the store in dir, which no process may have open, with
// a snapshot. Revisions go on from past both the snapshot's and the
// replaced store's, and everything before is compacted: a client that
// watched the old store is told its history is gone (410) and lists
// again, as after an etcd restore with its revision bumped.
func Restore(dir, snapshot string) error {
	var previous int64
	if old, err := bolt.Open(filepath.Join(dir, dbFile), 0o600, &bolt.Options{Timeout: 0, ReadOnly: true}); err == nil {
		_ = old.View(func(tx *bolt.Tx) error {
			if tx.Bucket(bucketMeta) != nil {
				previous = max(metaInt(tx, metaRev), metaInt(tx, metaCeiling))
			}
			return nil
		})
		_ = old.Close()
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("the store being replaced: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tmp := filepath.Join(dir, "orch.db.restoring")
	if err := copyFile(snapshot, tmp); err != nil {
		return err
	}
	db, err := bolt.Open(tmp, 0o600, &bolt.Options{Timeout: 0})
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("the snapshot %s is not a store: %w", snapshot, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketMeta) == nil || tx.Bucket(bucketKV) == nil {
			return fmt.Errorf("the snapshot %s is not an orch store", snapshot)
		}
		// Past every revision either store used, with room for the volatile
		// writes the replaced one may have made after its last record.
		base := max(previous, metaInt(tx, metaRev), metaInt(tx, metaCeiling)) + volatileReserve
		for _, k := range [][]byte{metaRev, metaCeiling, metaCompacted} {
			if err := putMetaInt(tx, k, base); err != nil {
				return err
			}
		}
		return nil
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	// The replaced store's log holds nothing the restored one should have.
	if err := os.Remove(filepath.Join(dir, walFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, dbFile)); err != nil {
		return err
	}
	return syncDir(dir)
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	defer func() { _ = in.Close() }()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer func() { _ = d.Close() }()
	return d.Sync()
}
