package main

import (
	"runtime/debug"
	"testing"
)

// TestTuneGC: orch collects at GOGC=50 unless the environment sets GOGC,
// which the operator's word then stands (the runtime applied it).
func TestTuneGC(t *testing.T) {
	saved := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(saved) })

	t.Setenv("GOGC", "")
	tuneGC()
	if got := debug.SetGCPercent(100); got != gcPercent {
		t.Errorf("without GOGC: the GC percent is %d, want %d", got, gcPercent)
	}
	t.Setenv("GOGC", "100")
	tuneGC()
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("with GOGC=100: the GC percent is %d, want it left at 100", got)
	}
}
