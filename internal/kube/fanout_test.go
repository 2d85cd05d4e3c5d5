package kube

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	fcache "k8s.io/client-go/tools/cache/testing"
)

// eventLog keeps the events a handler saw, in order.
type eventLog struct {
	mu     sync.Mutex
	events []string
}

func (r *eventLog) add(e string) { r.mu.Lock(); r.events = append(r.events, e); r.mu.Unlock() }
func (r *eventLog) seen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.events...)
}

func (r *eventLog) handler() cache.ResourceEventHandler {
	name := func(obj any) string {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		return obj.(*corev1.Pod).Name
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.add("add " + name(obj)) },
		UpdateFunc: func(_, obj any) { r.add("update " + name(obj)) },
		DeleteFunc: func(obj any) { r.add("delete " + name(obj)) },
	}
}

func pod(name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func equal(a, b []string) bool { return fmt.Sprint(a) == fmt.Sprint(b) }

// Handlers added before the informer starts share its one listener; each
// sees every event in order, as with a listener of its own, and a
// handler added once it runs is still replayed the cache (client-go's
// contract for late handlers).
func TestFanOutDeliversToEveryHandler(t *testing.T) {
	source := fcache.NewFakeControllerSource()
	source.Add(pod("a"))
	inf := newFanOut(cache.NewSharedIndexInformer(source, &corev1.Pod{}, 0, cache.Indexers{}), 0)

	var early [3]eventLog
	var regs []cache.ResourceEventHandlerRegistration
	for i := range early {
		reg, err := inf.AddEventHandler(early[i].handler())
		if err != nil {
			t.Fatal(err)
		}
		regs = append(regs, reg)
	}
	removed := &eventLog{}
	reg, err := inf.AddEventHandler(removed.handler())
	if err != nil {
		t.Fatal(err)
	}
	if err := inf.RemoveEventHandler(reg); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	inf.start()
	go inf.RunWithContext(ctx)
	for i, reg := range regs {
		waitFor(t, fmt.Sprintf("handler %d synced", i), reg.HasSynced)
	}
	// Synced means the initial list reached the handler.
	for i := range early {
		if got := early[i].seen(); !equal(got, []string{"add a"}) {
			t.Errorf("handler %d saw %v at sync, want [add a]", i, got)
		}
	}

	late := &eventLog{}
	lateReg, err := inf.AddEventHandler(late.handler())
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "late handler synced", lateReg.HasSynced)

	b := pod("b")
	source.Add(b)
	b = b.DeepCopy()
	b.Labels = map[string]string{"changed": "yes"}
	source.Modify(b)
	source.Delete(pod("a"))

	want := []string{"add a", "add b", "update b", "delete a"}
	for i := range early {
		waitFor(t, fmt.Sprintf("handler %d's events", i), func() bool { return len(early[i].seen()) == len(want) })
		if got := early[i].seen(); !equal(got, want) {
			t.Errorf("handler %d saw %v, want %v", i, got, want)
		}
	}
	waitFor(t, "late handler's events", func() bool { return len(late.seen()) == len(want) })
	if got := late.seen(); !equal(got, want) {
		t.Errorf("the handler added once running saw %v, want %v", got, want)
	}
	if got := removed.seen(); len(got) != 0 {
		t.Errorf("a removed handler saw %v", got)
	}
}

// What sharing is for: fifty handlers cost one listener's goroutines, not
// fifty listeners' (client-go runs two or three for each).
func TestFanOutSharesOneListener(t *testing.T) {
	source := fcache.NewFakeControllerSource()
	source.Add(pod("a"))
	inf := newFanOut(cache.NewSharedIndexInformer(source, &corev1.Pod{}, 0, cache.Indexers{}), 0)
	var regs []cache.ResourceEventHandlerRegistration
	for range 50 {
		reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{})
		if err != nil {
			t.Fatal(err)
		}
		regs = append(regs, reg)
	}
	before := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	inf.start()
	go inf.RunWithContext(ctx)
	for _, reg := range regs {
		waitFor(t, "synced", reg.HasSynced)
	}
	if grew := runtime.NumGoroutine() - before; grew > 20 {
		t.Errorf("running an informer with 50 handlers took %d goroutines, want one listener's few", grew)
	}
}

// A handler asking for a resync period other than the informer's keeps a
// listener of its own, which resyncs it on its period.
func TestFanOutOwnResyncPeriod(t *testing.T) {
	source := fcache.NewFakeControllerSource()
	source.Add(pod("a"))
	inf := newFanOut(cache.NewSharedIndexInformer(source, &corev1.Pod{}, time.Hour, cache.Indexers{}), time.Hour)
	shared := &eventLog{}
	if _, err := inf.AddEventHandler(shared.handler()); err != nil {
		t.Fatal(err)
	}
	resynced := &eventLog{}
	if _, err := inf.AddEventHandlerWithResyncPeriod(resynced.handler(), time.Second); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	inf.start()
	go inf.RunWithContext(ctx)
	waitFor(t, "a resync", func() bool { return len(resynced.seen()) >= 2 })
	if got := shared.seen(); !equal(got, []string{"add a"}) {
		t.Errorf("the handler without resync saw %v, want [add a]", got)
	}
}
