package etcdstore

import (
	"context"
	"sync"
	"testing"
	"time"
)

// A caller shares a read that began after it asked, never one already in
// flight (whose revision may miss a write acknowledged just before the
// caller asked); callers arriving together share one read.
func TestRevisionReadsShareOnlyLaterReads(t *testing.T) {
	release := make(chan struct{})
	started := make(chan int, 10)
	var mu sync.Mutex
	reads := 0
	r := &revisionReads{stop: make(chan struct{}), read: func(ctx context.Context) (int64, error) {
		mu.Lock()
		reads++
		n := reads
		mu.Unlock()
		started <- n
		<-release
		return int64(n), nil
	}}
	ctx := context.Background()
	got := func(into *int64, wg *sync.WaitGroup) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rev, err := r.get(ctx)
			if err != nil {
				t.Error(err)
			}
			*into = rev
		}()
	}
	var first sync.WaitGroup
	var a int64
	got(&a, &first)
	if n := <-started; n != 1 {
		t.Fatalf("read %d started first", n)
	}
	// Three callers arrive while read 1 is in flight.
	var later sync.WaitGroup
	bs := make([]int64, 3)
	for i := range bs {
		got(&bs[i], &later)
	}
	time.Sleep(50 * time.Millisecond) // they wait on the next read
	release <- struct{}{}
	first.Wait()
	if a != 1 {
		t.Errorf("the first caller got revision %d, want 1", a)
	}
	if n := <-started; n != 2 {
		t.Fatalf("read %d started second", n)
	}
	release <- struct{}{}
	later.Wait()
	for i, b := range bs {
		if b != 2 {
			t.Errorf("caller %d arriving during read 1 got %d, want 2 (a read begun after it asked)", i, b)
		}
	}
	if reads != 2 {
		t.Errorf("%d reads for four callers in two waves, want 2", reads)
	}

	// A caller whose context ends stops waiting; the read goes on for
	// the others.
	cctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { _, err := r.get(cctx); errc <- err }()
	<-started
	cancel()
	if err := <-errc; err == nil {
		t.Error("a cancelled caller got no error")
	}
	release <- struct{}{}
}
