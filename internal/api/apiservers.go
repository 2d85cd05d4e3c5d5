package api

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/orch-dev/orch/internal/store"
)

// Servers sharing a datastore each hold a key there, renewed every
// apiServerRenew, and list as the kubernetes Service's endpoints those
// whose key changed within apiServerTTL: kube-apiserver's "lease" endpoint
// reconciler (its /masterleases/ keys). Pods, and the nodes' proxies, then
// reach whichever servers are up. A key's age is judged by the revision it
// was last seen at, by this server's own clock, as the leader election
// judges its Lease: boards without a real-time clock may boot with their
// clocks far apart.
const (
	apiServersPrefix = "/orch/apiservers/"
	apiServerRenew   = 10 * time.Second
	apiServerTTL     = 25 * time.Second
)

// apiServerSeen is when this server saw a key at its last revision.
type apiServerSeen struct {
	rev int64
	at  time.Time
}

// reconcileAPIServers renews this server's key (or, leaving, deletes it),
// forgets the keys not renewed for apiServerTTL and sets the kubernetes
// endpoints to the rest.
func (s *Server) reconcileAPIServers(ctx context.Context, alive bool) error {
	own := apiServersPrefix + s.advertise.String()
	if alive {
		// The value says nothing; each write is a new revision.
		value := []byte(time.Now().UTC().Format(time.RFC3339))
		if _, err := s.store.Update(ctx, own, value, 0); errors.Is(err, store.ErrNotFound) {
			_, err = s.store.Create(ctx, own, value)
			if err != nil {
				return err
			}
		} else if err != nil {
			return err
		}
	} else if _, _, err := s.store.Delete(ctx, own, 0); err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	res, err := s.store.List(ctx, apiServersPrefix, store.ListOptions{})
	if err != nil {
		return err
	}
	s.apiServersMu.Lock()
	defer s.apiServersMu.Unlock()
	seen := make(map[string]apiServerSeen, len(res.KVs))
	var live []netip.Addr
	for _, kv := range res.KVs {
		last, ok := s.apiServersSeen[kv.Key]
		if !ok || last.rev != kv.ModRevision {
			last = apiServerSeen{rev: kv.ModRevision, at: time.Now()}
		}
		addr, err := netip.ParseAddr(strings.TrimPrefix(kv.Key, apiServersPrefix))
		if err != nil || time.Since(last.at) > apiServerTTL {
			// Gone: delete it unless its server renewed it meanwhile.
			if _, _, err := s.store.Delete(ctx, kv.Key, kv.ModRevision); err != nil && !errors.Is(err, store.ErrNotFound) && !errors.Is(err, store.ErrConflict) {
				return err
			}
			continue
		}
		seen[kv.Key] = last
		live = append(live, addr)
	}
	s.apiServersSeen = seen
	slices.SortFunc(live, netip.Addr.Compare)
	return s.kubernetesEndpoints(ctx, live)
}

// keepAPIServerListed renews this server's key until ctx ends, then takes
// it out so the Service stops sending to it at once.
func (s *Server) keepAPIServerListed(ctx context.Context) {
	t := time.NewTicker(apiServerRenew)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			leave, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := s.reconcileAPIServers(leave, false); err != nil {
				s.log.Warn("could not take this server out of the kubernetes Service; it goes when its time runs out", "err", err)
			}
			cancel()
			return
		case <-t.C:
			if err := s.reconcileAPIServers(ctx, true); err != nil && ctx.Err() == nil {
				s.log.Warn("could not renew this server in the kubernetes Service", "err", err)
			}
		}
	}
}

// datastoreAnswers is /readyz's check of a shared datastore (kube-apiserver's
// readyz/etcd): a server cut off from it is not ready, so the nodes' load
// balancers send their clients to another. A quorum read, at most once a
// second however often it is asked.
func (s *Server) datastoreAnswers(ctx context.Context) error {
	if !s.sharedStore() {
		return nil
	}
	s.datastoreCheck.Lock()
	defer s.datastoreCheck.Unlock()
	if time.Since(s.datastoreCheckedAt) < time.Second {
		return s.datastoreErr
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, s.datastoreErr = s.store.Revision(ctx)
	s.datastoreCheckedAt = time.Now()
	return s.datastoreErr
}
