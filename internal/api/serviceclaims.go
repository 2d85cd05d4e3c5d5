package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/orch-dev/orch/internal/store"
)

// Servers sharing a datastore each allocate cluster IPs and node ports
// from what they have seen; a claim in the datastore, a key made only if
// absent, makes an address one Service's even when two servers pick it at
// the same instant (Kubernetes' IPAddress objects do this for cluster
// IPs). A single server needs none: its allocator is the only one.

const claimsPrefix = "/orch/allocations/"

// claimAge is how old a claim no Service holds must be before the repair
// at a server's start removes it: younger ones may be another server's
// Service on its way to the store.
const claimAge = time.Minute

type claim struct {
	Owner string    `json:"owner"`
	At    time.Time `json:"at"`
}

// errClaimed: another Service holds the address.
var errClaimed = errors.New("already allocated")

type claims struct {
	store store.Store
	log   *slog.Logger
}

func claimKey(kind, value string) string { return claimsPrefix + kind + "/" + value }

// take claims kind/value for owner ("namespace/name").
func (c *claims) take(ctx context.Context, kind, value, owner string) error {
	if c == nil {
		return nil
	}
	data, err := json.Marshal(claim{Owner: owner, At: time.Now()})
	if err != nil {
		return err
	}
	_, err = c.store.Create(ctx, claimKey(kind, value), data)
	if errors.Is(err, store.ErrExists) {
		return errClaimed
	}
	if err != nil {
		return fmt.Errorf("claim %s %s: %w", kind, value, err)
	}
	return nil
}

// free gives a claim up; a failure leaves it to the next repair.
func (c *claims) free(kind, value string) {
	if c == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, _, err := c.store.Delete(ctx, claimKey(kind, value), 0); err != nil && !errors.Is(err, store.ErrNotFound) {
		c.log.Warn("a Service's address stays claimed until a server's next start", "kind", kind, "value", value, "err", err)
	}
}

// repair claims what the stored Services hold and removes old claims
// none holds (a server that died between claiming and storing).
func (c *claims) repair(ctx context.Context, held map[string]string) error {
	if c == nil {
		return nil
	}
	for key, owner := range held {
		kind, value, _ := strings.Cut(strings.TrimPrefix(key, claimsPrefix), "/")
		if err := c.take(ctx, kind, value, owner); err != nil && !errors.Is(err, errClaimed) {
			return err
		}
	}
	res, err := c.store.List(ctx, claimsPrefix, store.ListOptions{})
	if err != nil {
		return err
	}
	for _, kv := range res.KVs {
		var cl claim
		if _, ok := held[kv.Key]; ok || json.Unmarshal(kv.Value, &cl) == nil && time.Since(cl.At) < claimAge {
			continue
		}
		if _, _, err := c.store.Delete(ctx, kv.Key, kv.ModRevision); err != nil && !errors.Is(err, store.ErrNotFound) && !errors.Is(err, store.ErrConflict) {
			return err
		}
	}
	return nil
}
