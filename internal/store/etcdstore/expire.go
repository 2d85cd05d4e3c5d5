package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// leases gives the keys of an expiring prefix an etcd lease of their TTL,
// as kube-apiserver does for events: etcd deletes each key once the TTL
// has passed since its last write, with no sweep by any server, and the
// watchers see the deletion. One lease is shared by the writes of a short
// window (a twentieth of the TTL, at most a minute, as kube-apiserver's
// lease manager), so a busy cluster does not grant one per event; a key
// then lives between its TTL and its TTL plus that window.
type leases struct {
	client *clientv3.Client
	now    func() time.Time

	mu      sync.Mutex
	current map[time.Duration]grantedLease
}

type grantedLease struct {
	id      clientv3.LeaseID
	expires time.Time
}

func newLeases(client *clientv3.Client) *leases {
	return &leases{client: client, now: time.Now, current: map[time.Duration]grantedLease{}}
}

// reuseWindow is how long one lease serves the writes of a TTL.
func reuseWindow(ttl time.Duration) time.Duration {
	return min(ttl/20, time.Minute)
}

// get is a lease that keeps a key written now for at least ttl.
func (l *leases) get(ctx context.Context, ttl time.Duration) (clientv3.LeaseID, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if g, ok := l.current[ttl]; ok && now.Add(ttl).Before(g.expires) {
		return g.id, nil
	}
	full := ttl + reuseWindow(ttl)
	resp, err := l.client.Grant(ctx, int64((full+time.Second-1)/time.Second))
	if err != nil {
		return 0, fmt.Errorf("grant a lease: %w", mapErr(err))
	}
	l.current[ttl] = grantedLease{id: resp.ID, expires: now.Add(full)}
	return resp.ID, nil
}

// lost forgets id, which etcd no longer has (revoked, or the member's
// data restored from a snapshot).
func (l *leases) lost(ttl time.Duration, id clientv3.LeaseID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if g, ok := l.current[ttl]; ok && g.id == id {
		delete(l.current, ttl)
	}
}

// expiring is the TTL of key's prefix, or 0 when it does not expire.
func (s *Store) expiring(key string) time.Duration {
	for prefix, ttl := range s.opts.Expiring {
		if strings.HasPrefix(key, prefix) {
			return ttl
		}
	}
	return 0
}

// putWithLease runs write, the transaction that puts key, with a lease
// when key expires, again with a new one if etcd no longer had the first.
func (s *Store) putWithLease(ctx context.Context, key string, write func(...clientv3.OpOption) (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error) {
	ttl := s.expiring(key)
	if ttl <= 0 {
		return write()
	}
	for attempt := 0; ; attempt++ {
		id, err := s.leases.get(ctx, ttl)
		if err != nil {
			return nil, err
		}
		resp, err := write(clientv3.WithLease(id))
		if err == nil || attempt > 0 || !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return resp, err
		}
		s.leases.lost(ttl, id)
	}
}
