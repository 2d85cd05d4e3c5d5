package memo

import (
	"sync"
	"sync/atomic"
	"testing"
)

func TestRing(t *testing.T) {
	r := New[string, int](2)
	var calls atomic.Int32
	compute := func(v int) func() (int, error) { return func() (int, error) { calls.Add(1); return v, nil } }
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			if v, _ := r.Get("a", compute(1)); v != 1 {
				t.Error("wrong value")
			}
		})
	}
	wg.Wait()
	if calls.Load() != 1 {
		t.Fatalf("concurrent callers computed %d times, want once", calls.Load())
	}
	_, _ = r.Get("b", compute(2))
	_, _ = r.Get("c", compute(3)) // pushes "a" out
	if v, _ := r.Get("a", compute(4)); v != 4 || calls.Load() != 4 {
		t.Fatalf("forgotten key: value %d after %d calls", v, calls.Load())
	}
}
