package storebench

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"

	"github.com/orch-dev/orch/internal/store"
	"github.com/orch-dev/orch/internal/store/boltstore"
)

// target is what the workloads need from a store.
type target interface {
	create(ctx context.Context, key string, value []byte) error
	list(ctx context.Context, prefix string) (int, error)
	// watch calls fn with each new value under prefix until ctx ends.
	watch(ctx context.Context, prefix string, fn func(value []byte)) (ready func(), err error)
	close()
}

type targetKind struct {
	name string
	open func(b *testing.B) target
}

var targets = []targetKind{
	{"orch", openOrch},
	{"etcd", openEtcd},
}

type orchTarget struct{ s *boltstore.Store }

func openOrch(b *testing.B) target {
	s, err := boltstore.Open(b.TempDir(), boltstore.Options{CompactInterval: -1})
	if err != nil {
		b.Fatal(err)
	}
	return orchTarget{s}
}

func (t orchTarget) create(ctx context.Context, key string, value []byte) error {
	_, err := t.s.Create(ctx, key, value)
	return err
}

func (t orchTarget) list(ctx context.Context, prefix string) (int, error) {
	res, err := t.s.List(ctx, prefix, store.ListOptions{})
	return len(res.KVs), err
}

func (t orchTarget) watch(ctx context.Context, prefix string, fn func([]byte)) (func(), error) {
	w, err := t.s.Watch(ctx, prefix, 0)
	if err != nil {
		return nil, err
	}
	go func() {
		for ev := range w.Events() {
			fn(ev.KV.Value)
		}
	}()
	return func() {}, nil
}

func (t orchTarget) close() { _ = t.s.Close() }

// etcdTarget is a single-node etcd embedded in the test process with its
// default durability (WAL fsync before acknowledging), reached through the
// in-process client so neither side pays for a network hop.
type etcdTarget struct {
	e *embed.Etcd
	c *clientv3.Client
}

func freeURL(b *testing.B) url.URL {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return url.URL{Scheme: "http", Host: l.Addr().String()}
}

func openEtcd(b *testing.B) target {
	cfg := embed.NewConfig()
	cfg.Dir = b.TempDir()
	cfg.LogLevel = "panic"
	client, peer := freeURL(b), freeURL(b)
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = fmt.Sprintf("%s=%s", cfg.Name, peer.String())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		b.Fatal(err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		b.Fatal("etcd did not start")
	}
	return etcdTarget{e: e, c: v3client.New(e.Server)}
}

func (t etcdTarget) create(ctx context.Context, key string, value []byte) error {
	resp, err := t.c.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(value))).
		Commit()
	if err == nil && !resp.Succeeded {
		err = fmt.Errorf("%s exists", key)
	}
	return err
}

func (t etcdTarget) list(ctx context.Context, prefix string) (int, error) {
	resp, err := t.c.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return 0, err
	}
	return len(resp.Kvs), nil
}

func (t etcdTarget) watch(ctx context.Context, prefix string, fn func([]byte)) (func(), error) {
	ch := t.c.Watch(clientv3.WithRequireLeader(ctx), prefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	created := <-ch
	if err := created.Err(); err != nil {
		return nil, err
	}
	go func() {
		for resp := range ch {
			for _, ev := range resp.Events {
				fn(ev.Kv.Value)
			}
		}
	}()
	return func() {}, nil
}

func (t etcdTarget) close() {
	_ = t.c.Close()
	t.e.Close()
}
