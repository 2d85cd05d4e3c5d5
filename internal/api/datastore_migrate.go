package api

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/orch-dev/orch/internal/store"
	"github.com/orch-dev/orch/internal/store/boltstore"
)

// movedMarker, in DATA/server/db, says its store was copied into a
// datastore, which holds the cluster from then on.
const movedMarker = "moved-to-datastore"

// moveIntoDatastore copies the objects of a server that ran on its own
// store into the datastore it now starts on, once, as k3s copies a
// single server's data into etcd. Revisions start again in the datastore:
// clients resuming from the old ones are told to list again (Too large
// resource version). Events and node leases, which lived in memory, are
// not there to copy.
func (s *Server) moveIntoDatastore(ctx context.Context, serverDir string) error {
	dbDir := filepath.Join(serverDir, "db")
	marker := filepath.Join(dbDir, movedMarker)
	if _, err := os.Stat(marker); err == nil {
		return nil
	}
	if exists, err := boltstore.Exists(dbDir); err != nil || !exists {
		return err // none: a new server (or only snapshots there), nothing to move
	}
	own, err := boltstore.Open(dbDir, boltstore.Options{CompactInterval: -1, Logger: s.log})
	if err != nil {
		return fmt.Errorf("open this server's own store to move it into the datastore: %w", err)
	}
	defer func() { _ = own.Close() }()
	start := time.Now()
	moved, kept := 0, 0
	opts := store.ListOptions{Limit: 500}
	for {
		page, err := own.List(ctx, "", opts)
		if err != nil {
			return fmt.Errorf("read this server's own store: %w", err)
		}
		for _, kv := range page.KVs {
			// A key there already came from an earlier, interrupted move.
			switch _, err := s.store.Create(ctx, kv.Key, kv.Value); {
			case err == nil:
				moved++
			case errors.Is(err, store.ErrExists):
				kept++
			default:
				return fmt.Errorf("move %s into the datastore: %w", kv.Key, err)
			}
		}
		if page.Continue == "" {
			break
		}
		opts = store.ListOptions{Limit: 500, Continue: page.Continue}
	}
	if err := os.WriteFile(marker, []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o600); err != nil {
		return err
	}
	s.log.Info("this server's objects moved into the datastore; its own store stays as it was", "objects", moved, "already there", kept, "took", time.Since(start).Round(time.Millisecond), "store", dbDir)
	return nil
}
