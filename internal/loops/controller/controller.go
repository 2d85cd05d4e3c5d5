// Package controller is the shape the keyed loops share: a rate-limited
// queue of object keys, workers that sync one key at a time (a key is
// never synced by two workers at once), and retries with exponential
// backoff when a sync fails.
package controller

import (
	"context"
	"log/slog"
	"sync"

	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
)

// Env is what every loop is given besides its client and informers: where
// to log and what time it is. Tests give a fake clock and step it instead
// of sleeping.
type Env struct {
	Log   *slog.Logger
	Clock clock.WithTicker
}

// WithDefaults fills what env leaves empty: the default logger and the
// real clock.
func (env Env) WithDefaults() Env {
	if env.Log == nil {
		env.Log = slog.Default()
	}
	if env.Clock == nil {
		env.Clock = clock.RealClock{}
	}
	return env
}

// Queue is a loop's work queue.
type Queue[K comparable] struct {
	workqueue.TypedRateLimitingInterface[K]
	log *slog.Logger
}

// NewQueue makes the queue of the loop called name; its delays run on
// env's clock.
func NewQueue[K comparable](name string, env Env) *Queue[K] {
	env = env.WithDefaults()
	return &Queue[K]{
		TypedRateLimitingInterface: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[K](),
			workqueue.TypedRateLimitingQueueConfig[K]{Name: name, Clock: env.Clock}),
		log: env.Log.With("loop", name),
	}
}

// Run waits for the informers to sync, then has workers call sync for
// each queued key until ctx ends; a key whose sync fails comes back later.
func (q *Queue[K]) Run(ctx context.Context, workers int, synced []toolscache.InformerSynced, syncKey func(context.Context, K) error) {
	defer q.ShutDown()
	if !toolscache.WaitForCacheSync(ctx.Done(), synced...) {
		return
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for q.next(ctx, syncKey) {
			}
		})
	}
	<-ctx.Done()
	q.ShutDown()
	wg.Wait()
}

func (q *Queue[K]) next(ctx context.Context, syncKey func(context.Context, K) error) bool {
	k, quit := q.Get()
	if quit {
		return false
	}
	defer q.Done(k)
	if err := syncKey(ctx, k); err != nil {
		if ctx.Err() == nil {
			q.log.Debug("sync failed, retrying", "key", k, "err", err)
		}
		q.AddRateLimited(k)
		return true
	}
	q.Forget(k)
	return true
}
