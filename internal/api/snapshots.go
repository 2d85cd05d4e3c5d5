package api

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/orch-dev/orch/internal/api/etcdmember"
	"github.com/orch-dev/orch/internal/store/boltstore"
	"github.com/robfig/cron/v3"
)

// Store snapshots, as k3s's etcd snapshots: a consistent copy of the
// store taken while the server serves, on a schedule with retention and
// on demand (`orch snapshot save`, which asks the running server over a
// socket only root can open, or copies the store itself when no server
// runs); `orch server --cluster-reset --cluster-reset-restore-path`
// restores one.

// ScheduledSnapshotName is the name scheduled snapshots take.
const ScheduledSnapshotName = "orch-snapshot"

// DefaultSnapshotDir is where snapshots go by default.
func DefaultSnapshotDir(dataDir string) string {
	return filepath.Join(dataDir, "server", "db", "snapshots")
}

// Snapshot is one snapshot taken.
type Snapshot struct {
	Name     string `json:"name"`
	Path     string `json:"path"`
	Revision int64  `json:"revision"`
	Size     int64  `json:"size"`
}

var snapshotName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`)

// saveSnapshot writes a snapshot named name-<host>-<unix time> into dir,
// whole or not at all (a temporary file renamed once synced).
func saveSnapshot(ctx context.Context, dir, name string, take func(context.Context, io.Writer) (int64, error)) (Snapshot, error) {
	if !snapshotName.MatchString(name) {
		return Snapshot{}, fmt.Errorf("snapshot name %q: lowercase letters, digits, '-' and '.'", name)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Snapshot{}, err
	}
	host, _ := os.Hostname()
	full := fmt.Sprintf("%s-%s-%d", name, strings.ToLower(host), time.Now().Unix())
	path := filepath.Join(dir, full)
	f, err := os.CreateTemp(dir, "."+full+".partial-*")
	if err != nil {
		return Snapshot{}, err
	}
	defer func() { _ = os.Remove(f.Name()) }()
	rev, err := take(ctx, f)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		return Snapshot{}, fmt.Errorf("snapshot %s: %w", full, err)
	}
	info, _ := os.Stat(path)
	return Snapshot{Name: full, Path: path, Revision: rev, Size: info.Size()}, nil
}

// pruneSnapshots keeps the newest keep snapshots of a name in dir.
func pruneSnapshots(dir, name string, keep int) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var mine []string
	for _, e := range entries {
		if !e.IsDir() && strings.HasPrefix(e.Name(), name+"-") {
			mine = append(mine, e.Name())
		}
	}
	// Names end in the time they were taken.
	slices.SortFunc(mine, func(a, b string) int { return cmp.Compare(takenAt(a), takenAt(b)) })
	for len(mine) > keep {
		if err := os.Remove(filepath.Join(dir, mine[0])); err != nil {
			return err
		}
		mine = mine[1:]
	}
	return nil
}

// takenAt is the unix time a snapshot's name ends in.
func takenAt(name string) int64 {
	t, _ := strconv.ParseInt(name[strings.LastIndex(name, "-")+1:], 10, 64)
	return t
}

// snapshotDir is where the server's snapshots go.
func (s *Server) snapshotDir() string {
	if s.cfg.SnapshotDir != "" {
		return s.cfg.SnapshotDir
	}
	return DefaultSnapshotDir(s.cfg.DataDir)
}

// startSnapshots takes scheduled snapshots, when the store is the
// server's own bbolt store.
func (s *Server) startSnapshots(ctx context.Context) error {
	if s.cfg.Store != nil {
		return nil // a store of the caller's: its snapshots are the caller's
	}
	if s.cfg.Datastore.Endpoint != "" {
		// An external etcd is backed up by whoever runs it, as k3s takes
		// scheduled snapshots of its embedded etcd only; `orch snapshot
		// save` still asks it for one.
		return nil
	}
	dir := s.snapshotDir()
	if s.cfg.SnapshotSchedule == "" {
		return nil
	}
	schedule, err := cron.ParseStandard(s.cfg.SnapshotSchedule)
	if err != nil {
		return fmt.Errorf("snapshot schedule %q: %w", s.cfg.SnapshotSchedule, err)
	}
	retention := s.cfg.SnapshotRetention
	if retention < 1 {
		retention = 1
	}
	go s.snapshotSchedule(ctx, schedule, dir, retention)
	return nil
}

// takeSnapshot is the store's snapshot, when it can make one.
func (s *Server) takeSnapshot(ctx context.Context, w io.Writer) (int64, error) {
	snapshotter, ok := s.store.(interface {
		Snapshot(context.Context, io.Writer) (int64, error)
	})
	if !ok {
		return 0, errors.New("this store takes no snapshots")
	}
	return snapshotter.Snapshot(ctx, w)
}

// snapshotSchedule takes a snapshot at every time of the schedule and
// keeps the newest retention ones, until ctx ends.
func (s *Server) snapshotSchedule(ctx context.Context, schedule cron.Schedule, dir string, retention int) {
	for {
		next := schedule.Next(time.Now())
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(next)):
		}
		snap, err := saveSnapshot(ctx, dir, ScheduledSnapshotName, s.takeSnapshot)
		if err != nil {
			s.log.Error("scheduled snapshot failed", "err", err)
			continue
		}
		s.log.Info("snapshot saved", "path", snap.Path, "revision", snap.Revision, "bytes", snap.Size)
		if err := pruneSnapshots(dir, ScheduledSnapshotName, retention); err != nil {
			s.log.Warn("pruning old snapshots", "err", err)
		}
	}
}

// SaveSnapshot is `orch snapshot save`: through the running server's
// socket, or from the store itself when no server runs on dataDir. dir ""
// is the default snapshot directory.
func SaveSnapshot(ctx context.Context, dataDir, name, dir string) (Snapshot, error) {
	if dir == "" {
		dir = DefaultSnapshotDir(dataDir)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return Snapshot{}, err
	}
	var snap Snapshot
	reached, err := control(ctx, dataDir, "/snapshots", url.Values{"name": {name}, "dir": {abs}}, &snap)
	if reached {
		return snap, err
	}
	// No server answers: the store is this process's to copy.
	if IsEtcdMember(dataDir) {
		return saveSnapshot(ctx, dir, name, func(_ context.Context, w io.Writer) (int64, error) {
			return etcdmember.SnapshotFile(filepath.Join(dataDir, "server", "db", "etcd"), w)
		})
	}
	db := filepath.Join(dataDir, "server", "db")
	ok, err := boltstore.Exists(db)
	if err != nil {
		return Snapshot{}, fmt.Errorf("the store at %s: %w", db, err)
	}
	if !ok {
		// Opening the store would make an empty one, and the snapshot
		// of nothing would look like a backup.
		return Snapshot{}, fmt.Errorf("no server answers on %s and it holds no store of its own: a server on an external etcd is snapshotted while it runs, or with etcdctl", dataDir)
	}
	return saveSnapshot(ctx, dir, name, func(ctx context.Context, w io.Writer) (int64, error) {
		return boltstore.SnapshotFile(ctx, db, w)
	})
}

// RestoreSnapshot replaces the store of a server that is not running
// (`orch server --cluster-reset --cluster-reset-restore-path`).
func RestoreSnapshot(dataDir, snapshot string) error {
	return boltstore.Restore(filepath.Join(dataDir, "server", "db"), snapshot)
}
