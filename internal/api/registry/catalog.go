package registry

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/orch-dev/orch/internal/api/resources"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Catalog is what the API serves: an immutable snapshot of storages,
// replaced whole when a resource is added or removed while the server
// runs (as CustomResourceDefinitions will), so a request routes on one
// consistent view without taking a lock.
type Catalog struct {
	mu  sync.Mutex // serialises changes
	cur atomic.Pointer[Served]
}

// Served is one snapshot of the catalog. Never change it: build another.
type Served struct {
	// Generation grows with every change, so views derived from a
	// snapshot (discovery, OpenAPI documents) know when to rebuild.
	Generation uint64
	// Storages in discovery order: the core group first, then the others
	// in the order they were added.
	Storages []*Storage
	byGVR    map[schema.GroupVersionResource]*Storage
}

// NewCatalog serves the given storages.
func NewCatalog(storages ...*Storage) (*Catalog, error) {
	c := &Catalog{}
	c.cur.Store(&Served{byGVR: map[schema.GroupVersionResource]*Storage{}})
	return c, c.Add(storages...)
}

// Load returns the current snapshot.
func (c *Catalog) Load() *Served { return c.cur.Load() }

// Add serves more storages; a resource already served is an error.
func (c *Catalog) Add(storages ...*Storage) error { return c.Replace(nil, storages...) }

// Remove stops serving the resources; one not served is ignored.
func (c *Catalog) Remove(gvrs ...schema.GroupVersionResource) {
	_ = c.Replace(gvrs)
}

// Replace stops serving the resources gone and serves the storages added,
// in one change: a request finds the old resource or the new one, never
// neither. An added resource still served is an error, and changes nothing.
func (c *Catalog) Replace(gone []schema.GroupVersionResource, add ...*Storage) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.cur.Load()
	next := &Served{Generation: old.Generation + 1, byGVR: map[schema.GroupVersionResource]*Storage{}}
	removed := map[schema.GroupVersionResource]bool{}
	for _, gvr := range gone {
		removed[gvr] = true
	}
	var stopped []*Storage
	for _, st := range old.Storages {
		if gvr := st.Resource.GroupVersionResource(); !removed[gvr] {
			next.byGVR[gvr] = st
			next.Storages = append(next.Storages, st)
		} else {
			stopped = append(stopped, st)
		}
	}
	for _, st := range add {
		gvr := st.Resource.GroupVersionResource()
		if next.byGVR[gvr] != nil {
			return fmt.Errorf("%s is already served", gvr)
		}
		next.byGVR[gvr] = st
		next.Storages = append(next.Storages, st)
	}
	sortCoreFirst(next.Storages)
	c.cur.Store(next)
	for _, st := range stopped {
		st.stop()
	}
	return nil
}

// Storage returns the storage serving gvr, or nil.
func (s *Served) Storage(gvr schema.GroupVersionResource) *Storage { return s.byGVR[gvr] }

// Resources returns the served resources' descriptions, in order.
func (s *Served) Resources() []*resources.Resource {
	out := make([]*resources.Resource, len(s.Storages))
	for i, st := range s.Storages {
		out[i] = st.Resource
	}
	return out
}

// sortCoreFirst keeps the core group first, as discovery lists it, and
// every other resource in the order it came.
func sortCoreFirst(storages []*Storage) {
	var core, rest []*Storage
	for _, st := range storages {
		if st.Resource.Group == "" {
			core = append(core, st)
		} else {
			rest = append(rest, st)
		}
	}
	copy(storages, append(core, rest...))
}

// Resources returns the current snapshot's generation and descriptions,
// for the views built from them (the OpenAPI documents).
func (c *Catalog) Resources() (uint64, []*resources.Resource) {
	s := c.Load()
	return s.Generation, s.Resources()
}
