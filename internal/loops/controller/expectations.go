package controller

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

// expectationsTimeout bounds how long a sync waits for creates and
// deletes it made to be observed, in case a watch event was lost.
const expectationsTimeout = 5 * time.Minute

// Expectations count, per owner (a ReplicaSet, a DaemonSet), the pod
// creates and deletes issued but not yet seen by the informer. Until they
// are seen, the owner's pods in the cache are out of date, and acting on
// them would create or delete twice (Kubernetes' ControllerExpectations).
type Expectations struct {
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

// NewExpectations keeps expectations on clk, which times them out.
func NewExpectations(clk clock.PassiveClock) *Expectations {
	return &Expectations{set: map[string]*pending{}, clock: clk}
}

// Expect replaces key's expectations: adds creates and the deletes of
// these pods, about to be issued.
func (e *Expectations) Expect(key string, adds int, deletes []types.UID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	p := &pending{adds: adds, deletes: map[types.UID]bool{}, since: e.clock.Now()}
	for _, uid := range deletes {
		p.deletes[uid] = true
	}
	e.set[key] = p
}

// Created records a create of key's seen (or given up).
func (e *Expectations) Created(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if p := e.set[key]; p != nil && p.adds > 0 {
		p.adds--
	}
}

// Deleted records a delete of key's pod seen (or given up).
func (e *Expectations) Deleted(key string, uid types.UID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if p := e.set[key]; p != nil {
		delete(p.deletes, uid)
	}
}

// Forget drops key's expectations (the owner is gone).
func (e *Expectations) Forget(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.set, key)
}

// Satisfied reports whether everything issued for key has been seen.
func (e *Expectations) Satisfied(key string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	p := e.set[key]
	return p == nil || p.adds <= 0 && len(p.deletes) == 0 || e.clock.Since(p.since) > expectationsTimeout
}

// Raise adds to key's expectations: a create (uid empty) or the delete of
// the pod uid, about to be issued.
func (e *Expectations) Raise(key string, uid types.UID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	p := e.set[key]
	if p == nil || e.clock.Since(p.since) > expectationsTimeout {
		p = &pending{deletes: map[types.UID]bool{}, since: e.clock.Now()}
		e.set[key] = p
	}
	if uid == "" {
		p.adds++
	} else {
		p.deletes[uid] = true
	}
}
