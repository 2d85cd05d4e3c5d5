package apibench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"k8s.io/client-go/rest"

	"github.com/orch-dev/orch/internal/api"
	"github.com/orch-dev/orch/internal/api/apitest"
	"github.com/orch-dev/orch/internal/api/etcdmember"
	"github.com/orch-dev/orch/internal/porttest"
	"github.com/orch-dev/orch/internal/store/etcdstore/etcdtest"
)

// BenchmarkAPICreateByStore: pods created by 64 clients as fast as they
// go, through a server on orch's own store (bbolt), through one on an
// etcd (--datastore-endpoint: one member in this process, over loopback
// gRPC, fsync on every write as both do), and through the first of three
// servers running their own etcd (--cluster-init, --server: three members
// on loopback, each write committed by two of them), same run. Target
// (issue 38): on etcd at least 50 % of the creates/s on orch's store.
func BenchmarkAPICreateByStore(b *testing.B) {
	const clients, total = 64, 3000
	for _, datastore := range []string{"orch", "etcd", "embedded3"} {
		b.Run(fmt.Sprintf("store=%s", datastore), func(b *testing.B) {
			for range b.N {
				var admin *rest.Config
				switch datastore {
				case "embedded3":
					admin = threeEmbeddedServers(b)
				default:
					admin = apitest.StartWith(b, func(c *api.Config) {
						if datastore == "etcd" {
							c.Datastore = api.Datastore{Endpoint: etcdtest.Start(b, etcdtest.Options{}).Endpoint}
						}
					}).Admin
				}
				cfg := rest.CopyConfig(admin)
				cfg.ContentType = "application/vnd.kubernetes.protobuf"
				perSec, lat := createPods(b, clientsFor(b, cfg, clients), "pod", total, 0)
				b.ReportMetric(perSec, "creates/s")
				reportLatency(b, lat)
			}
		})
	}
}

// threeEmbeddedServers starts three API servers, each an etcd member,
// and returns the first's admin configuration once all three vote.
func threeEmbeddedServers(b *testing.B) *rest.Config {
	var dir string
	var firstClient int
	member := func(join, token string) func(*api.Config) {
		client, peer := porttest.Free(b), porttest.Free(b)
		return func(c *api.Config) {
			if dir == "" {
				dir, firstClient = c.DataDir, client
			}
			c.AdvertiseAddress = "127.0.0.1"
			c.Embedded = &api.Embedded{Join: join, ServerToken: token, ClientPort: client, PeerPort: peer, EtcdLogLevel: "panic"}
		}
	}
	first := apitest.StartWith(b, member("", ""))
	raw, err := os.ReadFile(filepath.Join(dir, "server", "server-token"))
	if err != nil {
		b.Fatal(err)
	}
	token := strings.TrimSpace(string(raw))
	apitest.StartWith(b, member(first.URL(), token))
	apitest.StartWith(b, member(first.URL(), token))

	certs, err := etcdmember.LoadCertificates(filepath.Join(dir, "server", "tls", "etcd"), false)
	if err != nil {
		b.Fatal(err)
	}
	tlsCfg, err := certs.ClientTLS()
	if err != nil {
		b.Fatal(err)
	}
	endpoint := "https://127.0.0.1:" + fmt.Sprint(firstClient)
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(), TLS: tlsCfg})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	waitThreeVoters(b, c)
	return first.Admin
}

// waitThreeVoters waits for the cluster to have three voting members.
func waitThreeVoters(b *testing.B, c *clientv3.Client) {
	b.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		voters, learners, err := etcdmember.CountMembers(ctx, c)
		cancel()
		if voters == 3 && learners == 0 {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("three voting members not within a minute: %d and %d learners (%v)", voters, learners, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
