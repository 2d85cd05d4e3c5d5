package api_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/orch-dev/orch/internal/api"
	"github.com/orch-dev/orch/internal/api/apitest"
	"github.com/orch-dev/orch/internal/store"
	"github.com/orch-dev/orch/internal/store/boltstore"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// countingStore is a backend other than the bundled one: any store.Store.
type countingStore struct {
	store.Store
	creates atomic.Int64
}

func (c *countingStore) Create(ctx context.Context, key string, value []byte) (store.KeyValue, error) {
	if strings.HasSuffix(key, "/through-the-contract") {
		// The server's own writes go on meanwhile (APIServices, ...).
		c.creates.Add(1)
	}
	return c.Store.Create(ctx, key, value)
}

// TestServerTakesAnyStore: the API server depends on the store.Store
// contract only, so another backend (etcd, for HA) drops in.
func TestServerTakesAnyStore(t *testing.T) {
	bolt, err := boltstore.Open(t.TempDir(), boltstore.Options{CompactInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	backend := &countingStore{Store: bolt}
	srv := apitest.StartWith(t, func(c *api.Config) { c.Store = backend })
	before := backend.creates.Load()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "through-the-contract"}}
	if _, err := srv.Client.CoreV1().ConfigMaps("default").Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if backend.creates.Load() != before+1 {
		t.Fatalf("the given store saw %d creates for one ConfigMap", backend.creates.Load()-before)
	}
}
