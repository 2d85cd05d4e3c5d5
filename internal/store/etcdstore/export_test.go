package etcdstore

import "context"

// ClaimCompaction is one tick of the periodic compaction, for tests.
func (s *Store) ClaimCompaction(ctx context.Context, rev int64) (int64, error) {
	return s.claimCompaction(ctx, rev)
}

// Disconnect cuts the store off from etcd as a process's death would: no
// lease is revoked.
func (s *Store) Disconnect() error { return s.client.Close() }
