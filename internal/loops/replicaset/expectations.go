package replicaset

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

// expectationsTimeout bounds how long a sync waits for creates and
// deletes it made to be observed, in case a watch event was lost.
const expectationsTimeout = 5 * time.Minute

// expectations count, per ReplicaSet, the pod creates and deletes issued
// but not yet seen by the informer. Until they are seen, the set's pods in
// the cache are out of date, and acting on them would create or delete
// twice (Kubernetes' ControllerExpectations).
type expectations struct {
	mu    sync.Mutex
	set   map[string]*pending
	clock clock.PassiveClock
}

type pending struct {
	adds int
	// deletes are by pod UID: a graceful deletion is seen twice (marked,
	// then gone) and must count once.
	deletes map[types.UID]bool
	since   time.Time
}

func newExpectations(clk clock.PassiveClock) *expectations {
	return &expectations{set: map[string]*pending{}, clock: clk}
}

func (e *expectations) expect(key string, adds int, deletes []types.UID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	p := &pending{adds: adds, deletes: map[types.UID]bool{}, since: e.clock.Now()}
	for _, uid := range deletes {
		p.deletes[uid] = true
	}
	e.set[key] = p
}

func (e *expectations) created(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if p := e.set[key]; p != nil && p.adds > 0 {
		p.adds--
	}
}

func (e *expectations) deleted(key string, uid types.UID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if p := e.set[key]; p != nil {
		delete(p.deletes, uid)
	}
}

func (e *expectations) forget(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.set, key)
}

// satisfied reports whether everything issued for key has been seen.
func (e *expectations) satisfied(key string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	p := e.set[key]
	return p == nil || p.adds <= 0 && len(p.deletes) == 0 || e.clock.Since(p.since) > expectationsTimeout
}
