package registry

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api/resources/builtin"
	"github.com/orch-dev/orch/internal/store"
	"github.com/orch-dev/orch/internal/store/boltstore"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

// pair is one resource served twice over one store: straight from the
// store, and through a watch cache.
type pair struct {
	direct, cached *Storage
}

func newPair(t *testing.T, plural string) (pair, context.Context) {
	t.Helper()
	st, err := boltstore.Open(t.TempDir(), boltstore.Options{CompactInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		_ = st.Close()
	})
	for _, r := range builtin.Resources() {
		if r.Group == "" && r.Plural == plural {
			p := pair{direct: New(st, r), cached: New(st, r)}
			p.cached.EnableCache(ctx, slog.New(slog.NewTextHandler(io.Discard, nil)))
			return p, ctx
		}
	}
	t.Fatalf("no %s", plural)
	return pair{}, nil
}

// setHistory sets how many changes the cache keeps for resuming watches.
func (p pair) setHistory(n int) {
	c := p.cached.watchCache()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.historySize = n
}

// waitReady starts the cache and waits until it serves.
func (p pair) waitReady(ctx context.Context, t *testing.T) {
	t.Helper()
	c := p.cached.watchCache()
	deadline := time.Now().Add(10 * time.Second)
	for !c.waitFor(ctx, 0) {
		if time.Now().After(deadline) {
			t.Fatal("the watch cache never became ready")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func names(t *testing.T, list runtime.Object) []string {
	t.Helper()
	items, err := meta.ExtractList(list)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, len(items))
	for i, item := range items {
		m, _ := meta.Accessor(item)
		out[i] = m.GetNamespace() + "/" + m.GetName() + "@" + m.GetResourceVersion() + fmt.Sprint(m.GetLabels())
	}
	return out
}

// TestCacheAnswersAsTheStore drives random writes and, after each batch,
// compares LISTs served by the cache with LISTs read from the store, over
// namespaces and label and field selectors; then compares what watches
// started along the way saw.
func TestCacheAnswersAsTheStore(t *testing.T) {
	// A short history, so that a watch from an old version goes to the
	// store, and must still see what the store's watch sees.
	p, ctx := newPair(t, "configmaps")
	p.setHistory(100)
	p.waitReady(ctx, t)
	rng := rand.New(rand.NewPCG(1, 2))
	namespaces := []string{"a", "b", "c"}
	queries := []struct {
		namespace string
		opts      metav1.ListOptions
	}{
		{"", metav1.ListOptions{}},
		{"a", metav1.ListOptions{}},
		{"", metav1.ListOptions{LabelSelector: "tier=web"}},
		{"b", metav1.ListOptions{LabelSelector: "tier!=web,tier"}},
		{"", metav1.ListOptions{FieldSelector: "metadata.name=cm-3"}},
		{"c", metav1.ListOptions{FieldSelector: "metadata.namespace=c", LabelSelector: "tier in (db,web)"}},
	}
	type watched struct {
		direct, cached <-chan watch.Event
		name           string
	}
	var watches []watched
	startWatches := func(rv string) {
		for i, q := range queries {
			opts := q.opts
			opts.ResourceVersion = rv
			d, err := p.direct.Watch(ctx, q.namespace, &opts, 0)
			if err != nil {
				t.Fatal(err)
			}
			c, err := p.cached.Watch(ctx, q.namespace, &opts, 0)
			if err != nil {
				t.Fatal(err)
			}
			watches = append(watches, watched{d, c, fmt.Sprintf("query %d from %q", i, rv)})
		}
	}
	startWatches("")
	var lastRV string
	for batch := 0; batch < 20; batch++ {
		if batch == 10 {
			startWatches(lastRV)
			startWatches("2")
		}
		for op := 0; op < 25; op++ {
			ns, name := namespaces[rng.IntN(3)], "cm-"+strconv.Itoa(rng.IntN(8))
			tier := []string{"web", "db", ""}[rng.IntN(3)]
			switch rng.IntN(4) {
			case 0:
				_, _ = p.direct.Delete(ctx, ns, name, &metav1.DeleteOptions{}, WriteOptions{})
			default:
				labels := map[string]string{}
				if tier != "" {
					labels["tier"] = tier
				}
				if _, err := p.direct.Get(ctx, ns, name); err != nil {
					cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels}}
					if _, err := p.direct.Create(ctx, cm, WriteOptions{}); err != nil {
						t.Fatal(err)
					}
					continue
				}
				_, _, err := p.direct.Update(ctx, ns, name, func(ctx context.Context, current runtime.Object) (runtime.Object, error) {
					cm := current.(*corev1.ConfigMap).DeepCopy()
					cm.Labels = labels
					cm.Data = map[string]string{"n": strconv.Itoa(op)}
					return cm, nil
				}, UpdateOptions{})
				if err != nil {
					t.Fatal(err)
				}
			}
		}
		for _, q := range queries {
			opts := q.opts
			want, err := p.direct.List(ctx, q.namespace, &opts)
			if err != nil {
				t.Fatal(err)
			}
			got, err := p.cached.List(ctx, q.namespace, &opts)
			if err != nil {
				t.Fatal(err)
			}
			if w, g := names(t, want), names(t, got); !slices.Equal(w, g) {
				t.Fatalf("batch %d, LIST %s %+v:\nstore %v\ncache %v", batch, q.namespace, q.opts, w, g)
			}
			lm, _ := meta.ListAccessor(got)
			lastRV = lm.GetResourceVersion()
		}
	}
	for _, w := range watches {
		want, got := drain(t, w.direct), drain(t, w.cached)
		if !slices.Equal(want, got) {
			t.Fatalf("%s:\nstore %d events %v\ncache %d events %v", w.name, len(want), want, len(got), got)
		}
	}
}

// drain reads a watch until it is quiet, and names its events.
func drain(t *testing.T, ch <-chan watch.Event) []string {
	t.Helper()
	return eventNames(t, drainEvents(ch))
}

// eventNames names events by type, object and version.
func eventNames(t *testing.T, events []watch.Event) []string {
	t.Helper()
	var out []string
	for _, ev := range events {
		m, err := meta.Accessor(ev.Object)
		if err != nil {
			t.Fatalf("%s event of %T", ev.Type, ev.Object)
		}
		out = append(out, string(ev.Type)+" "+m.GetNamespace()+"/"+m.GetName()+"@"+m.GetResourceVersion())
	}
	return out
}

// drainEvents reads a watch until it is quiet.
func drainEvents(ch <-chan watch.Event) []watch.Event {
	var out []watch.Event
	for {
		select {
		case ev := <-ch:
			out = append(out, ev)
		case <-time.After(300 * time.Millisecond):
			return out
		}
	}
}

// TestSlowWatcherIsCutOff: a watcher that stops reading is ended once it
// falls maxQueued changes behind, and the others go on.
func TestSlowWatcherIsCutOff(t *testing.T) {
	defer func(n int) { maxQueued = n }(maxQueued)
	maxQueued = 20
	p, ctx := newPair(t, "configmaps")
	p.waitReady(ctx, t)
	slow, err := p.cached.Watch(ctx, "", &metav1.ListOptions{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	fast, err := p.cached.Watch(ctx, "", &metav1.ListOptions{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	seen := make(chan int)
	go func() {
		n := 0
		for range fast {
			if n++; n == 100 {
				seen <- n
			}
		}
	}()
	for i := 0; i < 100; i++ {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm-" + strconv.Itoa(i), Namespace: "a"}}
		if _, err := p.direct.Create(ctx, cm, WriteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-seen:
	case <-time.After(10 * time.Second):
		t.Fatal("the reading watcher did not see all 100 creates")
	}
	// The slow one got at most what was queued before it was cut off.
	n := 0
	for open := true; open; {
		select {
		case _, open = <-slow:
			if open {
				n++
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the slow watcher was never cut off")
		}
	}
	if n > maxQueued+16 {
		t.Fatalf("the slow watcher got %d events after falling %d behind", n, maxQueued)
	}
}

// TestResumedWatchIsNotSilent: a watch resumed from any resourceVersion of
// the cache's window gets every change since at once, with no later write
// to wake it (client-go's reflectors resume so after every dropped
// connection); one from before the store's compacted history gets 410
// Expired, which makes a reflector list again, as on Kubernetes.
func TestResumedWatchIsNotSilent(t *testing.T) {
	p, ctx := newPair(t, "configmaps")
	p.waitReady(ctx, t)
	var rvs []string
	for i := 0; i < 10; i++ {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm-" + strconv.Itoa(i), Namespace: "a"}}
		obj, err := p.direct.Create(ctx, cm, WriteOptions{})
		if err != nil {
			t.Fatal(err)
		}
		m, _ := meta.Accessor(obj)
		rvs = append(rvs, m.GetResourceVersion())
	}
	// The cache has seen the last write before any watch starts.
	last, _ := strconv.ParseInt(rvs[len(rvs)-1], 10, 64)
	if !p.cached.watchCache().waitFor(ctx, last) {
		t.Fatal("the cache did not catch up")
	}
	for i, rv := range rvs {
		wctx, cancel := context.WithCancel(ctx)
		ch, err := p.cached.Watch(wctx, "", &metav1.ListOptions{ResourceVersion: rv}, 0)
		if err != nil {
			t.Fatal(err)
		}
		want := len(rvs) - 1 - i
		deadline := time.After(100 * time.Millisecond)
		for got := 0; got < want; got++ {
			select {
			case ev := <-ch:
				m, _ := meta.Accessor(ev.Object)
				if ev.Type != watch.Added || m.GetResourceVersion() != rvs[i+1+got] {
					t.Fatalf("from %s, event %d: %s at %s, want ADDED at %s", rv, got, ev.Type, m.GetResourceVersion(), rvs[i+1+got])
				}
			case <-deadline:
				t.Fatalf("from %s: %d of %d events within 100 ms", rv, got, want)
			}
		}
		cancel()
	}

	if err := p.direct.store.Compact(ctx, last); err != nil {
		t.Fatal(err)
	}
	// The cache's window is bigger than the store's compacted history here:
	// a short window sends the oldest versions to the store.
	p.setHistory(2)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "after", Namespace: "a"}}
	var after int64
	for i := 0; i < 3; i++ {
		cm.Name = "after-" + strconv.Itoa(i)
		obj, err := p.direct.Create(ctx, cm.DeepCopy(), WriteOptions{})
		if err != nil {
			t.Fatal(err)
		}
		m, _ := meta.Accessor(obj)
		after, _ = strconv.ParseInt(m.GetResourceVersion(), 10, 64)
	}
	// Once the cache has applied them its window no longer reaches rvs[0]
	// (before, it would still serve the old changes from its history).
	if !p.cached.watchCache().waitFor(ctx, after) {
		t.Fatal("the cache did not catch up")
	}
	ch, err := p.cached.Watch(ctx, "", &metav1.ListOptions{ResourceVersion: rvs[0]}, 0)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-ch:
		st, ok := ev.Object.(*metav1.Status)
		if ev.Type != watch.Error || !ok || st.Code != 410 || st.Reason != metav1.StatusReasonExpired {
			t.Fatalf("from a compacted version: %s %+v, want ERROR 410 Expired", ev.Type, ev.Object)
		}
	case <-time.After(time.Second):
		t.Fatal("no answer to a watch from a compacted version")
	}
}

// countingStore counts the reads that reach the store.
type countingStore struct {
	store.Store
	gets, watches atomic.Int32
	// listGate, when set, holds every List until it is closed.
	listGate chan struct{}
}

func (s *countingStore) Watch(ctx context.Context, prefix string, rev int64) (store.Watcher, error) {
	s.watches.Add(1)
	return s.Store.Watch(ctx, prefix, rev)
}

func (s *countingStore) List(ctx context.Context, prefix string, opts store.ListOptions) (store.ListResult, error) {
	if s.listGate != nil {
		<-s.listGate
	}
	return s.Store.List(ctx, prefix, opts)
}

func (s *countingStore) Get(ctx context.Context, key string) (store.KeyValue, error) {
	s.gets.Add(1)
	return s.Store.Get(ctx, key)
}

// countedConfigMaps is a cached ConfigMap storage on a bbolt store whose
// reads and watches are counted (and lists held until listGate closes,
// when given).
func countedConfigMaps(t *testing.T, listGate chan struct{}) (context.Context, *countingStore, *Storage) {
	st, err := boltstore.Open(t.TempDir(), boltstore.Options{CompactInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); _ = st.Close() })
	counted := &countingStore{Store: st, listGate: listGate}
	var s *Storage
	for _, r := range builtin.Resources() {
		if r.Group == "" && r.Plural == "configmaps" {
			s = New(counted, r)
		}
	}
	s.EnableCache(ctx, slog.New(slog.NewTextHandler(io.Discard, nil)))
	return ctx, counted, s
}

// TestCachedReads: the reads of the built-in admission (WithCachedReads)
// are served by the watch cache once it has every write this server made
// to the resource, as Kubernetes' admission reads its informers, without
// reading the store; the caller gets a copy of its own. An object the
// cache does not have is read from the store (Kubernetes' live lookup), so
// one written by another server a moment ago is found too. Without the
// mark, a GET reads the store.
func TestCachedReads(t *testing.T) {
	ctx, counted, s := countedConfigMaps(t, nil)
	p := pair{direct: s, cached: s}
	p.waitReady(ctx, t)
	cached := WithCachedReads(ctx)

	for i := range 20 {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%d", i), Namespace: "a"}, Data: map[string]string{"v": "1"}}
		if _, err := s.Create(ctx, cm, WriteOptions{}); err != nil {
			t.Fatal(err)
		}
		before := counted.gets.Load()
		got, err := s.Get(cached, "a", cm.Name)
		if err != nil {
			t.Fatalf("%s just written: %v", cm.Name, err)
		}
		got.(*corev1.ConfigMap).Data["v"] = "changed by the caller"
		again, err := s.Get(cached, "a", cm.Name)
		if err != nil || again.(*corev1.ConfigMap).Data["v"] != "1" {
			t.Fatalf("after a caller changed its copy: %v %v", again, err)
		}
		if n := counted.gets.Load() - before; n != 0 {
			t.Fatalf("%d reads reached the store", n)
		}
		list, err := s.List(cached, "a", &metav1.ListOptions{})
		if err != nil || len(list.(*corev1.ConfigMapList).Items) != i+1 {
			t.Fatalf("a cached list after %d writes: %v, %v", i+1, list, err)
		}
	}
	before := counted.gets.Load()
	if _, err := s.Get(cached, "a", "never-written"); !apierrors.IsNotFound(err) || counted.gets.Load() != before+1 {
		t.Fatalf("an object never written: %v after %d store reads, want NotFound after one", err, counted.gets.Load()-before)
	}
	// Written past this Storage, as by another server.
	if _, err := counted.Create(ctx, s.key("a", "elsewhere"), []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"elsewhere","namespace":"a"}}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(cached, "a", "elsewhere"); err != nil {
		t.Fatalf("an object another server wrote a moment ago: %v", err)
	}
	before = counted.gets.Load()
	if _, err := s.Get(ctx, "a", "cm-0"); err != nil || counted.gets.Load() != before+1 {
		t.Fatalf("a GET without the mark: %v, %d store reads", err, counted.gets.Load()-before)
	}
}

// TestWatchWaitsForTheCache: a watch made while the cache is still listing
// (the server's own followers, as it starts) waits for it and is served
// by it, as Kubernetes' watches wait for its cacher, instead of holding a
// store watch of its own, decoding every change again, for as long as it
// lasts.
func TestWatchWaitsForTheCache(t *testing.T) {
	ctx, counted, s := countedConfigMaps(t, make(chan struct{}))
	type watched struct {
		events <-chan watch.Event
		err    error
	}
	got := make(chan watched, 1)
	go func() {
		events, err := s.Watch(ctx, "", &metav1.ListOptions{}, 0)
		got <- watched{events, err}
	}()
	time.Sleep(100 * time.Millisecond) // the watch waits on the listing cache
	close(counted.listGate)
	w := <-got
	if w.err != nil {
		t.Fatal(w.err)
	}
	if n := counted.watches.Load(); n != 1 {
		t.Fatalf("%d store watches, want the cache's only", n)
	}
	if _, err := s.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "a"}}, WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-w.events:
		if ev.Type != watch.Added {
			t.Fatalf("got %s, want ADDED", ev.Type)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no event through the cache's watch")
	}
}

// TestCacheKeepsObjectsEncoded: the objects whose change has left the
// history are kept encoded, in protobuf or as stored, and what the cache
// answers from them is what the store answers, whole (not only names),
// for LISTs with label and field selectors (a field that needs the object
// decoded: spec.nodeName, as kubelets select their pods), GETs and
// watches that start with the current objects.
func TestCacheKeepsObjectsEncoded(t *testing.T) {
	for _, proto := range []bool{true, false} {
		t.Run(fmt.Sprintf("protobuf=%t", proto), func(t *testing.T) {
			cacheProtobuf = proto
			t.Cleanup(func() { cacheProtobuf = true })
			p, ctx := newPair(t, "pods")
			p.setHistory(4)
			p.waitReady(ctx, t)
			if got := p.cached.cacheProto; got != proto {
				t.Fatalf("pods kept in protobuf: %t, want %t", got, proto)
			}
			for i := range 20 {
				pod := &corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%02d", i), Namespace: []string{"a", "b"}[i%2],
						Labels: map[string]string{"app": []string{"web", "db"}[i%3%2], "n": strconv.Itoa(i)}},
					Spec: corev1.PodSpec{NodeName: fmt.Sprintf("node-%d", i%3), Containers: []corev1.Container{{Name: "c", Image: "busybox",
						Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}}}}},
				}
				if _, err := p.direct.Create(ctx, pod, WriteOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			// A LIST served by the cache waits for it to have every write.
			if _, err := p.cached.List(ctx, "", &metav1.ListOptions{}); err != nil {
				t.Fatal(err)
			}
			c := p.cached.watchCache()
			c.mu.RLock()
			decoded := 0
			for _, co := range c.objects {
				switch {
				case co.obj == nil && len(co.value) == 0:
					t.Errorf("%s is neither decoded nor encoded", co.key)
				case co.obj != nil && proto && co.value != nil:
					t.Errorf("%s is held decoded and in protobuf", co.key)
				case co.obj != nil:
					decoded++
				}
			}
			c.mu.RUnlock()
			if decoded > 4 {
				t.Fatalf("%d of 20 objects decoded in the cache, want at most the history's 4", decoded)
			}

			queries := []struct {
				namespace string
				opts      metav1.ListOptions
			}{
				{"", metav1.ListOptions{}},
				{"a", metav1.ListOptions{LabelSelector: "app=web"}},
				{"", metav1.ListOptions{FieldSelector: "spec.nodeName=node-1"}},
				{"b", metav1.ListOptions{FieldSelector: "spec.nodeName!=node-2,metadata.name!=p-01", LabelSelector: "app"}},
			}
			for _, q := range queries {
				want, err := p.direct.List(ctx, q.namespace, &q.opts)
				if err != nil {
					t.Fatal(err)
				}
				got, err := p.cached.List(ctx, q.namespace, &q.opts)
				if err != nil {
					t.Fatal(err)
				}
				wantItems, gotItems := want.(*corev1.PodList).Items, got.(*corev1.PodList).Items
				if len(wantItems) == 0 || !apiequality.Semantic.DeepEqual(wantItems, gotItems) {
					t.Fatalf("LIST %q %+v:\nstore %v\ncache %v", q.namespace, q.opts, names(t, want), names(t, got))
				}
				// A watch from now starts with the same objects, one by one.
				opts := q.opts
				events, err := p.cached.Watch(ctx, q.namespace, &opts, 0)
				if err != nil {
					t.Fatal(err)
				}
				for i, item := range wantItems {
					ev := <-events
					if ev.Type != watch.Added || !apiequality.Semantic.DeepEqual(ev.Object, &item) {
						t.Fatalf("watch %+v, event %d: %s %v, want ADDED %s", q.opts, i, ev.Type, ev.Object, item.Name)
					}
				}
			}

			for _, name := range []string{"p-00", "p-18"} { // encoded, and in the history
				want, err := p.direct.Get(ctx, "a", name)
				if err != nil {
					t.Fatal(err)
				}
				got, err := p.cached.Get(WithCachedReads(ctx), "a", name)
				if err != nil || !apiequality.Semantic.DeepEqual(want, got) {
					t.Fatalf("GET %s: %v %v, want %v", name, got, err, want)
				}
				got.(*corev1.Pod).Labels["app"] = "changed by the caller"
				if again, _ := p.cached.Get(WithCachedReads(ctx), "a", name); again.(*corev1.Pod).Labels["app"] == "changed by the caller" {
					t.Fatalf("GET %s: a caller's change reached the cache", name)
				}
			}
		})
	}
}

// TestSharedObjectsEncodeConcurrently: the object every watcher of a
// change is sent may be encoded by several of them at once (in protobuf
// and JSON, for different event types), which must only read it: a
// Quantity caches its string form when first asked (the race detector
// caught two watchers' encodings of a pod's emptyDir sizeLimit).
func TestSharedObjectsEncodeConcurrently(t *testing.T) {
	p, ctx := newPair(t, "pods")
	p.waitReady(ctx, t)
	var events []<-chan watch.Event
	for range 2 {
		w, err := p.cached.Watch(ctx, "a", &metav1.ListOptions{}, 0)
		if err != nil {
			t.Fatal(err)
		}
		events = append(events, w)
	}
	limit := resource.MustParse("64Mi")
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "a"}, Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "c", Image: "busybox"}},
		Volumes:    []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &limit}}}},
	}}
	if _, err := p.direct.Create(ctx, pod, WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	var got []*corev1.Pod
	for _, w := range events {
		ev := <-w
		got = append(got, ev.Object.(*corev1.Pod))
	}
	if got[0] != got[1] {
		t.Fatal("the watchers were not sent the same object")
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if _, err := got[0].Marshal(); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
}

// TestOldHistoryKeptEncoded: of a resource's recent changes only the
// newest decodedHistory keep their versions decoded (a lease renewed every
// few seconds would hold a thousand decoded copies of itself); a watch
// resuming from before them is still sent every change as the store's
// watch sends it, with a label selector's ADDED and DELETED.
func TestOldHistoryKeptEncoded(t *testing.T) {
	p, ctx := newPair(t, "configmaps")
	p.waitReady(ctx, t)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "renewed", Namespace: "a", Labels: map[string]string{"on": "yes"}}}
	created, err := p.direct.Create(ctx, cm, WriteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	from := created.(*corev1.ConfigMap).ResourceVersion
	const changes = 3 * decodedHistory
	for i := range changes {
		_, _, err := p.direct.Update(ctx, "a", "renewed", func(ctx context.Context, current runtime.Object) (runtime.Object, error) {
			cm := current.(*corev1.ConfigMap).DeepCopy()
			cm.Data = map[string]string{"n": strconv.Itoa(i)}
			cm.Labels = map[string]string{"on": []string{"yes", "no"}[i/10%2]}
			return cm, nil
		}, UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.cached.List(ctx, "", &metav1.ListOptions{}); err != nil { // waits for the cache to have them
		t.Fatal(err)
	}
	c := p.cached.watchCache()
	c.mu.RLock()
	decoded := 0
	for _, e := range c.history {
		if e.obj.obj != nil || e.prev != nil && e.prev.obj != nil {
			decoded++
		}
	}
	// A version is encoded once: as one change's object and as the next
	// change's previous version.
	for i := 1; i < len(c.history)-decodedHistory; i++ {
		if c.history[i].prev != c.history[i-1].obj {
			t.Errorf("change %d's previous version is not change %d's, encoded once", i, i-1)
			break
		}
	}
	historyLen := len(c.history)
	c.mu.RUnlock()
	if historyLen != changes+1 || decoded != decodedHistory {
		t.Fatalf("history of %d changes, %d with decoded versions: want %d, %d", historyLen, decoded, changes+1, decodedHistory)
	}
	for _, selector := range []string{"", "on=yes"} {
		opts := metav1.ListOptions{ResourceVersion: from, LabelSelector: selector}
		direct, err := p.direct.Watch(ctx, "", &opts, 0)
		if err != nil {
			t.Fatal(err)
		}
		cached, err := p.cached.Watch(ctx, "", &opts, 0)
		if err != nil {
			t.Fatal(err)
		}
		wantEvents, gotEvents := drainEvents(direct), drainEvents(cached)
		for i := range min(len(wantEvents), len(gotEvents)) {
			// The versions decoded again are the stored ones, data and all.
			if w, g := wantEvents[i], gotEvents[i]; w.Type != g.Type || !apiequality.Semantic.DeepEqual(w.Object, g.Object) {
				t.Fatalf("watch from %s, selector %q, event %d: store %s %v, cache %s %v", from, selector, i, w.Type, w.Object, g.Type, g.Object)
			}
		}
		want, got := eventNames(t, wantEvents), eventNames(t, gotEvents)
		if len(want) < changes/2 || !slices.Equal(want, got) {
			t.Fatalf("watch from %s, selector %q:\nstore %d events %v\ncache %d events %v", from, selector, len(want), want, len(got), got)
		}
	}
}
