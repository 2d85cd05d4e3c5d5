package apibench

import (
	"fmt"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/orch-dev/orch/internal/api"
	"github.com/orch-dev/orch/internal/api/apitest"
	"github.com/orch-dev/orch/internal/store/etcdstore/etcdtest"
)

// BenchmarkAPICreateByStore: pods created by 64 clients as fast as they
// go, through a server on orch's own store (bbolt) and through one on an
// etcd (--datastore-endpoint: one member in this process, over loopback
// gRPC, fsync on every write as both do), same run. Target (issue 38): on
// etcd at least 50 % of the creates/s on orch's store.
func BenchmarkAPICreateByStore(b *testing.B) {
	const clients, total = 64, 3000
	for _, datastore := range []string{"orch", "etcd"} {
		b.Run(fmt.Sprintf("store=%s", datastore), func(b *testing.B) {
			for range b.N {
				cfg := rest.CopyConfig(apitest.StartWith(b, func(c *api.Config) {
					if datastore == "etcd" {
						c.Datastore = api.Datastore{Endpoint: etcdtest.Start(b, etcdtest.Options{}).Endpoint}
					}
				}).Admin)
				cfg.ContentType = "application/vnd.kubernetes.protobuf"
				perSec, lat := createPods(b, clientsFor(b, cfg, clients), "pod", total, 0)
				b.ReportMetric(perSec, "creates/s")
				reportLatency(b, lat)
			}
		})
	}
}
