package proctest_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/orch-dev/orch/internal/proctest"
)

func TestOwnProcess(t *testing.T) {
	pid := os.Getpid()
	if rss := proctest.RSSMB(pid); rss <= 0 || rss > 1<<20 {
		t.Errorf("RSS %.1f MiB", rss)
	}
	busy := 0
	for i := range 50_000_000 {
		busy ^= i
	}
	if proctest.CPUTicks(pid) <= 0 {
		t.Errorf("no CPU time after a busy loop (%d)", busy)
	}
	if proctest.RSSMB(1<<30) != 0 || proctest.CPUTicks(1<<30) != 0 {
		t.Error("a process that does not exist uses something")
	}
	before := proctest.WrittenBytes(pid)
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	if after := proctest.WrittenBytes(pid); after-before < 1<<20 {
		t.Skipf("%d bytes written counted for 1 MiB synced (no I/O accounting here, or a tmpfs)", after-before)
	}
}
