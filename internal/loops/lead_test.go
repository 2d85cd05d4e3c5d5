package loops_test

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api/apitest"
	"github.com/orch-dev/orch/internal/loops"
	"github.com/prometheus/client_golang/prometheus"
)

// A server that loses the lead of the control loops and wins it back runs
// them again in the same process: their metrics must register again (the
// second term panicked on a duplicate registration before they left the
// registry with the loops), and be served while they run.
func TestLoopsRunAgainAfterALostLead(t *testing.T) {
	srv := apitest.StartWith(t, nil)
	opts := loops.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: srv.Metrics(),
		LocalStoragePath: filepath.Join(t.TempDir(), "storage"), RemoveLocalVolume: srv.RemoveLocalVolume}
	for term := 1; term <= 2; term++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		started := make(chan struct{})
		done := make(chan error, 1)
		go func() { done <- loops.Run(ctx, srv.Loopback(), opts, func() { close(started) }) }()
		select {
		case <-started:
		case err := <-done:
			cancel()
			t.Fatalf("term %d: loops did not start: %v", term, err)
		}
		families, err := srv.Metrics().(prometheus.Gatherer).Gather()
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, f := range families {
			found = found || f.GetName() == "workqueue_adds_total"
		}
		if !found {
			t.Errorf("term %d: no workqueue_adds_total among the server's metrics", term)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("term %d: %v", term, err)
		}
	}
}
