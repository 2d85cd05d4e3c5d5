package memtrim

import (
	"context"
	"log/slog"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"
)

// forcedCollections counts the collections the program asked for, as
// debug.FreeOSMemory does.
func forcedCollections() uint64 {
	s := []metrics.Sample{{Name: "/gc/cycles/forced:gc-cycles"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

func heapFree() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/free:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

var sink [][]byte

// An idle process gives its free heap back; a busy one is left alone (it
// would fault the memory straight back in).
func TestWhileIdle(t *testing.T) {
	const every = 200 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { WhileIdle(ctx, every, slog.Default()); close(done) }()

	// Busy: allocating far more than a quarter of the heap goal in every
	// interval, holding some of it so that there is free heap to give.
	stop := time.Now().Add(5 * every)
	before := forcedCollections()
	for time.Now().Before(stop) {
		sink = append(sink, make([]byte, 64<<10))
		if len(sink) > 256 {
			sink = sink[:0]
		}
		time.Sleep(100 * time.Microsecond)
	}
	if n := forcedCollections() - before; n != 0 {
		t.Errorf("a busy process was collected %d times to give memory back, want none", n)
	}

	// Idle, with free heap: 32 MiB held, then let go.
	for range 512 {
		sink = append(sink, make([]byte, 64<<10))
	}
	sink = nil
	runtime.GC()
	if free := heapFree(); free < minRelease {
		t.Skipf("only %d bytes of free heap after letting 32 MiB go", free)
	}
	before = forcedCollections()
	deadline := time.Now().Add(20 * every)
	for forcedCollections() == before && time.Now().Before(deadline) {
		time.Sleep(every / 4)
	}
	if forcedCollections() == before {
		t.Fatalf("an idle process with %d bytes of free heap did not give it back", heapFree())
	}
	// The collection counts before the memory is given back.
	for heapFree() >= minRelease && time.Now().Before(deadline) {
		time.Sleep(every / 4)
	}
	if free := heapFree(); free >= minRelease {
		t.Errorf("%d bytes of heap still free after giving it back", free)
	}
	cancel()
	<-done
}
