// Package registry gives Kubernetes object semantics to the raw store: keys
// under /registry/<resource>/<namespace>/<name>, resourceVersion from the
// store's modification revision, uid and timestamps, generateName,
// generation, optimistic concurrency with 409s, graceful deletion with
// finalizers, list paging and selectors, and watches with Kubernetes'
// resourceVersion rules.
//
// Every error it returns is a Kubernetes StatusError, ready for the wire.
package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/orch-dev/orch/internal/api/admission"
	"github.com/orch-dev/orch/internal/api/apply"
	"github.com/orch-dev/orch/internal/api/memo"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/orch-dev/orch/internal/api/resources"
	"github.com/orch-dev/orch/internal/store"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Storage serves one resource out of the store.
type Storage struct {
	Resource *resources.Resource
	store    store.Store
	prefix   string
	// Admit, when set, runs after defaults and before validation on every
	// create and update (old is nil on create): the server's admission that
	// needs cluster state, such as namespace lifecycle and IP allocation.
	Admit func(ctx context.Context, obj, old runtime.Object) error
	// External, when set, is the admission the cluster configures
	// (webhooks, policies): mutating after Admit, validating after
	// validation, and on deletes.
	External admission.Interface
	// AdmitDelete, when set, may refuse a delete of the object as stored
	// (a system PriorityClass), before any other admission.
	AdmitDelete func(ctx context.Context, obj runtime.Object) error
	// Quota, when set, runs last on every create and update, to charge
	// what all admission let through.
	Quota func(ctx context.Context, obj, old runtime.Object) error
	// Released, when set, is told of every object deleted from the store,
	// so allocations held by it can be freed.
	Released func(obj runtime.Object)
	// Committed, when set, is told of every update that reached the store.
	Committed func(obj, old runtime.Object)
	// Abandoned, when set, is told of every admitted update that did not
	// reach the store (dry run, conflict, error), so that what admission
	// took for it can be given back.
	Abandoned func(obj, old runtime.Object)

	recent *memo.Ring[decodeKey, runtime.Object]
	// written is the revision of the newest write this server made to
	// the resource: what its cached reads wait for (WithCachedReads).
	written atomic.Int64
	// fields keep metadata.managedFields on every write and merge
	// server-side apply configurations.
	fields *apply.Managers

	// The watch cache, when enabled, starts on the first LIST or WATCH.
	cacheCtx  context.Context
	cacheStop context.CancelFunc
	cacheLog  *slog.Logger
	cacheOnce sync.Once
	cache     *watchCache
	// cacheProto: the cache keeps the objects in protobuf (set as it
	// starts: the resource's type has it).
	cacheProto bool
	// startedCache is cache once started, for readers that must not start it.
	startedCache atomic.Pointer[watchCache]
}

// EnableCache lets a watch cache serve the resource's LISTs and WATCHes
// until ctx ends; it starts on the first of them.
func (s *Storage) EnableCache(ctx context.Context, log *slog.Logger) {
	s.cacheCtx, s.cacheStop = context.WithCancel(ctx)
	s.cacheLog = log
}

// stop ends the watch cache of a storage no longer served, and with it the
// watches it feeds.
func (s *Storage) stop() {
	if s.cacheStop != nil {
		s.cacheStop()
	}
}

// watchCache returns the resource's cache, starting it, or nil when the
// cache is not enabled.
func (s *Storage) watchCache() *watchCache {
	if s.cacheCtx == nil {
		return nil
	}
	s.cacheOnce.Do(func() {
		s.cacheProto = cacheProtobuf && hasProtobuf(s.Resource.New())
		s.cache = newWatchCache(s.cacheCtx, s, s.cacheLog)
		s.startedCache.Store(s.cache)
	})
	return s.cache
}

// CacheSize is how many objects and watchers the resource's watch cache
// holds; ok is false while no cache has started (nothing listed or
// watched it yet, or caching is off).
func (s *Storage) CacheSize() (objects, watchers int, ok bool) {
	c := s.startedCache.Load()
	if c == nil {
		return 0, 0, false
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.objects), len(c.watchers), c.ready
}

// New returns the storage of r in s.
func New(s store.Store, r *resources.Resource) *Storage {
	fields := apply.NewManagers(r.GroupVersionKind, r.HasSubresource("status"))
	if r.TypeConverter != nil {
		fields = apply.NewCustomManagers(r.GroupVersionKind, r.HasSubresource("status"), r.TypeConverter)
	}
	return &Storage{Resource: r, store: s, prefix: Prefix(r), recent: newRecentDecodes(512), fields: fields}
}

// Prefix is the key prefix every object of r lives under.
func Prefix(r *resources.Resource) string { return "/registry/" + r.StorageKey + "/" }

// VolatilePrefixes returns the key prefixes the store must keep in memory
// only, for the resources that ask for it.
func VolatilePrefixes(all []*resources.Resource) []string {
	seen := map[string]bool{}
	var out []string
	for _, r := range all {
		for _, ns := range r.Volatile {
			p := Prefix(r)
			if ns != "*" {
				p += ns + "/"
			}
			if !seen[p] {
				seen[p] = true
				out = append(out, p)
			}
		}
	}
	return out
}

func (s *Storage) key(namespace, name string) string {
	if s.Resource.Namespaced {
		return s.prefix + namespace + "/" + name
	}
	return s.prefix + name
}

// nameOf is the namespace and name of a key of this resource's.
func (s *Storage) nameOf(key string) (namespace, name string) {
	name = strings.TrimPrefix(key, s.prefix)
	if s.Resource.Namespaced {
		namespace, name, _ = strings.Cut(name, "/")
	}
	return namespace, name
}

// collectionPrefix is the prefix of a list: one namespace, or all of them.
func (s *Storage) collectionPrefix(namespace string) string {
	if s.Resource.Namespaced && namespace != "" {
		return s.prefix + namespace + "/"
	}
	return s.prefix
}

func (s *Storage) groupResource() schema.GroupResource {
	return schema.GroupResource{Group: s.Resource.Group, Resource: s.Resource.Plural}
}

// encode turns an object into its stored bytes: the served shape, or the
// storage shape for views, always without a resourceVersion.
func (s *Storage) encode(obj runtime.Object) ([]byte, error) {
	if s.Resource.ToStorage != nil {
		var err error
		if obj, err = s.Resource.ToStorage(obj); err != nil {
			return nil, err
		}
	} else {
		s.setTypeMeta(obj)
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	rv := m.GetResourceVersion()
	m.SetResourceVersion("")
	defer m.SetResourceVersion(rv)
	data, err := json.Marshal(obj)
	if err != nil {
		return nil, apierrors.NewInternalError(fmt.Errorf("encode %s: %w", s.Resource.Kind, err))
	}
	if len(data) > MaxObjectBytes {
		return nil, apierrors.NewRequestEntityTooLargeError(fmt.Sprintf("the stored %s would be %d bytes, more than the limit of %d", s.Resource.Kind, len(data), MaxObjectBytes))
	}
	return data, nil
}

// MaxObjectBytes is the largest object stored, as etcd's default request
// limit bounds Kubernetes' objects: a store of many small objects stays
// fast to list, watch and compact.
const MaxObjectBytes = 1536 << 10

func (s *Storage) setTypeMeta(obj runtime.Object) {
	obj.GetObjectKind().SetGroupVersionKind(s.Resource.GroupVersionKind)
}

// decode reads a stored version into a fresh object with its resourceVersion.
func (s *Storage) decode(kv store.KeyValue) (runtime.Object, error) {
	return s.decodeAt(kv.Value, kv.ModRevision)
}

func (s *Storage) decodeAt(value []byte, rev int64) (runtime.Object, error) {
	var obj runtime.Object
	if s.Resource.StorageNew != nil {
		obj = s.Resource.StorageNew()
	} else {
		obj = s.Resource.New()
	}
	if err := json.Unmarshal(value, obj); err != nil {
		return nil, apierrors.NewInternalError(fmt.Errorf("decode stored %s: %w", s.Resource.Kind, err))
	}
	if s.Resource.FromStorage != nil {
		var err error
		if obj, err = s.Resource.FromStorage(obj); err != nil {
			return nil, err
		}
	}
	s.setTypeMeta(obj)
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	m.SetResourceVersion(strconv.FormatInt(rev, 10))
	return obj, nil
}

// cachedReadsKey marks a context whose reads may be served by the watch
// caches as they stand (WithCachedReads).
type cachedReadsKey struct{}

// WithCachedReads lets the reads made with ctx be served by the watch
// caches without a quorum read of the store, as Kubernetes' admission
// plugins read their informers: the built-in admission reads the
// namespace, the service account, LimitRanges and PriorityClasses of
// every write. Each cache first takes every write this server made to its
// resource (read-your-writes: on one server, every write), so only a
// write through another server in the last moments may be missed, as
// with Kubernetes' informers; an object the cache does not have is read
// from the store (Kubernetes' live lookup).
func WithCachedReads(ctx context.Context) context.Context {
	return context.WithValue(ctx, cachedReadsKey{}, true)
}

func cachedReads(ctx context.Context) bool {
	ok, _ := ctx.Value(cachedReadsKey{}).(bool)
	return ok
}

// wrote notes a write of this server's to the store at rev.
func (s *Storage) wrote(rev int64) {
	for {
		last := s.written.Load()
		if rev <= last || s.written.CompareAndSwap(last, rev) {
			return
		}
	}
}

// Get returns the named object.
func (s *Storage) Get(ctx context.Context, namespace, name string) (runtime.Object, error) {
	if cachedReads(ctx) {
		if c := s.watchCache(); c != nil {
			if obj, found, err := c.get(ctx, s.key(namespace, name), s.written.Load()); err != nil {
				return nil, err
			} else if found {
				return obj, nil
			}
		}
	}
	kv, err := s.store.Get(ctx, s.key(namespace, name))
	if err != nil {
		return nil, s.storeError(err, name)
	}
	return s.decode(kv)
}

// storeError maps a store error to the Kubernetes error a client expects.
func (s *Storage) storeError(err error, name string) error {
	gr := s.groupResource()
	switch {
	case errors.Is(err, store.ErrNotFound):
		return apierrors.NewNotFound(gr, name)
	case errors.Is(err, store.ErrExists):
		return apierrors.NewAlreadyExists(gr, name)
	case errors.Is(err, store.ErrConflict):
		return apierrors.NewConflict(gr, name, errors.New(conflictMessage))
	case errors.Is(err, store.ErrCompacted):
		return apierrors.NewResourceExpired("The resourceVersion for the provided list is too old.")
	case errors.Is(err, store.ErrFutureRevision):
		return TooLargeResourceVersion("Too large resource version")
	case errors.Is(err, store.ErrInvalid):
		return apierrors.NewBadRequest(err.Error())
	case errors.Is(err, store.ErrClosed):
		return apierrors.NewServiceUnavailable("the server is shutting down")
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return apierrors.NewTimeoutError(err.Error(), 1)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return NoSpace(err)
	}
	return apierrors.NewInternalError(err)
}

// TooLargeResourceVersion is kube-apiserver's answer to a resourceVersion
// the store has not reached: a timeout whose cause client-go's reflector
// recognises, and lists again.
func TooLargeResourceVersion(msg string) error {
	err := apierrors.NewTimeoutError(msg, 1)
	err.ErrStatus.Details.Causes = []metav1.StatusCause{{Type: metav1.CauseTypeResourceVersionTooLarge, Message: "Too large resource version"}}
	return err
}

// NoSpace is the answer to a write the disk has no room for: 507
// Insufficient Storage, as etcd refuses writes under its NOSPACE alarm.
// Reads go on, and writes succeed again once space is freed.
func NoSpace(err error) *apierrors.StatusError {
	return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: http.StatusInsufficientStorage,
		Reason:  "InsufficientStorage",
		Message: fmt.Sprintf("the server's disk is full: writes are refused until space is freed (reads go on): %v", err)}}
}

const conflictMessage = "the object has been modified; please apply your changes to the latest version and try again"

func parseRV(rv string) (int64, error) {
	if rv == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(rv, 10, 64)
	if err != nil || n < 0 {
		return 0, apierrors.NewBadRequest(fmt.Sprintf("invalid resource version %q", rv))
	}
	return n, nil
}
