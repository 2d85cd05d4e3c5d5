package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestStopInOrder: each part stops only once the ones before it have
// returned, and a later part is still running when an earlier one stops.
func TestStopInOrder(t *testing.T) {
	var mu sync.Mutex
	var order []string
	running := map[string]bool{}
	mk := func(name string, slow time.Duration) part {
		return part{name: name, essential: true, run: func(ctx context.Context) error {
			mu.Lock()
			running[name] = true
			mu.Unlock()
			<-ctx.Done()
			time.Sleep(slow) // a part that takes its time to stop
			mu.Lock()
			defer mu.Unlock()
			for _, later := range []string{"agent", "loops", "server"} {
				if later == name {
					break
				}
				if running[later] {
					t.Errorf("%s stopped while %s still ran", name, later)
				}
			}
			running[name] = false
			order = append(order, name)
			return nil
		}}
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := runStopInOrder(ctx, log, mk("agent", 50*time.Millisecond), mk("loops", 20*time.Millisecond), mk("server", 0)); err != nil {
		t.Fatal(err)
	}
	if want := []string{"agent", "loops", "server"}; !slices.Equal(order, want) {
		t.Fatalf("stopped %v, want %v", order, want)
	}
}

// TestEssentialPartStopsAll: when the loops fail, the agent and the
// server are stopped too and the error comes back; a part that is not
// essential ending leaves the others running.
func TestEssentialPartStopsAll(t *testing.T) {
	boom := errors.New("boom")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	untilStopped := func(ctx context.Context) error { <-ctx.Done(); return nil }
	done := make(chan error, 1)
	go func() {
		done <- runStopInOrder(context.Background(), log,
			part{name: "agent", run: func(context.Context) error { return errors.New("agent gave up") }},
			part{name: "loops", essential: true, run: func(ctx context.Context) error {
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(100 * time.Millisecond):
					return boom
				}
			}},
			part{name: "server", essential: true, run: untilStopped})
	}()
	select {
	case err := <-done:
		if !errors.Is(err, boom) {
			t.Fatalf("got %v, want the loops' error", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a failed essential part did not stop the rest")
	}
}
