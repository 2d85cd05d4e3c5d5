package main

import (
	"context"
	"errors"
	"log/slog"
)

// part is one piece of a running orch: it runs until its context ends.
type part struct {
	name string
	run  func(ctx context.Context) error
	// essential: when it stops by itself, everything stops.
	essential bool
}

// runStopInOrder runs the parts, each under a context of its own, until
// ctx ends or an essential part stops; then it stops them in the order
// given, each once the one before has returned: orch server stops its
// agent, then its loops, then the API server and the store under it, so
// nothing writes to a closed store or reads from a gone API.
func runStopInOrder(ctx context.Context, log *slog.Logger, parts ...part) error {
	type result struct {
		i   int
		err error
	}
	stops := make([]context.CancelFunc, len(parts))
	dones := make([]chan error, len(parts))
	ended := make(chan result, len(parts))
	for i, p := range parts {
		pctx, stop := context.WithCancel(context.WithoutCancel(ctx))
		stops[i], dones[i] = stop, make(chan error, 1)
		go func() {
			err := p.run(pctx)
			dones[i] <- err
			ended <- result{i, err}
		}()
	}
	var errs []error
	stopped := make([]bool, len(parts))
wait:
	for {
		select {
		case <-ctx.Done():
			break wait
		case r := <-ended:
			stopped[r.i] = true
			errs = append(errs, r.err)
			if parts[r.i].essential {
				log.Warn("stopping: a part ended", "part", parts[r.i].name, "err", r.err)
				break wait
			}
		}
	}
	for i, p := range parts {
		stops[i]()
		if !stopped[i] {
			errs = append(errs, <-dones[i])
		}
		log.Info("stopped", "part", p.name)
	}
	return errors.Join(errs...)
}
