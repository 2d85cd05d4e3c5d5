package memtrim

import (
	"context"
	"log/slog"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// IdleCheckEvery is how often WhileIdle looks whether the process is idle:
// an idle Go program is collected every two minutes anyway (the runtime
// forces a collection when none ran for that long), so the check's
// collection mostly takes that one's place.
const IdleCheckEvery = 2 * time.Minute

// minRelease is the free heap worth a collection to give back.
const minRelease = 1 << 20

// WhileIdle gives the heap's free memory back to the system whenever the
// process was idle since the last look: it allocated less than a quarter
// of its heap goal (it would not have needed a collection of its own in
// four such intervals), and more than a MiB is free. The runtime keeps
// freed memory for the allocations it expects, returning it slowly and
// only above a tenth over its goal; an idle board's server never reuses
// it (3-5 MB with 30 pods), and a board that runs something else needs
// it. A busy process is left alone: it would fault the memory back in.
// It returns when ctx ends.
func WhileIdle(ctx context.Context, every time.Duration, log *slog.Logger) {
	samples := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}, {Name: "/gc/heap/goal:bytes"}, {Name: "/memory/classes/heap/free:bytes"}}
	metrics.Read(samples)
	lastAllocs := samples[0].Value.Uint64()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		metrics.Read(samples)
		allocs, goal, free := samples[0].Value.Uint64(), samples[1].Value.Uint64(), samples[2].Value.Uint64()
		busy := allocs-lastAllocs >= goal/4
		lastAllocs = allocs
		if busy || free < minRelease {
			continue
		}
		start := time.Now()
		debug.FreeOSMemory()
		log.Debug("idle: free heap returned", "freeMB", free>>20, "took", time.Since(start))
	}
}
