package kube

import (
	"sync"
	"time"

	"k8s.io/client-go/tools/cache"
)

// fanOut is a shared informer whose event handlers, added before it
// starts with the factory's resync period, share one client-go listener
// and are called one after another from it. client-go gives each handler
// a listener of its own — two goroutines and a 16 KiB ring buffer, so that
// a slow handler does not hold up the others — and a server's loops add
// about 170 handlers to 40 informers. Every loop's handler only puts a key
// on its work queue, so one listener per informer serves them all: it
// keeps each handler's events in order, as client-go does, and saves the
// rest (about 3 MB and 250 goroutines in a server with its agent).
//
// A handler added once the informer runs, or with a resync period or
// options of its own, gets a listener of its own as before: client-go
// replays the cache to it, which the shared listener cannot.
type fanOut struct {
	cache.SharedIndexInformer
	resync time.Duration

	mu       sync.Mutex
	started  bool
	shared   cache.ResourceEventHandlerRegistration
	handlers []*fannedHandler // copied on write: the listener calls them outside the lock
}

func newFanOut(inf cache.SharedIndexInformer, resync time.Duration) *fanOut {
	return &fanOut{SharedIndexInformer: inf, resync: resync}
}

// start marks the informer as running, and reports whether it was not
// yet: handlers added from now on get listeners of their own.
func (f *fanOut) start() (first bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	first, f.started = !f.started, true
	return first
}

// running reports whether the informer was started.
func (f *fanOut) running() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.started
}

func (f *fanOut) AddEventHandler(h cache.ResourceEventHandler) (cache.ResourceEventHandlerRegistration, error) {
	return f.AddEventHandlerWithResyncPeriod(h, f.resync)
}

func (f *fanOut) AddEventHandlerWithResyncPeriod(h cache.ResourceEventHandler, resync time.Duration) (cache.ResourceEventHandlerRegistration, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.started || resync != f.resync {
		return f.SharedIndexInformer.AddEventHandlerWithResyncPeriod(h, resync)
	}
	if f.shared == nil {
		reg, err := f.SharedIndexInformer.AddEventHandlerWithResyncPeriod(handlerFunc(f.each), f.resync)
		if err != nil {
			return nil, err
		}
		f.shared = reg
	}
	fh := &fannedHandler{ResourceEventHandlerRegistration: f.shared, handler: h}
	f.handlers = append(f.handlers[:len(f.handlers):len(f.handlers)], fh)
	return fh, nil
}

func (f *fanOut) AddEventHandlerWithOptions(h cache.ResourceEventHandler, opts cache.HandlerOptions) (cache.ResourceEventHandlerRegistration, error) {
	if opts.Logger == nil {
		resync := f.resync
		if opts.ResyncPeriod != nil {
			resync = *opts.ResyncPeriod
		}
		return f.AddEventHandlerWithResyncPeriod(h, resync)
	}
	return f.SharedIndexInformer.AddEventHandlerWithOptions(h, opts)
}

func (f *fanOut) RemoveEventHandler(reg cache.ResourceEventHandlerRegistration) error {
	fh, ok := reg.(*fannedHandler)
	if !ok {
		return f.SharedIndexInformer.RemoveEventHandler(reg)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	kept := make([]*fannedHandler, 0, len(f.handlers))
	for _, h := range f.handlers {
		if h != fh {
			kept = append(kept, h)
		}
	}
	f.handlers = kept
	return nil
}

// each calls every shared handler in the order they were added.
func (f *fanOut) each(call func(cache.ResourceEventHandler)) {
	f.mu.Lock()
	handlers := f.handlers
	f.mu.Unlock()
	for _, h := range handlers {
		call(h.handler)
	}
}

// handlerFunc is the one listener's handler: it hands each event to every
// shared handler.
type handlerFunc func(call func(cache.ResourceEventHandler))

func (each handlerFunc) OnAdd(obj any, initial bool) {
	each(func(h cache.ResourceEventHandler) { h.OnAdd(obj, initial) })
}

func (each handlerFunc) OnUpdate(old, obj any) {
	each(func(h cache.ResourceEventHandler) { h.OnUpdate(old, obj) })
}

func (each handlerFunc) OnDelete(obj any) {
	each(func(h cache.ResourceEventHandler) { h.OnDelete(obj) })
}

// fannedHandler is the registration of a handler on the shared listener:
// it has synced when that listener has delivered the initial list, which
// it delivers to every shared handler before it counts an event done.
type fannedHandler struct {
	cache.ResourceEventHandlerRegistration
	handler cache.ResourceEventHandler
}
