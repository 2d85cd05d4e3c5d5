// Package controller is the shape the keyed loops share: a rate-limited
// queue of object keys, workers that sync one key at a time (a key is
// never synced by two workers at once), and retries with exponential
// backoff when a sync fails.
package controller

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	// Metrics, when set, measures the loops' work queues.
	Metrics workqueue.MetricsProvider
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
			workqueue.TypedRateLimitingQueueConfig[K]{Name: name, Clock: env.Clock, MetricsProvider: env.Metrics}),
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

// EnqueueObjects has the informer queue each object's own key
// (namespace/name) whenever it is added, changed or deleted.
func (q *Queue[K]) EnqueueObjects(inf toolscache.SharedIndexInformer, key func(namespace, name string) K) error {
	add := func(obj any) {
		if m, ok := objectOf(obj); ok {
			q.Add(key(m.GetNamespace(), m.GetName()))
		}
	}
	_, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: add, UpdateFunc: func(_, obj any) { add(obj) }, DeleteFunc: add})
	return err
}

// EnqueueControllers has the informer queue the key of each object's
// controller of the given kind whenever the object is added, changed or
// deleted: a loop hears of what it owns.
func (q *Queue[K]) EnqueueControllers(inf toolscache.SharedIndexInformer, kind string, key func(namespace, name string) K) error {
	add := func(obj any) {
		if m, ok := objectOf(obj); ok {
			if ref := metav1.GetControllerOf(m); ref != nil && ref.Kind == kind {
				q.Add(key(m.GetNamespace(), ref.Name))
			}
		}
	}
	_, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: add, UpdateFunc: func(_, obj any) { add(obj) }, DeleteFunc: add})
	return err
}

// NamespacedKey is the usual key of a namespaced object.
func NamespacedKey(namespace, name string) string { return namespace + "/" + name }

// objectOf is the object an informer delivered, a deleted one's last
// state included.
func objectOf(obj any) (metav1.Object, bool) {
	if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	m, ok := obj.(metav1.Object)
	return m, ok
}

// WhenChanged calls changed each time get's value differs from the one
// before, looking every interval on clk until ctx ends: for what a loop
// takes from outside the API, as the cluster CA, which a rotation
// replaces.
func WhenChanged(ctx context.Context, clk clock.WithTicker, every time.Duration, get func() []byte, changed func()) {
	last := get()
	t := clk.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		if now := get(); !bytes.Equal(now, last) {
			last = now
			changed()
		}
	}
}
