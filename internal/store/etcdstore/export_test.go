package etcdstore

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ClaimCompaction is one tick of the periodic compaction, for tests.
func (s *Store) ClaimCompaction(ctx context.Context, rev int64) (int64, error) {
	return s.claimCompaction(ctx, rev)
}

// Disconnect cuts the store off from etcd as a process's death would: no
// lease is revoked.
func (s *Store) Disconnect() error { return s.client.Close() }

// LeaseOf is the etcd lease key is on (0 for none).
func (s *Store) LeaseOf(ctx context.Context, key string) (int64, error) {
	resp, err := s.client.Get(ctx, s.opts.Prefix+key)
	if err != nil || len(resp.Kvs) == 0 {
		return 0, err
	}
	return resp.Kvs[0].Lease, nil
}

// RevokeLease revokes an etcd lease as an operator's etcdctl would.
func (s *Store) RevokeLease(ctx context.Context, id int64) error {
	_, err := s.client.Revoke(ctx, clientv3.LeaseID(id))
	return err
}
