package api_test

import (
	"os"
	"path/filepath"
	"slices"
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
	deadline := time.Now().Add(20 * time.Second)
	seen := map[string]bool{}
	for {
		entries, _ := os.ReadDir(snapshots)
		var names []string
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), api.ScheduledSnapshotName+"-") {
				names = append(names, e.Name())
				seen[e.Name()] = true
			}
		}
		// One more than the retention exists between a save and its prune.
		if len(names) > 3 {
			t.Fatalf("more snapshots than the retention: %v", names)
		}
		// Once four have been taken, the newest two are what is kept.
		if len(seen) >= 4 && len(names) == 2 {
			var all []string
			for n := range seen {
				all = append(all, n)
			}
			slices.Sort(all)
			if slices.Equal(names, all[len(all)-2:]) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("scheduled snapshots: %v (seen %d)", names, len(seen))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
