package api

import (
	"context"
	"time"

	"github.com/orch-dev/orch/internal/api/registry"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// defaultEventTTL is how long events are kept, as kube-apiserver's
// --event-ttl: events are recent history, not state.
const defaultEventTTL = time.Hour

func (s *Server) eventTTL() time.Duration {
	if s.cfg.EventTTL > 0 {
		return s.cfg.EventTTL
	}
	return defaultEventTTL
}

// eventsPrefix is where both events APIs keep their objects.
const eventsPrefix = "/registry/events/"

// expiringKeys are the keys an etcd deletes a TTL after their last write,
// as kube-apiserver's events: no server need sweep them, and they go while
// every server is down too.
func (s *Server) expiringKeys() map[string]time.Duration {
	return map[string]time.Duration{eventsPrefix: s.eventTTL()}
}

// expireEvents deletes events older than ttl every checkEvery until ctx
// ends. On bbolt, events live in the store's memory tier, so this keeps
// memory, not the disk, in check; on etcd it finds those written with no
// lease.
func (s *Server) expireEvents(ctx context.Context, ttl, checkEvery time.Duration) {
	t := time.NewTicker(checkEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if n, err := expireEventsOnce(ctx, s.storage("", "events"), time.Now().Add(-ttl)); err != nil && ctx.Err() == nil {
			s.log.Warn("expiring events", "err", err)
		} else if n > 0 {
			s.log.Debug("expired events", "count", n)
		}
	}
}

// expireEventsOnce deletes the events last seen before cutoff.
func expireEventsOnce(ctx context.Context, events *registry.Storage, cutoff time.Time) (int, error) {
	list, err := events.List(ctx, "", &metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range list.(*corev1.EventList).Items {
		if lastSeen(&e).After(cutoff) {
			continue
		}
		uid := e.UID
		_, err := events.Delete(ctx, e.Namespace, e.Name, &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}, registry.WriteOptions{})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return n, err
		}
		n++
	}
	return n, nil
}

// lastSeen is the latest time an event reports.
func lastSeen(e *corev1.Event) time.Time {
	t := e.CreationTimestamp.Time
	for _, c := range []time.Time{e.LastTimestamp.Time, e.EventTime.Time, e.FirstTimestamp.Time} {
		if c.After(t) {
			t = c
		}
	}
	if e.Series != nil && e.Series.LastObservedTime.After(t) {
		t = e.Series.LastObservedTime.Time
	}
	return t
}
