package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/orch-dev/orch/internal/store"
)

// Servers sharing a datastore each hold a key there that says until when
// they are alive, renewed every apiServerRenew, and list the live ones as
// the kubernetes Service's endpoints: kube-apiserver's "lease" endpoint
// reconciler (its /masterleases/ keys). Pods, and the nodes' proxies,
// then reach whichever servers are up.
const (
	apiServersPrefix = "/orch/apiservers/"
	apiServerRenew   = 10 * time.Second
	apiServerTTL     = 25 * time.Second
)

type apiServerLease struct {
	Expires time.Time `json:"expires"`
}

// reconcileAPIServers renews this server's key (or, leaving, deletes it),
// forgets the keys of servers whose time ran out and sets the kubernetes
// endpoints to the rest.
func (s *Server) reconcileAPIServers(ctx context.Context, alive bool) error {
	own := apiServersPrefix + s.advertise.String()
	if alive {
		value, err := json.Marshal(apiServerLease{Expires: time.Now().Add(apiServerTTL)})
		if err != nil {
			return err
		}
		if _, err := s.store.Update(ctx, own, value, 0); errors.Is(err, store.ErrNotFound) {
			_, err = s.store.Create(ctx, own, value)
			if errors.Is(err, store.ErrExists) {
				_, err = s.store.Update(ctx, own, value, 0)
			}
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
	var live []netip.Addr
	for _, kv := range res.KVs {
		var lease apiServerLease
		addr, err := netip.ParseAddr(strings.TrimPrefix(kv.Key, apiServersPrefix))
		if err == nil {
			err = json.Unmarshal(kv.Value, &lease)
		}
		if err != nil || time.Now().After(lease.Expires) {
			// Gone: delete it unless its server renewed it meanwhile.
			if _, _, err := s.store.Delete(ctx, kv.Key, kv.ModRevision); err != nil && !errors.Is(err, store.ErrNotFound) && !errors.Is(err, store.ErrConflict) {
				return err
			}
			continue
		}
		live = append(live, addr)
	}
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
	if s.cfg.Datastore.Endpoint == "" {
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
