package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"
	"unique"

	"github.com/orch-dev/orch/internal/store"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

// The watch cache is Kubernetes' cacher, sized for a small board: one
// resource's objects held in memory, fed by a single store watch, so that
// LISTs and WATCHes are served without reading the store again and one
// change is decoded once however many watch it. It starts on the
// resource's first LIST or WATCH: a resource nobody reads costs nothing.
//
// Unlike Kubernetes' cacher it keeps objects encoded (built-in kinds in
// protobuf, custom resources as stored) and decodes them when read:
// 100,000 ConfigMaps held decoded took 200 MB of a board's memory, held
// encoded 58 MB. Only the objects of the recent changes (the history,
// which every watcher is sent) stay decoded; a LIST decodes what it
// answers, as reading the store would.
//
// What it serves (everything else reads the store, as before):
//   - LIST without a continue token or resourceVersionMatch=Exact, and
//     without a limit unless resourceVersion is "0" (which, as on
//     Kubernetes, ignores the limit and answers the whole list);
//     resourceVersion "" is a consistent read: the cache first catches up
//     with the store's newest revision;
//   - WATCH from now, with initial events, or from a resourceVersion still
//     in its recent history.
//
// Objects in the cache are shared by every reader: nothing downstream of a
// LIST or WATCH may modify them.

// cacheHistory is how many recent changes a watch may resume from before
// it is served by the store instead (a cache's historySize, which tests
// make small).
const cacheHistory = 1024

// decodedHistory is how many of the newest changes of the history keep
// their objects decoded: the live watchers are sent each change as it
// happens, decoded once for all of them. Older changes stay in the
// history encoded, and are decoded again only for a watch that resumes
// from before them. A lease renewed every few seconds would otherwise
// hold a thousand decoded versions of itself.
const decodedHistory = 64

// Variables, not constants, for tests.
var (
	// maxQueued is how far one watcher may fall behind before it is cut
	// off; its client then watches again from the last version it saw.
	maxQueued = 10000
	// cacheProtobuf: the caches keep the built-in kinds in protobuf (false:
	// as stored, as custom resources are kept).
	cacheProtobuf = true
)

const (
	// cacheWait bounds how long a LIST waits for the cache to reach the
	// version it asks for before reading the store instead.
	cacheWait = 3 * time.Second
)

// cachedObject is one version of an object, as stored, with its labels
// for selectors. Its fields for selectors are not kept: most selectors
// name only the labels, the name or the namespace, and a field selector
// on another field decodes the object. It is never modified once made
// (but for asEncoded, which only the cache reads, under its lock):
// readers hold it without the cache's lock.
type cachedObject struct {
	key    string
	value  []byte // in protobuf (nil while obj holds it), or as stored
	rev    int64  // the resourceVersion it is read at
	labels labelPairs
	// obj is the version decoded, kept while its change is among the
	// newest of the history (nil otherwise): every watcher is sent it.
	obj runtime.Object
	// asEncoded is this version once encoded: it is both a change's
	// object and the next change's previous version, encoded once.
	asEncoded *cachedObject
}

// object is the version decoded; shared reports whether it is the cache's
// own copy, which nobody may modify.
func (co *cachedObject) object(s *Storage) (obj runtime.Object, shared bool, err error) {
	if co.obj != nil {
		return co.obj, true, nil
	}
	if !s.cacheProto {
		obj, err = s.decodeAt(co.value, co.rev)
		return obj, false, err
	}
	obj = s.Resource.New()
	if err := obj.(protoMessage).Unmarshal(co.value); err != nil {
		return nil, false, apierrors.NewInternalError(fmt.Errorf("decode cached %s %s: %w", s.Resource.Kind, co.key, err))
	}
	s.setTypeMeta(obj)
	return obj, false, nil
}

// encoded is co without its decoded object, for when its change leaves
// the decoded part of the history; co itself if it cannot be encoded (it
// stays decoded). The same for every caller: the cache's lock is held.
func (co *cachedObject) encoded() *cachedObject {
	if co.obj == nil {
		return co
	}
	if co.asEncoded != nil {
		return co.asEncoded
	}
	value := co.value
	if value == nil {
		var err error
		if value, err = encodeProtobuf(co.obj); err != nil {
			return co
		}
	}
	co.asEncoded = &cachedObject{key: co.key, value: value, rev: co.rev, labels: co.labels}
	return co.asEncoded
}

// labelPairs are an object's labels as key, value, key, value..., each
// string interned (shared by every object that has it, for as long as
// one does): at 100,000 objects a map each would cost 30 MB, and most
// objects' labels repeat.
type labelPairs []unique.Handle[string]

func newLabelPairs(m map[string]string) labelPairs {
	if len(m) == 0 {
		return nil
	}
	out := make(labelPairs, 0, 2*len(m))
	for k, v := range m {
		out = append(out, unique.Make(k), unique.Make(v))
	}
	return out
}

// Has, Get and Lookup make labelPairs a labels.Labels.
func (l labelPairs) Has(label string) bool {
	_, ok := l.Lookup(label)
	return ok
}

func (l labelPairs) Get(label string) string {
	v, _ := l.Lookup(label)
	return v
}

func (l labelPairs) Lookup(label string) (string, bool) {
	for i := 0; i+1 < len(l); i += 2 {
		if l[i].Value() == label {
			return l[i+1].Value(), true
		}
	}
	return "", false
}

// cacheEvent is one change (or, with progress set, the news that every
// change up to rev has been applied).
type cacheEvent struct {
	typ      watch.EventType
	obj      *cachedObject
	prev     *cachedObject // the version a MODIFIED replaced
	rev      int64
	progress bool
}

type watchCache struct {
	s   *Storage
	log *slog.Logger
	ctx context.Context

	mu      sync.RWMutex
	ready   bool
	objects map[string]*cachedObject
	rev     int64 // every change up to rev is in objects
	// advanced is closed, and replaced, whenever rev moves.
	advanced chan struct{}
	// history holds the latest changes, oldest first; every change after
	// historyFrom is in it.
	history     []*cacheEvent
	historyFrom int64
	historySize int
	watchers    map[*cacheWatcher]struct{}

	// progress asks the feeding watch for a progress notification.
	progress chan struct{}
	// bookmarkEvery is the smallest interval a current watcher wants
	// bookmarks at (0: none wants them).
	bookmarkEvery time.Duration
}

func newWatchCache(ctx context.Context, s *Storage, log *slog.Logger) *watchCache {
	c := &watchCache{s: s, log: log, ctx: ctx, advanced: make(chan struct{}), watchers: map[*cacheWatcher]struct{}{},
		progress: make(chan struct{}, 1), historySize: cacheHistory}
	go c.run()
	return c
}

// run keeps the cache in step with the store until the server stops,
// listing again whenever the feeding watch ends.
func (c *watchCache) run() {
	backoff := 100 * time.Millisecond
	for {
		err := c.sync()
		c.reset()
		if c.ctx.Err() != nil || errors.Is(err, store.ErrClosed) {
			return
		}
		c.log.Warn("watch cache restarts", "resource", c.s.Resource.GroupResource().String(), "err", err)
		select {
		case <-c.ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// reset marks the cache not ready and ends every watch it serves: their
// clients watch again, from the store until the cache is back.
func (c *watchCache) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ready = false
	for w := range c.watchers {
		w.end()
		delete(c.watchers, w)
	}
}

// sync lists the resource, then applies its changes as they come.
func (c *watchCache) sync() error {
	objects := map[string]*cachedObject{}
	opts := store.ListOptions{Limit: 1000}
	var rev int64
	for {
		res, err := c.s.store.List(c.ctx, c.s.prefix, opts)
		if err != nil {
			return fmt.Errorf("list: %w", err)
		}
		for _, kv := range res.KVs {
			co, err := c.s.cachedVersion(kv.Key, kv.Value, kv.ModRevision, keepEncoded)
			if err != nil {
				return err
			}
			objects[kv.Key] = co
		}
		rev = res.Revision
		if res.Continue == "" {
			break
		}
		opts = store.ListOptions{Limit: 1000, Continue: res.Continue}
	}
	w, err := c.s.store.Watch(c.ctx, c.s.prefix, rev)
	if err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	defer w.Stop()
	c.mu.Lock()
	c.objects, c.rev, c.history, c.historyFrom, c.ready = objects, rev, nil, rev, true
	c.advance()
	c.mu.Unlock()
	var tick <-chan time.Time
	var ticker *time.Ticker
	every := time.Duration(0)
	defer func() {
		if ticker != nil {
			ticker.Stop()
		}
	}()
	for {
		// Progress notifications come as often as the most eager watcher
		// wants bookmarks, and not at all when none does.
		c.mu.RLock()
		want := c.bookmarkEvery
		c.mu.RUnlock()
		if want != every {
			if ticker != nil {
				ticker.Stop()
				ticker, tick = nil, nil
			}
			if every = want; every > 0 {
				ticker = time.NewTicker(every)
				tick = ticker.C
			}
		}
		select {
		case <-c.ctx.Done():
			return c.ctx.Err()
		case <-c.progress:
			w.RequestProgress()
		case <-tick:
			w.RequestProgress()
		case ev, ok := <-w.Events():
			if !ok {
				if err := w.Err(); err != nil {
					return err
				}
				return store.ErrClosed
			}
			if err := c.apply(ev); err != nil {
				return err
			}
		}
	}
}

// apply makes one store event part of the cache and hands it to the
// watchers.
func (c *watchCache) apply(ev store.Event) error {
	e := &cacheEvent{rev: ev.Revision}
	switch ev.Type {
	case store.EventProgress:
		e.progress = true
	case store.EventPut:
		co, err := c.s.cachedVersion(ev.KV.Key, ev.KV.Value, ev.KV.ModRevision, keepEncoded|keepDecoded)
		if err != nil {
			return err
		}
		e.typ, e.obj, e.rev = watch.Added, co, ev.KV.ModRevision
	case store.EventDelete:
		if ev.PrevKV == nil {
			return nil
		}
		// A deletion shows the last state at the deleting revision.
		co, err := c.s.cachedVersion(ev.PrevKV.Key, ev.PrevKV.Value, ev.Revision, keepDecoded)
		if err != nil {
			return err
		}
		e.typ, e.obj = watch.Deleted, co
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !e.progress {
		if e.typ == watch.Added {
			if prev, ok := c.objects[e.obj.key]; ok {
				e.typ, e.prev = watch.Modified, prev
			}
			c.objects[e.obj.key] = e.obj
		} else {
			delete(c.objects, e.obj.key)
		}
		c.history = append(c.history, e)
		if i := len(c.history) - 1 - decodedHistory; i >= 0 {
			c.history[i] = c.encodeEvent(c.history[i])
		}
		if len(c.history) > c.historySize {
			drop := len(c.history) - c.historySize
			c.historyFrom = c.history[drop-1].rev
			for _, old := range c.history[:drop] {
				// Its object, if still current, is kept encoded from now on.
				if old.typ != watch.Deleted && c.objects[old.obj.key] == old.obj {
					c.objects[old.obj.key] = old.obj.encoded()
				}
			}
			c.history = slices.Delete(c.history, 0, drop)
		}
	}
	if e.rev > c.rev {
		c.rev = e.rev
		c.advance()
	}
	for w := range c.watchers {
		if !w.push(e) {
			delete(c.watchers, w)
		}
	}
	return nil
}

// encodeEvent is e with its versions encoded, for when it leaves the
// decoded part of the history; the current object, if it is e's, is
// replaced by the encoded version too. A new event, not e changed: the
// watchers that queued e read it without the lock. mu is held.
func (c *watchCache) encodeEvent(e *cacheEvent) *cacheEvent {
	if e.obj.obj == nil && (e.prev == nil || e.prev.obj == nil) {
		return e
	}
	enc := *e
	enc.obj = e.obj.encoded()
	if e.typ != watch.Deleted && c.objects[e.obj.key] == e.obj {
		c.objects[e.obj.key] = enc.obj
	}
	if e.prev != nil {
		enc.prev = e.prev.encoded()
	}
	return &enc
}

// advance wakes whoever waits for the revision to move; mu is held.
func (c *watchCache) advance() {
	close(c.advanced)
	c.advanced = make(chan struct{})
}

// protoMessage is what the built-in kinds' types are (k8s.io/api's
// generated protobuf code).
type protoMessage interface {
	Marshal() ([]byte, error)
	Unmarshal([]byte) error
}

// hasProtobuf reports whether obj's type is one of k8s.io's, with their
// generated protobuf code (a type of another package could have the
// methods of a type it embeds, which would encode only that part).
func hasProtobuf(obj runtime.Object) bool {
	_, ok := obj.(protoMessage)
	return ok && strings.HasPrefix(reflect.TypeOf(obj).Elem().PkgPath(), "k8s.io/")
}

// What the cache keeps of a version: its encoding (the objects of the
// cache), the version decoded (a deletion, which only the history has),
// or both (a change, in the history and the objects).
type keep int

const (
	keepEncoded keep = 1 << iota
	keepDecoded
)

// cachedVersion is a stored version as the cache keeps it. Built-in kinds
// are kept in protobuf, as Kubernetes keeps them in etcd: a third smaller
// than their JSON and decoded several times faster, which a LIST of the
// cache does for every object. Others (custom resources) are kept as
// stored, and read only for their labels until something needs them.
func (s *Storage) cachedVersion(key string, value []byte, rev int64, what keep) (*cachedObject, error) {
	co := &cachedObject{key: key, rev: rev}
	if what == keepEncoded && !s.cacheProto {
		var l storedLabels
		if err := json.Unmarshal(value, &l); err != nil {
			return nil, apierrors.NewInternalError(fmt.Errorf("decode stored %s %s: %w", s.Resource.Kind, key, err))
		}
		co.value, co.labels = value, newLabelPairs(l.Metadata.Labels)
		return co, nil
	}
	obj, err := s.decodeAt(value, rev)
	if err != nil {
		return nil, err
	}
	if m, err := meta.Accessor(obj); err == nil {
		co.labels = newLabelPairs(m.GetLabels())
	}
	if what&keepDecoded != 0 {
		co.obj = obj
		// Readers encode it concurrently, and a Quantity caches its string
		// form the first time it is asked for it (a write, which the race
		// detector caught between two watchers' encodings): asked now,
		// before the object is shared, it is only read afterwards.
		if sized, ok := obj.(interface{ Size() int }); ok {
			sized.Size()
		}
	}
	switch {
	case what&keepEncoded == 0:
	case !s.cacheProto:
		co.value = value
	case co.obj == nil:
		if co.value, err = encodeProtobuf(obj); err != nil {
			return nil, apierrors.NewInternalError(fmt.Errorf("encode %s %s for the watch cache: %w", s.Resource.Kind, key, err))
		}
	}
	// A protobuf version kept decoded is encoded only when its change
	// leaves the history (encoded): most of a small cluster's objects
	// change less than the history holds, and would be held twice.
	return co, nil
}

// encodeProtobuf is a built-in kind's object in protobuf.
func encodeProtobuf(obj runtime.Object) ([]byte, error) {
	pm, ok := obj.(protoMessage)
	if !ok {
		return nil, fmt.Errorf("%T has no protobuf", obj)
	}
	return pm.Marshal()
}

// storedLabels is the part of a stored object the cache reads without
// decoding it.
type storedLabels struct {
	Metadata struct {
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
}

// matchesCached applies f to co, decoding it only for a field selector
// on a field other than the name and namespace; obj is co decoded, when
// it was.
func (f Filter) matchesCached(s *Storage, co *cachedObject) (matches bool, obj runtime.Object, err error) {
	if f.Empty() {
		return true, nil, nil
	}
	if !f.Labels.Matches(co.labels) {
		return false, nil, nil
	}
	if f.Fields.Empty() {
		return true, nil, nil
	}
	l := &lazyFields{s: s, co: co}
	matches = f.Fields.Matches(l)
	return matches && l.err == nil, l.obj, l.err
}

// fieldsMatch applies a field selector to co, whose labels matched
// already, and is co decoded when it matches.
func fieldsMatch(s *Storage, sel fields.Selector, co *cachedObject) (obj runtime.Object, matches bool, err error) {
	matches, obj, err = Filter{Labels: labels.Everything(), Fields: sel}.matchesCached(s, co)
	if err == nil && matches && obj == nil {
		obj, _, err = co.object(s)
	}
	return obj, matches, err
}

// lazyFields answers a field selector from the object's key for its name
// and namespace (a kubelet's watch of one Secret names only those), and
// decodes it and builds the resource's whole field set only for another
// field.
type lazyFields struct {
	s   *Storage
	co  *cachedObject
	obj runtime.Object
	set fields.Set
	err error
}

func (l *lazyFields) Has(field string) bool {
	_, ok := l.get(field)
	return ok
}

func (l *lazyFields) Get(field string) string {
	v, _ := l.get(field)
	return v
}

func (l *lazyFields) get(field string) (string, bool) {
	namespace, name := l.s.nameOf(l.co.key)
	switch {
	case field == "metadata.name":
		return name, true
	case field == "metadata.namespace" && l.s.Resource.Namespaced:
		return namespace, true
	}
	if l.set == nil {
		if l.obj == nil {
			if l.obj, _, l.err = l.co.object(l.s); l.err != nil {
				l.set = fields.Set{}
				return "", false
			}
		}
		l.set = l.s.Resource.FieldSet(l.obj)
	}
	v, ok := l.set[field]
	return v, ok
}

// waitFor returns once the cache holds every change up to rev, or reports
// false when it is not running or does not get there in time.
// reached reports whether the cache has seen the store at rev or later
// (false for no cache).
func (c *watchCache) reached(rev int64) bool {
	if c == nil {
		return false
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.ready && c.rev >= rev
}

// get is the object at key once the cache has every change up to rev,
// the caller's own; found is false when the cache does not have it (or
// is not ready, or not there in time).
func (c *watchCache) get(ctx context.Context, key string, rev int64) (obj runtime.Object, found bool, err error) {
	if !c.waitFor(ctx, rev) {
		return nil, false, nil
	}
	c.mu.RLock()
	co, found := c.objects[key]
	found = found && c.ready && c.rev >= rev
	c.mu.RUnlock()
	if !found {
		return nil, false, nil
	}
	obj, shared, err := co.object(c.s)
	if err != nil {
		return nil, false, err
	}
	if shared {
		obj = obj.DeepCopyObject()
	}
	return obj, true, nil
}

// waitReady waits up to cacheWait for the cache to hold the resource (a
// server starting lists every resource at once), so a watch made then is
// served by it instead of by a store watch of its own for as long as it
// lasts, as Kubernetes' watches wait for its cacher. It reports whether
// the cache is ready.
func (c *watchCache) waitReady(ctx context.Context) bool {
	return c.waitUntil(ctx, false, func() (bool, bool) { return c.ready, false })
}

// waitFor waits up to cacheWait for the cache to have every change up to
// rev, asking the store's watch for progress meanwhile; false when it is
// not ready.
func (c *watchCache) waitFor(ctx context.Context, rev int64) bool {
	return c.waitUntil(ctx, true, func() (bool, bool) { return c.ready && c.rev >= rev, !c.ready })
}

// waitUntil checks reached, under the lock, each time the cache moves, up
// to cacheWait; reached says whether the wait is over and whether it is
// hopeless. askProgress asks the feeding watch for progress meanwhile.
func (c *watchCache) waitUntil(ctx context.Context, askProgress bool, reached func() (yes, hopeless bool)) bool {
	deadline := time.NewTimer(cacheWait)
	defer deadline.Stop()
	for {
		c.mu.RLock()
		yes, hopeless := reached()
		advanced := c.advanced
		c.mu.RUnlock()
		if yes || hopeless {
			return yes
		}
		if askProgress {
			select {
			case c.progress <- struct{}{}:
			default:
			}
		}
		select {
		case <-advanced:
		case <-deadline.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// list serves a LIST from the cache; ok is false when the store must.
func (c *watchCache) list(ctx context.Context, namespace string, filter Filter, opts *metav1.ListOptions) (runtime.Object, bool, error) {
	if opts.Continue != "" || opts.ResourceVersionMatch == metav1.ResourceVersionMatchExact ||
		opts.ResourceVersionMatch != "" && opts.ResourceVersionMatch != metav1.ResourceVersionMatchNotOlderThan {
		return nil, false, nil
	}
	var atLeast int64
	switch opts.ResourceVersion {
	case "0":
	case "":
		if opts.Limit > 0 {
			return nil, false, nil
		}
		// A consistent read: everything the store has acknowledged; for
		// admission, everything this server wrote (WithCachedReads).
		if cachedReads(ctx) {
			atLeast = c.s.written.Load()
			break
		}
		rev, err := c.s.store.Revision(ctx)
		if err != nil {
			return nil, false, nil
		}
		atLeast = rev
	default:
		if opts.Limit > 0 {
			return nil, false, nil
		}
		rev, err := parseRV(opts.ResourceVersion)
		if err != nil {
			return nil, false, err
		}
		atLeast = rev
	}
	if !c.waitFor(ctx, atLeast) {
		return nil, false, nil
	}
	prefix := c.s.collectionPrefix(namespace)
	c.mu.RLock()
	if !c.ready {
		c.mu.RUnlock()
		return nil, false, nil
	}
	// Under the lock only what needs no decoding: the labels. The rest is
	// done on versions the cache no longer changes.
	candidates := make([]*cachedObject, 0, len(c.objects))
	for key, co := range c.objects {
		if strings.HasPrefix(key, prefix) && filter.Labels.Matches(co.labels) {
			candidates = append(candidates, co)
		}
	}
	rev := c.rev
	c.mu.RUnlock()
	slices.SortFunc(candidates, func(a, b *cachedObject) int { return strings.Compare(a.key, b.key) })
	items := make([]runtime.Object, 0, len(candidates))
	for _, co := range candidates {
		obj, matches, err := fieldsMatch(c.s, filter.Fields, co)
		if err != nil {
			return nil, false, err
		}
		if matches {
			items = append(items, obj)
		}
	}
	list, err := c.s.newList(items, rev, "")
	return list, err == nil, err
}

// watchRequest is a WATCH as the cache serves it.
type watchRequest struct {
	prefix        string
	filter        Filter
	rv            int64 // deliver changes after it
	initial       bool  // first the current objects, as ADDED
	initialEnd    bool  // then a bookmark marking their end
	bookmarks     bool
	bookmarkEvery time.Duration
}

// watch serves a WATCH from the cache; ok is false when the store must
// (the cache is not running, or rv is older than its history).
func (c *watchCache) watch(ctx context.Context, req watchRequest) (<-chan watch.Event, bool) {
	c.mu.Lock()
	if !c.ready || !req.initial && req.rv < c.historyFrom {
		c.mu.Unlock()
		return nil, false
	}
	w := &cacheWatcher{signal: make(chan struct{}, 1)}
	var initial []*cachedObject
	if req.initial {
		// Only the labels under the lock; the fields as they are sent.
		for key, co := range c.objects {
			if strings.HasPrefix(key, req.prefix) && req.filter.Labels.Matches(co.labels) {
				initial = append(initial, co)
			}
		}
		req.rv = c.rev
	} else {
		for _, e := range c.history {
			if e.rev > req.rv {
				w.queue = append(w.queue, e)
			}
		}
		if len(w.queue) > 0 {
			// What happened since rv is sent at once, not with the next
			// change: a client resuming in a quiet cluster would wait for it.
			w.signal <- struct{}{}
		}
	}
	c.watchers[w] = struct{}{}
	if req.bookmarks && (c.bookmarkEvery == 0 || req.bookmarkEvery < c.bookmarkEvery) {
		c.bookmarkEvery = req.bookmarkEvery
		// Wake the feeding loop to start its progress ticker.
		select {
		case c.progress <- struct{}{}:
		default:
		}
	}
	c.mu.Unlock()
	slices.SortFunc(initial, func(a, b *cachedObject) int { return strings.Compare(a.key, b.key) })
	out := make(chan watch.Event, 16)
	go func() {
		defer close(out)
		defer c.forget(w)
		w.serve(ctx, c.s, req, initial, out)
	}()
	return out, true
}

// forget drops a finished watcher.
func (c *watchCache) forget(w *cacheWatcher) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.watchers, w)
	w.end()
}

// cacheWatcher is one WATCH served by the cache. Changes queue for it
// without ever blocking the cache; one that falls maxQueued behind is cut
// off.
type cacheWatcher struct {
	mu     sync.Mutex
	queue  []*cacheEvent
	ended  bool
	signal chan struct{} // cap 1: queue or ended changed
}

// push queues e; it reports false when the watcher has ended or is cut off.
func (w *cacheWatcher) push(e *cacheEvent) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		return false
	}
	if len(w.queue) >= maxQueued {
		w.ended = true
		w.queue = nil
	} else {
		w.queue = append(w.queue, e)
	}
	select {
	case w.signal <- struct{}{}:
	default:
	}
	return !w.ended
}

func (w *cacheWatcher) end() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ended = true
	select {
	case w.signal <- struct{}{}:
	default:
	}
}

// take returns what is queued, and whether the watcher has ended.
func (w *cacheWatcher) take() ([]*cacheEvent, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	q := w.queue
	w.queue = nil
	return q, w.ended
}

// serve sends the watch's events until ctx ends or the watcher is cut off.
func (w *cacheWatcher) serve(ctx context.Context, s *Storage, req watchRequest, initial []*cachedObject, out chan<- watch.Event) {
	send := func(e watch.Event) bool {
		select {
		case out <- e:
			return true
		case <-ctx.Done():
			return false
		}
	}
	for _, co := range initial {
		// Decoded one at a time as sent: a watch of many objects does not
		// hold them all decoded at once.
		obj, matches, err := fieldsMatch(s, req.filter.Fields, co)
		if err != nil {
			send(watch.Event{Type: watch.Error, Object: &apierrors.NewInternalError(err).ErrStatus})
			return
		}
		if matches && !send(watch.Event{Type: watch.Added, Object: obj}) {
			return
		}
	}
	if req.initialEnd {
		if !send(watch.Event{Type: watch.Bookmark, Object: s.bookmark(req.rv, true)}) {
			return
		}
	}
	var lastBookmark time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.signal:
		}
		events, ended := w.take()
		for _, e := range events {
			if e.progress {
				// Bookmarks ride the same queue as the changes, so one never
				// overtakes a change it claims to follow.
				if req.bookmarks && time.Since(lastBookmark) >= req.bookmarkEvery/2 {
					lastBookmark = time.Now()
					if !send(watch.Event{Type: watch.Bookmark, Object: s.bookmark(max(e.rev, req.rv), false)}) {
						return
					}
				}
				continue
			}
			if e.rev <= req.rv || !strings.HasPrefix(e.obj.key, req.prefix) {
				continue
			}
			ev, ok := filterEvent(s, e, req.filter)
			if ok && !send(ev) || ev.Type == watch.Error {
				return
			}
		}
		if ended {
			return
		}
	}
}

// filterEvent applies a watch's selectors as Kubernetes does: an object
// that starts matching is ADDED, one that stops matching is DELETED.
func filterEvent(s *Storage, e *cacheEvent, f Filter) (watch.Event, bool) {
	// The changed version is decoded unless the change is an old one of
	// the history, sent to a watch resuming from before it; the version
	// it replaced may not be, and if it cannot be it counts as not
	// matching.
	obj, _, err := e.obj.object(s)
	if err != nil {
		return watch.Event{Type: watch.Error, Object: &apierrors.NewInternalError(err).ErrStatus}, true
	}
	if f.Empty() {
		return watch.Event{Type: e.typ, Object: obj}, true
	}
	matches, _, _ := f.matchesCached(s, e.obj)
	if e.typ != watch.Modified {
		return watch.Event{Type: e.typ, Object: obj}, matches
	}
	matched, _, _ := f.matchesCached(s, e.prev)
	switch {
	case matches && matched:
		return watch.Event{Type: watch.Modified, Object: obj}, true
	case matches:
		return watch.Event{Type: watch.Added, Object: obj}, true
	case matched:
		return watch.Event{Type: watch.Deleted, Object: obj}, true
	}
	return watch.Event{}, false
}

// newList wraps items in the resource's List type at rev.
func (s *Storage) newList(items []runtime.Object, rev int64, next string) (runtime.Object, error) {
	list := s.Resource.NewList()
	if err := meta.SetList(list, items); err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	lm, err := meta.ListAccessor(list)
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	lm.SetResourceVersion(fmt.Sprint(rev))
	lm.SetContinue(next)
	list.GetObjectKind().SetGroupVersionKind(s.Resource.GroupVersion().WithKind(s.Resource.Kind + "List"))
	return list, nil
}
