package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/orch-dev/orch/internal/store"
)

// HoldKey keeps key at value for as long as ctx lasts and this process
// renews it: the key is on an etcd lease of ttl that is kept alive. etcd's
// leader renews a lease in memory, without writing to its disk, so holding
// a key costs no writes while nothing changes, where renewing it by
// rewriting costs one on every member each time. When the process dies or
// is cut off, etcd deletes the key ttl later, by the leader's clock alone
// (boards without a real-time clock boot with clocks apart). When ctx ends
// the lease is revoked, which deletes the key at once. A lease lost while
// cut off is granted again and the key written again. HoldKey returns when
// ctx ends or the store is closed.
func (s *Store) HoldKey(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	for {
		err := s.holdKeyOnce(ctx, key, value, ttl)
		if ctx.Err() != nil {
			return nil
		}
		if err := s.check(); err != nil {
			return err
		}
		s.opts.Logger.Warn("holding a key in etcd: its lease was lost; holding it again", "key", key, "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-s.closing:
			return store.ErrClosed
		case <-time.After(time.Second):
		}
	}
}

func (s *Store) holdKeyOnce(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	if err := s.check(); err != nil {
		return err
	}
	lease, err := s.client.Grant(ctx, max(int64(ttl/time.Second), 1))
	if err != nil {
		return fmt.Errorf("grant a lease: %w", mapErr(err))
	}
	defer func() {
		// Revoked as the process leaves, so the key goes at once; after a
		// failure the lease is likely gone already.
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, _ = s.client.Revoke(rctx, lease.ID)
		cancel()
	}()
	if _, err := s.client.Put(ctx, s.opts.Prefix+key, string(value), clientv3.WithLease(lease.ID)); err != nil {
		return fmt.Errorf("put %s: %w", key, mapErr(err))
	}
	alive, err := s.client.KeepAlive(ctx, lease.ID)
	if err != nil {
		return fmt.Errorf("keep the lease alive: %w", mapErr(err))
	}
	for {
		select {
		case _, ok := <-alive:
			if !ok {
				return errors.New("the lease's keep-alive ended (expired while etcd was out of reach)")
			}
		case <-s.closing:
			return store.ErrClosed
		}
	}
}
