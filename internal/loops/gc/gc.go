// Package gc is the garbage collector: it deletes objects whose owners
// (metadata.ownerReferences) are all gone, so `kubectl delete deployment`
// takes its ReplicaSets and their pods with it. It follows Kubernetes'
// three propagation policies: background (the owner goes at once, the
// collector removes dependents after), foreground (the owner waits, with
// the "foregroundDeletion" finalizer, until its dependents are gone), and
// orphan (the owner waits, with the "orphan" finalizer, until its
// dependents no longer point at it).
//
// It watches the metadata of every served resource that can be listed,
// watched and deleted, through the metadata client, and keeps a graph of
// owners and dependents by UID. An owner missing from the graph is looked
// up live before anything is deleted, so a slow watch never costs data.
package gc

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/loops/controller"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/metadata"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

// ignored are resources the collector does not watch: events churn and
// own nothing, as in Kubernetes' default ignore list.
var ignored = map[schema.GroupResource]bool{
	{Group: "", Resource: "events"}:              true,
	{Group: "events.k8s.io", Resource: "events"}: true,
}

// settle is how long an owner being deleted in the foreground or with
// orphaning waits before its dependents are judged: the time the
// collector's watches may lag behind the API.
const settle = time.Second

// resource is a served resource the collector watches.
type resource struct {
	gvr        schema.GroupVersionResource
	namespaced bool
}

// object is what the graph knows of one object.
type object struct {
	res       resource
	namespace string
	name      string
	uid       types.UID
	owners    []metav1.OwnerReference
	deleting  bool
	// seenDeleting is when the collector first saw the object deleting.
	seenDeleting time.Time
	finalizers   []string
}

// Collector is the garbage collection loop.
type Collector struct {
	api    *kube.Client
	client metadata.Interface
	log    *slog.Logger
	clock  clock.PassiveClock
	queue  *controller.Queue[types.UID]
	resync time.Duration
	// shared has the loops' informers, which the collector uses where
	// they watch a whole resource (nil: it watches every resource itself).
	shared *kube.Informers

	// kinds are the watched resources by kind, with their informers'
	// stops (under mu); discoverMu serialises discoveries.
	discoverMu sync.Mutex
	discovered time.Time // under discoverMu
	kinds      map[schema.GroupVersionKind]resource
	stops      map[schema.GroupVersionKind]context.CancelFunc
	// unresolved are dependents with an owner of a kind not served when
	// they were judged (under mu).
	unresolved map[types.UID]bool
	synced     []toolscache.InformerSynced

	mu         sync.Mutex
	objects    map[types.UID]*object
	dependents map[types.UID]map[types.UID]bool
}

// New prepares a collector; Start discovers the resources and watches
// them, through shared's informers where the loops have them (shared may
// be nil) and metadata-only ones otherwise.
func New(api *kube.Client, shared *kube.Informers, resync time.Duration, env controller.Env) *Collector {
	return &Collector{
		api: api, client: api.Metadata(), shared: shared, log: env.Log.With("loop", "garbage-collector"), clock: env.Clock, resync: resync,
		queue: controller.NewQueue[types.UID]("garbage-collector", env),
		kinds: map[schema.GroupVersionKind]resource{}, stops: map[schema.GroupVersionKind]context.CancelFunc{},
		unresolved: map[types.UID]bool{},
		objects:    map[types.UID]*object{}, dependents: map[types.UID]map[types.UID]bool{},
	}
}

// rediscoverEvery is how often the collector looks for resources served
// or no longer served (CustomResourceDefinitions come and go), as
// Kubernetes' collector resyncs its monitors.
const rediscoverEvery = 30 * time.Second

// Start discovers the served resources and starts watching them, and
// watches the resources served later (custom resources) as they come.
func (c *Collector) Start(ctx context.Context) error {
	if err := c.discover(ctx, true); err != nil {
		return err
	}
	go func() {
		tick := time.NewTicker(rediscoverEvery)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if err := c.discover(ctx, false); err != nil && ctx.Err() == nil {
					c.log.Warn("garbage collector discovery", "err", err)
				}
			}
		}
	}()
	return nil
}

// discover watches the resources served now and not watched yet, and stops
// watching those no longer served (forgetting their objects).
func (c *Collector) discover(ctx context.Context, initial bool) error {
	c.discoverMu.Lock()
	defer c.discoverMu.Unlock()
	c.discovered = time.Now()
	all, err := c.api.ServerResources(ctx)
	if err != nil {
		return fmt.Errorf("garbage collector discovery: %w", err)
	}
	served := map[schema.GroupVersionKind]bool{}
	added := false
	for _, r := range all {
		if !r.Has("list", "watch", "delete") || ignored[schema.GroupResource{Group: r.GroupVersion.Group, Resource: r.Name}] {
			continue
		}
		gvk := r.GroupVersion.WithKind(r.Kind)
		served[gvk] = true
		c.mu.Lock()
		_, watched := c.kinds[gvk]
		c.mu.Unlock()
		if watched {
			continue
		}
		res := resource{gvr: r.GroupVersionResource(), namespaced: r.Namespaced}
		handler := toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { c.observe(res, obj) },
			UpdateFunc: func(_, obj any) { c.observe(res, obj) },
			DeleteFunc: c.forget,
		}
		var synced toolscache.InformerSynced
		var stop context.CancelFunc
		if informer, ok := c.shared.Existing(res.gvr); ok {
			// A loop's informer: the collector's handler comes and goes,
			// the informer runs with the loops.
			reg, err := informer.AddEventHandlerWithResyncPeriod(handler, c.resync)
			if err != nil {
				return err
			}
			synced, stop = reg.HasSynced, func() { _ = informer.RemoveEventHandler(reg) }
		} else {
			informer := kube.MetadataInformer(c.client, res.gvr, c.resync)
			if _, err := informer.AddEventHandler(handler); err != nil {
				return err
			}
			var watch context.Context
			watch, stop = context.WithCancel(ctx)
			synced = informer.HasSynced
			go informer.RunWithContext(watch)
		}
		added = true
		c.mu.Lock()
		c.kinds[gvk] = res
		c.stops[gvk] = stop
		c.mu.Unlock()
		if initial {
			// What the workers wait for before they start; later
			// resources are judged as their informers fill.
			c.synced = append(c.synced, synced)
		}
	}
	c.mu.Lock()
	if added {
		// Dependents whose owners' kinds were unknown may know them now.
		for uid := range c.unresolved {
			c.queue.Add(uid)
		}
		clear(c.unresolved)
	}
	var gone []types.UID
	for gvk, res := range c.kinds {
		if served[gvk] {
			continue
		}
		c.stops[gvk]()
		delete(c.stops, gvk)
		delete(c.kinds, gvk)
		for uid, o := range c.objects {
			if o.res == res {
				gone = append(gone, uid)
			}
		}
		c.log.Info("no longer watching", "resource", res.gvr.String())
	}
	c.mu.Unlock()
	for _, uid := range gone {
		c.forgetUID(uid)
	}
	return nil
}

// Run collects garbage until ctx ends.
func (c *Collector) Run(ctx context.Context, workers int) {
	c.queue.Run(ctx, workers, c.synced, c.process)
}

// observe takes an object's metadata into the graph: a metadata-only
// informer's or a loop's typed object alike.
func (c *Collector) observe(res resource, obj any) {
	m, err := meta.Accessor(obj)
	if err != nil {
		return
	}
	o := &object{res: res, namespace: m.GetNamespace(), name: m.GetName(), uid: m.GetUID(), owners: m.GetOwnerReferences(),
		deleting: m.GetDeletionTimestamp() != nil, finalizers: m.GetFinalizers()}
	c.mu.Lock()
	if o.deleting {
		o.seenDeleting = c.clock.Now()
	}
	if old := c.objects[o.uid]; old != nil {
		if !old.seenDeleting.IsZero() {
			o.seenDeleting = old.seenDeleting
		}
		for _, ref := range old.owners {
			delete(c.dependents[ref.UID], o.uid)
		}
	}
	c.objects[o.uid] = o
	for _, ref := range o.owners {
		if c.dependents[ref.UID] == nil {
			c.dependents[ref.UID] = map[types.UID]bool{}
		}
		c.dependents[ref.UID][o.uid] = true
	}
	var owners []types.UID
	for _, ref := range o.owners {
		owners = append(owners, ref.UID)
	}
	c.mu.Unlock()
	if len(o.owners) > 0 || o.deleting && hasGCFinalizer(o.finalizers) {
		c.queue.Add(o.uid)
	}
	if o.deleting {
		// Dependents of an owner going in the foreground follow it.
		c.enqueueDependents(o.uid)
	}
	// An owner waiting in the foreground rechecks as dependents change.
	for _, uid := range owners {
		c.queue.Add(uid)
	}
}

func (c *Collector) forget(obj any) {
	if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	if m, err := meta.Accessor(obj); err == nil {
		c.forgetUID(m.GetUID())
	}
}

// forgetUID takes an object out of the graph, and queues its owners
// (which may wait for it) and its dependents (which may be orphans now).
func (c *Collector) forgetUID(uid types.UID) {
	c.mu.Lock()
	if old := c.objects[uid]; old != nil {
		for _, ref := range old.owners {
			delete(c.dependents[ref.UID], uid)
			c.queue.Add(ref.UID) // an owner waiting for its dependents
		}
	}
	delete(c.objects, uid)
	c.mu.Unlock()
	c.enqueueDependents(uid)
}

func (c *Collector) enqueueDependents(owner types.UID) {
	c.mu.Lock()
	deps := make([]types.UID, 0, len(c.dependents[owner]))
	for uid := range c.dependents[owner] {
		deps = append(deps, uid)
	}
	c.mu.Unlock()
	for _, uid := range deps {
		c.queue.Add(uid)
	}
}

func hasGCFinalizer(f []string) bool {
	return slices.Contains(f, metav1.FinalizerOrphanDependents) || slices.Contains(f, metav1.FinalizerDeleteDependents)
}

func (c *Collector) snapshot(uid types.UID) (*object, []*object) {
	c.mu.Lock()
	defer c.mu.Unlock()
	o := c.objects[uid]
	if o == nil {
		return nil, nil
	}
	var deps []*object
	for d := range c.dependents[uid] {
		if dep := c.objects[d]; dep != nil {
			deps = append(deps, dep)
		}
	}
	return o, deps
}

func (c *Collector) process(ctx context.Context, uid types.UID) error {
	o, deps := c.snapshot(uid)
	if o == nil {
		return nil
	}
	if o.deleting && hasGCFinalizer(o.finalizers) {
		// Dependents created just before the owner's deletion may not have
		// reached the collector's watches yet: let them settle before
		// deciding the owner has none left.
		if wait := settle - c.clock.Since(o.seenDeleting); wait > 0 {
			c.queue.AddAfter(uid, wait)
			return nil
		}
	}
	if o.deleting && slices.Contains(o.finalizers, metav1.FinalizerOrphanDependents) {
		return c.orphan(ctx, o, deps)
	}
	if o.deleting && slices.Contains(o.finalizers, metav1.FinalizerDeleteDependents) {
		return c.foreground(ctx, o, deps)
	}
	if len(o.owners) == 0 {
		return nil
	}
	return c.checkOwners(ctx, o)
}

// orphan unhooks the dependents, then lets the owner go.
func (c *Collector) orphan(ctx context.Context, o *object, deps []*object) error {
	for _, d := range deps {
		if err := c.removeOwners(ctx, d, []types.UID{o.uid}); err != nil {
			return err
		}
	}
	return c.removeFinalizer(ctx, o, metav1.FinalizerOrphanDependents)
}

// foreground settles each dependent as Kubernetes' collector does (one
// with another owner that stays only loses its reference to this one;
// the rest are deleted), and lets the owner go once none that blocks it
// is left.
func (c *Collector) foreground(ctx context.Context, o *object, deps []*object) error {
	blocking := 0
	for _, d := range deps {
		if blocks(d, o.uid) {
			blocking++
		}
		if d.deleting {
			continue
		}
		if err := c.checkOwners(ctx, d); err != nil {
			return err
		}
	}
	if blocking > 0 {
		return nil // back when they are gone or no longer block it
	}
	return c.removeFinalizer(ctx, o, metav1.FinalizerDeleteDependents)
}

// blocks reports whether dependent d holds its owner's foreground deletion.
func blocks(d *object, owner types.UID) bool {
	for _, ref := range d.owners {
		if ref.UID == owner {
			return ptr.Deref(ref.BlockOwnerDeletion, false)
		}
	}
	return false
}

// checkOwners deletes o when all its owners are gone, follows an owner's
// foreground deletion, and drops references to owners that are gone while
// others remain.
func (c *Collector) checkOwners(ctx context.Context, o *object) error {
	var solid, waiting, dangling []types.UID
	for _, ref := range o.owners {
		state, err := c.ownerState(ctx, o, ref)
		if err != nil {
			return err
		}
		switch state {
		case ownerGone:
			dangling = append(dangling, ref.UID)
		case ownerForeground:
			waiting = append(waiting, ref.UID)
		default:
			solid = append(solid, ref.UID)
		}
	}
	switch {
	case len(solid) > 0:
		if len(dangling)+len(waiting) > 0 {
			return c.removeOwners(ctx, o, append(dangling, waiting...))
		}
		return nil
	case o.deleting:
		return nil
	}
	// About to delete: the owners are read from the API first (the graph
	// may not have seen an owner added a moment ago) and the delete is
	// conditional on that version, as Kubernetes' collector does it.
	latest, err := c.resourceClient(o).Get(ctx, o.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if latest.UID != o.uid {
		return nil
	}
	if !sameOwners(latest.OwnerReferences, o.owners) {
		fresh := *o
		fresh.owners = latest.OwnerReferences
		return c.checkOwners(ctx, &fresh)
	}
	policy := metav1.DeletePropagationBackground
	if len(waiting) > 0 {
		policy = metav1.DeletePropagationForeground
	}
	return c.delete(ctx, o, policy, latest.ResourceVersion)
}

// sameOwners says whether two lists name the same owners.
func sameOwners(a, b []metav1.OwnerReference) bool {
	if len(a) != len(b) {
		return false
	}
	for _, ref := range a {
		if !slices.ContainsFunc(b, func(o metav1.OwnerReference) bool { return o.UID == ref.UID }) {
			return false
		}
	}
	return true
}

type ownerStatus int

const (
	ownerSolid ownerStatus = iota
	ownerForeground
	ownerGone
)

// ownerState finds the owner in the graph or, failing that, asks the API:
// only an owner the API does not have (or has under another UID) is gone.
func (c *Collector) ownerState(ctx context.Context, o *object, ref metav1.OwnerReference) (ownerStatus, error) {
	c.mu.Lock()
	owner := c.objects[ref.UID]
	c.mu.Unlock()
	if owner != nil {
		if owner.deleting && slices.Contains(owner.finalizers, metav1.FinalizerDeleteDependents) {
			return ownerForeground, nil
		}
		return ownerSolid, nil
	}
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	if err != nil {
		return ownerGone, nil
	}
	res, ok := c.kind(gv.WithKind(ref.Kind))
	if !ok {
		// A kind not watched may be one just served (a custom resource):
		// look again before judging.
		ran, err := c.discoverAgain(ctx)
		if err != nil {
			return ownerSolid, err
		}
		if res, ok = c.kind(gv.WithKind(ref.Kind)); !ok {
			// Kubernetes leaves a dependent of an owner whose kind it cannot
			// resolve alone; so does orch, rather than delete what may yet
			// have an owner. It is judged again when a discovery finds new
			// kinds, or in a moment if none ran just now.
			c.mu.Lock()
			c.unresolved[o.uid] = true
			c.mu.Unlock()
			if !ran {
				c.queue.AddAfter(o.uid, 3*time.Second)
			}
			return ownerSolid, nil
		}
	}
	ns := ""
	if res.namespaced {
		ns = o.namespace
	}
	live, err := c.client.Resource(res.gvr).Namespace(ns).Get(ctx, ref.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return ownerGone, nil
	case err != nil:
		return ownerSolid, err
	case live.UID != ref.UID:
		return ownerGone, nil
	case live.DeletionTimestamp != nil && slices.Contains(live.Finalizers, metav1.FinalizerDeleteDependents):
		return ownerForeground, nil
	}
	return ownerSolid, nil
}

// discoverAgain discovers, unless a discovery ran in the last seconds; it
// reports whether it ran.
func (c *Collector) discoverAgain(ctx context.Context) (bool, error) {
	c.discoverMu.Lock()
	recent := time.Since(c.discovered) < 2*time.Second
	c.discoverMu.Unlock()
	if recent {
		return false, nil
	}
	return true, c.discover(ctx, false)
}

func (c *Collector) kind(gvk schema.GroupVersionKind) (resource, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	res, ok := c.kinds[gvk]
	return res, ok
}

func (c *Collector) resourceClient(o *object) metadata.ResourceInterface {
	if o.res.namespaced {
		return c.client.Resource(o.res.gvr).Namespace(o.namespace)
	}
	return c.client.Resource(o.res.gvr)
}

// delete deletes o if it still is the object it was (its UID) at the
// version read (resourceVersion; "" for any): a conflict means it changed
// since, and its change brings it back to the collector.
func (c *Collector) delete(ctx context.Context, o *object, policy metav1.DeletionPropagation, resourceVersion string) error {
	pre := &metav1.Preconditions{UID: &o.uid}
	if resourceVersion != "" {
		pre.ResourceVersion = &resourceVersion
	}
	err := c.resourceClient(o).Delete(ctx, o.name, metav1.DeleteOptions{PropagationPolicy: &policy, Preconditions: pre})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	if err == nil {
		c.log.Debug("deleted", "resource", o.res.gvr.Resource, "namespace", o.namespace, "name", o.name, "propagation", policy)
	}
	return err
}

// removeOwners drops the references to the given owners from o.
func (c *Collector) removeOwners(ctx context.Context, o *object, owners []types.UID) error {
	var refs []map[string]any
	for _, uid := range owners {
		refs = append(refs, map[string]any{"$patch": "delete", "uid": uid})
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"ownerReferences": refs, "uid": o.uid}})
	if err != nil {
		return err
	}
	_, err = c.resourceClient(o).Patch(ctx, o.name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
	if apierrors.IsUnsupportedMediaType(err) {
		// Custom resources take no strategic merge patch: the list as the
		// collector last saw it is replaced, guarded by a test of it (a
		// change meanwhile fails the patch, and its event brings o back).
		var keep []metav1.OwnerReference
		for _, ref := range o.owners {
			if !slices.Contains(owners, ref.UID) {
				keep = append(keep, ref)
			}
		}
		if keep == nil {
			keep = []metav1.OwnerReference{}
		}
		if patch, err = json.Marshal([]map[string]any{
			{"op": "test", "path": "/metadata/uid", "value": o.uid},
			{"op": "test", "path": "/metadata/ownerReferences", "value": o.owners},
			{"op": "replace", "path": "/metadata/ownerReferences", "value": keep},
		}); err != nil {
			return err
		}
		_, err = c.resourceClient(o).Patch(ctx, o.name, types.JSONPatchType, patch, metav1.PatchOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err // a failed test too: tried again with what the collector sees then
	}
	if apierrors.IsNotFound(err) || apierrors.IsInvalid(err) {
		return nil // gone, or another object now has the name
	}
	return err
}

// removeFinalizer lets o go on, guarded by a test of the current list.
func (c *Collector) removeFinalizer(ctx context.Context, o *object, finalizer string) error {
	var rest []string
	for _, f := range o.finalizers {
		if f != finalizer {
			rest = append(rest, f)
		}
	}
	if rest == nil {
		rest = []string{}
	}
	patch, err := json.Marshal([]map[string]any{
		{"op": "test", "path": "/metadata/uid", "value": o.uid},
		{"op": "test", "path": "/metadata/finalizers", "value": o.finalizers},
		{"op": "replace", "path": "/metadata/finalizers", "value": rest},
	})
	if err != nil {
		return err
	}
	_, err = c.resourceClient(o).Patch(ctx, o.name, types.JSONPatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
