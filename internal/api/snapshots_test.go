package api_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api"
)

// TestScheduledSnapshots: snapshots are taken on the schedule, named and
// placed as k3s names its etcd snapshots, and only the newest
// --snapshot-retention are kept.
func TestScheduledSnapshots(t *testing.T) {
	dir := t.TempDir()
	snapshots := filepath.Join(t.TempDir(), "snaps")
	startServerWith(t, dir, 0, func(c *api.Config) {
		c.SnapshotSchedule, c.SnapshotRetention, c.SnapshotDir = "@every 1s", 2, snapshots
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		entries, _ := os.ReadDir(snapshots)
		var names []string
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), api.ScheduledSnapshotName+"-") {
				names = append(names, e.Name())
			}
		}
		if len(names) > 2 {
			t.Fatalf("more snapshots than the retention: %v", names)
		}
		// Each second's snapshot replaces the oldest once two exist.
		if len(names) == 2 && time.Until(deadline) < 10*time.Second {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("scheduled snapshots: %v", names)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
