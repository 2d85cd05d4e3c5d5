package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/orch-dev/orch/internal/store"
	"github.com/orch-dev/orch/internal/upgradeapi"
)

// Servers sharing a datastore each hold a key there and list as the
// kubernetes Service's endpoints the servers whose keys are there:
// kube-apiserver's "lease" endpoint reconciler (its /masterleases/ keys).
// Pods, and the nodes' proxies, then reach whichever servers are up. The
// key is on an etcd lease the server keeps alive (keyHolder), which costs
// no disk write while nothing changes, and which etcd's leader ends
// apiServerTTL after the server stops renewing it, by its own clock alone:
// boards without a real-time clock may boot with their clocks far apart.
// Every apiServerResync each server lists the keys again.
const (
	apiServersPrefix = "/orch/apiservers/"
	apiServerResync  = 10 * time.Second
	apiServerTTL     = 25 * time.Second
)

// keyHolder is a store that keeps a key while this process holds it and
// deletes it a TTL after the process stops renewing it (etcdstore).
type keyHolder interface {
	HoldKey(ctx context.Context, key string, value []byte, ttl time.Duration) error
}

// listAPIServers sets the kubernetes endpoints to the servers whose keys
// are in the store, and this one while it serves (its key may not be
// written yet, or be written again after a lost lease).
func (s *Server) listAPIServers(ctx context.Context, serving bool) error {
	res, err := s.store.List(ctx, apiServersPrefix, store.ListOptions{})
	if err != nil {
		return err
	}
	var live []netip.Addr
	if serving {
		live = append(live, s.advertise)
	}
	for _, kv := range res.KVs {
		addr, err := netip.ParseAddr(strings.TrimPrefix(kv.Key, apiServersPrefix))
		if err == nil && !slices.Contains(live, addr) {
			live = append(live, addr)
		}
	}
	slices.SortFunc(live, netip.Addr.Compare)
	return s.kubernetesEndpoints(ctx, live)
}

// keepAPIServerListed holds this server's key until ctx ends, listing the
// servers every apiServerResync, then lets the key go and lists the
// others, so the Service stops sending to it at once.
func (s *Server) keepAPIServerListed(ctx context.Context) {
	holder, ok := s.store.(keyHolder)
	if !ok {
		s.log.Error("this datastore cannot hold keys: the kubernetes Service does not list this server")
		return
	}
	holding, letGo := context.WithCancel(context.Background())
	held := make(chan error, 1)
	go func() {
		held <- holder.HoldKey(holding, apiServersPrefix+s.advertise.String(), s.apiServerEntry(), apiServerTTL)
	}()
	t := time.NewTicker(apiServerResync)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			letGo()
			if err := <-held; err != nil {
				s.log.Warn("letting this server's key go", "err", err)
			}
			leave, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := s.listAPIServers(leave, false); err != nil {
				s.log.Warn("could not take this server out of the kubernetes Service; it goes when its time runs out", "err", err)
			}
			cancel()
			return
		case err := <-held:
			letGo()
			s.log.Error("this server's key in the datastore is not held: the kubernetes Service stops listing it", "err", err)
			<-ctx.Done()
			return
		case <-t.C:
			if err := s.listAPIServers(ctx, true); err != nil && ctx.Err() == nil {
				s.log.Warn("could not list the API servers for the kubernetes Service", "err", err)
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

// apiServerEntry is the value of this server's key: what the upgrade
// loop must know of a server that may have no Node. Servers before it
// wrote their address alone.
type apiServerEntry struct {
	Version string `json:"version"`
	Node    string `json:"node,omitempty"`
}

func (s *Server) apiServerEntry() []byte {
	b, _ := json.Marshal(apiServerEntry{Version: s.cfg.Version, Node: s.cfg.NodeName})
	return b
}

// Servers lists the API servers of the cluster, this one and those whose
// keys are in a shared datastore, with the orch each runs and its Node.
func (s *Server) Servers(ctx context.Context) ([]upgradeapi.Server, error) {
	self := upgradeapi.Server{Address: s.advertise.String(), Version: s.cfg.Version, Node: s.cfg.NodeName}
	if !s.sharedStore() {
		return []upgradeapi.Server{self}, nil
	}
	res, err := s.store.List(ctx, apiServersPrefix, store.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list the API servers' keys: %w", err)
	}
	out := []upgradeapi.Server{self}
	for _, kv := range res.KVs {
		addr := strings.TrimPrefix(kv.Key, apiServersPrefix)
		if addr == self.Address {
			continue
		}
		var e apiServerEntry
		_ = json.Unmarshal(kv.Value, &e) // an older server's address: no version
		out = append(out, upgradeapi.Server{Address: addr, Version: e.Version, Node: e.Node})
	}
	return out, nil
}
