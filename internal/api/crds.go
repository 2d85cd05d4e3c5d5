package api

import (
	"context"
	"errors"
	"fmt"
	"github.com/orch-dev/orch/internal/api/admission/plugins"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/orch-dev/orch/internal/api/customresource"
	"github.com/orch-dev/orch/internal/api/registry"
	"github.com/orch-dev/orch/internal/api/resources"
	"github.com/orch-dev/orch/internal/api/resources/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/util/workqueue"
)

// definitions serves the kinds of the stored CustomResourceDefinitions, as
// Kubernetes' apiextensions controllers do inside its API server: a
// definition whose names no other one holds is served (NamesAccepted,
// Established) within moments of being written; one being deleted has its
// custom resources deleted, then loses its cleanup finalizer.
type definitions struct {
	s   *Server
	st  *registry.Storage
	log *slog.Logger
	// queue holds the names of the definitions to reconcile.
	queue workqueue.TypedRateLimitingInterface[string]

	mu      sync.Mutex
	latest  map[string]*apiextensionsv1.CustomResourceDefinition // by name, as last seen
	serving map[string]servedDefinition                          // by name
}

// servedDefinition is what a definition is served as.
type servedDefinition struct {
	uid        string
	generation int64
	group      string
	names      apiextensionsv1.CustomResourceDefinitionNames
	gvrs       []schema.GroupVersionResource
	// terminating refuses new custom resources once the definition is
	// being deleted, as Kubernetes does.
	terminating *atomic.Bool
}

func newDefinitions(s *Server) *definitions {
	return &definitions{s: s, st: s.storage(apiextensionsv1.GroupName, "customresourcedefinitions"), log: s.log.With("component", "customresourcedefinitions"),
		queue:  workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		latest: map[string]*apiextensionsv1.CustomResourceDefinition{}, serving: map[string]servedDefinition{}}
}

// syncAll serves every stored definition before the server takes requests.
func (d *definitions) syncAll(ctx context.Context) error {
	list, err := d.st.List(ctx, "", &metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list CustomResourceDefinitions: %w", err)
	}
	items, _ := meta.ExtractList(list)
	d.Replace(items)
	for d.queue.Len() > 0 {
		d.next(ctx)
	}
	return nil
}

// Replace, Set and Delete follow the definitions' watch.
func (d *definitions) Replace(objs []runtime.Object) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for name := range d.latest {
		d.queue.Add(name) // gone ones are unserved
	}
	d.latest = map[string]*apiextensionsv1.CustomResourceDefinition{}
	for _, o := range objs {
		crd := o.(*apiextensionsv1.CustomResourceDefinition)
		d.latest[crd.Name] = crd
		d.queue.Add(crd.Name)
	}
}

func (d *definitions) Set(obj runtime.Object) {
	crd := obj.(*apiextensionsv1.CustomResourceDefinition)
	d.mu.Lock()
	d.latest[crd.Name] = crd
	d.mu.Unlock()
	d.queue.Add(crd.Name)
}

func (d *definitions) Delete(obj runtime.Object) {
	crd := obj.(*apiextensionsv1.CustomResourceDefinition)
	d.mu.Lock()
	delete(d.latest, crd.Name)
	d.mu.Unlock()
	d.queue.Add(crd.Name)
}

// work reconciles what changed until ctx ends.
func (d *definitions) work(ctx context.Context) {
	go func() {
		<-ctx.Done()
		d.queue.ShutDown()
	}()
	for d.next(ctx) {
	}
}

// next reconciles one definition: again after a back-off when that
// failed, and every second while it waits for its custom resources to go.
func (d *definitions) next(ctx context.Context) bool {
	name, shutdown := d.queue.Get()
	if shutdown {
		return false
	}
	defer d.queue.Done(name)
	waiting, err := d.reconcile(ctx, name)
	switch {
	case err != nil && ctx.Err() == nil:
		d.log.Warn("reconciling a CustomResourceDefinition", "name", name, "err", err)
		d.queue.AddRateLimited(name)
	case waiting:
		d.queue.Forget(name)
		d.queue.AddAfter(name, time.Second)
	default:
		d.queue.Forget(name)
	}
	return true
}

// reconcile serves a definition as it is, or cleans up after one being
// deleted: waiting says its custom resources are not all gone yet.
func (d *definitions) reconcile(ctx context.Context, name string) (waiting bool, err error) {
	d.mu.Lock()
	crd := d.latest[name]
	d.mu.Unlock()
	if crd == nil {
		d.unserve(name)
		return false, nil
	}
	if crd.DeletionTimestamp != nil {
		return d.cleanUp(ctx, crd)
	}
	conflict := d.conflict(crd)
	if conflict == "" {
		if err := d.serve(crd); err != nil {
			return false, err
		}
	} else {
		d.unserve(name)
	}
	return false, d.writeStatus(ctx, crd, conflict)
}

// conflict says which of crd's names another served definition of its
// group holds, or "".
func (d *definitions) conflict(crd *apiextensionsv1.CustomResourceDefinition) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	mine := crd.Spec.Names
	want := sets.New(append([]string{mine.Plural, mine.Singular}, mine.ShortNames...)...)
	for other, sd := range d.serving {
		if other == crd.Name || sd.group != crd.Spec.Group {
			continue
		}
		held := sets.New(append([]string{sd.names.Plural, sd.names.Singular}, sd.names.ShortNames...)...)
		if both := want.Intersection(held); both.Len() > 0 {
			return fmt.Sprintf("%q is already in use", sets.List(both)[0])
		}
		if sd.names.Kind == mine.Kind {
			return fmt.Sprintf("%q is already in use", mine.Kind)
		}
		if sd.names.ListKind == mine.ListKind {
			return fmt.Sprintf("%q is already in use", mine.ListKind)
		}
	}
	return ""
}

// serve puts the definition's served versions in the catalog, replacing
// what an older generation of it served.
func (d *definitions) serve(crd *apiextensionsv1.CustomResourceDefinition) error {
	d.mu.Lock()
	old, ok := d.serving[crd.Name]
	d.mu.Unlock()
	if ok && old.uid == string(crd.UID) && old.generation == crd.Generation {
		return nil
	}
	accepted := crd.DeepCopy()
	accepted.Status.AcceptedNames = crd.Spec.Names
	described, err := customresource.Describe(accepted, webhookServices{d.s})
	if err != nil {
		return err
	}
	sd := servedDefinition{uid: string(crd.UID), generation: crd.Generation, group: crd.Spec.Group, names: crd.Spec.Names, terminating: &atomic.Bool{}}
	for _, r := range described {
		sd.gvrs = append(sd.gvrs, r.GroupVersionResource())
	}
	terminating := sd.terminating
	refuseWhileTerminating := func(_ context.Context, obj, old runtime.Object) error {
		if old == nil && terminating.Load() {
			err := apierrors.NewMethodNotSupported(schema.GroupResource{Group: crd.Spec.Group, Resource: crd.Spec.Names.Plural}, "create")
			err.ErrStatus.Message = "create not allowed while custom resource definition is terminating"
			return err
		}
		return nil
	}
	if err := d.s.serveReplacing(old.gvrs, described, refuseWhileTerminating); err != nil {
		return err
	}
	d.mu.Lock()
	d.serving[crd.Name] = sd
	d.mu.Unlock()
	d.log.Info("serving custom resources", "definition", crd.Name, "versions", len(described))
	return nil
}

func (d *definitions) unserve(name string) {
	d.mu.Lock()
	sd, ok := d.serving[name]
	delete(d.serving, name)
	d.mu.Unlock()
	if ok {
		d.s.catalog.Remove(sd.gvrs...)
		d.log.Info("stopped serving custom resources", "definition", name)
	}
}

// writeStatus records the definition's accepted names, conditions and
// stored versions, as Kubernetes' naming and establishing controllers do.
func (d *definitions) writeStatus(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition, conflict string) error {
	status := crd.Status.DeepCopy()
	now := metav1.Now()
	set := func(t apiextensionsv1.CustomResourceDefinitionConditionType, ok bool, reason, message string) {
		c := apiextensionsv1.CustomResourceDefinitionCondition{Type: t, Status: apiextensionsv1.ConditionFalse, Reason: reason, Message: message, LastTransitionTime: now}
		if ok {
			c.Status = apiextensionsv1.ConditionTrue
		}
		for i := range status.Conditions {
			if status.Conditions[i].Type == t {
				if status.Conditions[i].Status == c.Status {
					c.LastTransitionTime = status.Conditions[i].LastTransitionTime
				}
				status.Conditions[i] = c
				return
			}
		}
		status.Conditions = append(status.Conditions, c)
	}
	if conflict == "" {
		status.AcceptedNames = crd.Spec.Names
		set(apiextensionsv1.NamesAccepted, true, "NoConflicts", "no conflicts found")
		set(apiextensionsv1.Established, true, "InitialNamesAccepted", "the initial names have been accepted")
	} else {
		set(apiextensionsv1.NamesAccepted, false, "NameConflict", conflict)
		set(apiextensionsv1.Established, false, "NotAccepted", "not all names are accepted")
	}
	for _, v := range crd.Spec.Versions {
		if v.Storage && !slices.Contains(status.StoredVersions, v.Name) {
			status.StoredVersions = append(status.StoredVersions, v.Name)
		}
	}
	if equality.Semantic.DeepEqual(status, &crd.Status) {
		return nil
	}
	_, _, err := d.st.Update(ctx, "", crd.Name, func(_ context.Context, current runtime.Object) (runtime.Object, error) {
		if current == nil {
			return nil, apierrors.NewNotFound(d.st.Resource.GroupResource(), crd.Name)
		}
		cur := current.(*apiextensionsv1.CustomResourceDefinition).DeepCopy()
		if cur.UID != crd.UID || cur.Generation != crd.Generation {
			return nil, errStale
		}
		cur.Status = *status
		return cur, nil
	}, registry.UpdateOptions{Subresource: "status", WriteOptions: registry.WriteOptions{FieldManager: "orch-apiextensions"}})
	if errors.Is(err, errStale) || apierrors.IsNotFound(err) {
		return nil // a newer version is on its way
	}
	return err
}

var errStale = errors.New("the definition changed")

// cleanUp deletes a terminating definition's custom resources (through
// the storage version, all namespaces), and once none is left, removes
// the cleanup finalizer so the definition goes.
func (d *definitions) cleanUp(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition) (waiting bool, err error) {
	d.mu.Lock()
	sd, served := d.serving[crd.Name]
	d.mu.Unlock()
	if served {
		sd.terminating.Store(true)
	}
	if served && len(sd.gvrs) > 0 {
		st := d.s.catalog.Load().Storage(sd.gvrs[0])
		if st != nil {
			list, err := st.List(ctx, "", &metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			items, _ := meta.ExtractList(list)
			for _, item := range items {
				m, _ := meta.Accessor(item)
				if m.GetDeletionTimestamp() != nil {
					continue
				}
				if _, err := st.Delete(ctx, m.GetNamespace(), m.GetName(), &metav1.DeleteOptions{}, registry.WriteOptions{}); err != nil && !apierrors.IsNotFound(err) {
					return false, err
				}
			}
			if list, err = st.List(ctx, "", &metav1.ListOptions{Limit: 1}); err != nil {
				return false, err
			} else if left, _ := meta.ExtractList(list); len(left) > 0 {
				return true, nil // finalizers of their own hold some
			}
		}
	}
	if !slices.Contains(crd.Finalizers, apiextensions.CleanupFinalizer) {
		return false, nil
	}
	_, _, err = d.st.Update(ctx, "", crd.Name, func(_ context.Context, current runtime.Object) (runtime.Object, error) {
		if current == nil {
			return nil, apierrors.NewNotFound(d.st.Resource.GroupResource(), crd.Name)
		}
		cur := current.(*apiextensionsv1.CustomResourceDefinition).DeepCopy()
		cur.Finalizers = slices.DeleteFunc(cur.Finalizers, func(f string) bool { return f == apiextensions.CleanupFinalizer })
		return cur, nil
	}, registry.UpdateOptions{WriteOptions: registry.WriteOptions{FieldManager: "orch-apiextensions"}})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return false, err
}

// serveReplacing serves the described resources in place of the old ones,
// in one change of the catalog, so no request finds neither.
func (s *Server) serveReplacing(old []schema.GroupVersionResource, described []*resources.Resource, admit plugins.Func) error {
	storages := make([]*registry.Storage, len(described))
	for i, r := range described {
		st := registry.New(s.store, r)
		st.Admit = s.admission.For(r, admit)
		st.External = s.clusterAdmission()
		if ctx := s.caches.Load(); ctx != nil {
			st.EnableCache(*ctx, s.log)
		}
		storages[i] = st
	}
	return s.catalog.Replace(old, storages...)
}
