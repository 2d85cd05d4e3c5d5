package storebench

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const valueSize = 1024

// value is 1 KiB whose first bytes carry the time it was written.
func value(now time.Time) []byte {
	v := make([]byte, valueSize)
	binary.BigEndian.PutUint64(v, uint64(now.UnixNano()))
	return v
}

func sentAt(v []byte) time.Time { return time.Unix(0, int64(binary.BigEndian.Uint64(v))) }

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(float64(len(sorted))*p))]
}

func reportLatency(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	b.ReportMetric(float64(percentile(lat, 0.50).Microseconds()), "p50-µs")
	b.ReportMetric(float64(percentile(lat, 0.99).Microseconds()), "p99-µs")
}

// BenchmarkWrite: creates of 1 KiB values by concurrent writers.
func BenchmarkWrite(b *testing.B) {
	for _, writers := range []int{1, 16, 128} {
		for _, tk := range targets {
			b.Run(fmt.Sprintf("writers=%d/store=%s", writers, tk.name), func(b *testing.B) {
				total := 2000 * min(writers, 10)
				for range b.N {
					t := tk.open(b)
					ops, lat := writeLoad(b, t, writers, total)
					t.close()
					b.ReportMetric(ops, "writes/s")
					reportLatency(b, lat)
				}
			})
		}
	}
}

func writeLoad(b *testing.B, t target, writers, total int) (perSec float64, lat []time.Duration) {
	ctx := context.Background()
	var next atomic.Int64
	lats := make([][]time.Duration, writers)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range writers {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(total) {
					return
				}
				t0 := time.Now()
				if err := t.create(ctx, fmt.Sprintf("/registry/bench/k%08d", i), value(t0)); err != nil {
					b.Error(err)
					return
				}
				lats[w] = append(lats[w], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	return float64(total) / elapsed.Seconds(), slices.Concat(lats...)
}

// BenchmarkWatchDelivery: time from the start of a write to each watcher
// receiving its event, one writer writing in sequence.
func BenchmarkWatchDelivery(b *testing.B) {
	for _, watchers := range []int{1, 1000} {
		for _, tk := range targets {
			b.Run(fmt.Sprintf("watchers=%d/store=%s", watchers, tk.name), func(b *testing.B) {
				events := 2000
				if watchers > 1 {
					events = 300
				}
				for range b.N {
					t := tk.open(b)
					reportLatency(b, watchLoad(b, t, watchers, events))
					t.close()
				}
			})
		}
	}
}

func watchLoad(b *testing.B, t target, watchers, events int) []time.Duration {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lats := make([][]time.Duration, watchers)
	var got sync.WaitGroup
	got.Add(watchers * events)
	for w := range watchers {
		lats[w] = make([]time.Duration, 0, events)
		_, err := t.watch(ctx, "/registry/pods/", func(v []byte) {
			lats[w] = append(lats[w], time.Since(sentAt(v)))
			got.Done()
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	for i := range events {
		if err := t.create(ctx, fmt.Sprintf("/registry/pods/p%06d", i), value(time.Now())); err != nil {
			b.Fatal(err)
		}
	}
	got.Wait()
	return slices.Concat(lats...)
}

// BenchmarkList10k: a whole List of 10,000 keys with 1 KiB values.
func BenchmarkList10k(b *testing.B) {
	for _, tk := range targets {
		b.Run("store="+tk.name, func(b *testing.B) {
			t := tk.open(b)
			defer t.close()
			writeLoad(b, t, 64, 10000)
			ctx := context.Background()
			b.ResetTimer()
			for range b.N {
				n, err := t.list(ctx, "/registry/bench/")
				if err != nil || n != 10000 {
					b.Fatalf("listed %d, %v", n, err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/list")
		})
	}
}
