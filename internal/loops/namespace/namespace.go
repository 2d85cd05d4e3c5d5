// Package namespace empties namespaces that are being deleted, as
// Kubernetes' namespace controller does: it deletes the pods first, and
// every object of every other namespaced resource once no pod is left (so
// what a pod still uses outlives it), waits for the ones that finish
// slowly (pods with a grace period, objects with finalizers), reports its
// progress in the namespace's deletion conditions, and then removes the
// "kubernetes" finalizer, which lets the namespace go.
package namespace

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/loops/controller"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/metadata"
	toolscache "k8s.io/client-go/tools/cache"
)

// recheck is how soon a namespace still holding objects is looked at again.
const recheck = 2 * time.Second

// Controller is the namespace deletion loop.
type Controller struct {
	client     *kube.Client
	meta       metadata.Interface
	namespaces corelisters.NamespaceLister
	synced     toolscache.InformerSynced
	queue      *controller.Queue[string]
	log        *slog.Logger
}

// New registers the controller on the factory's namespace informer.
func New(client *kube.Client, factory *kube.Informers, env controller.Env) (*Controller, error) {
	ns := factory.Namespaces()
	c := &Controller{
		client: client, meta: client.Metadata(), namespaces: ns.Lister(), synced: ns.Informer().HasSynced,
		queue: controller.NewQueue[string]("namespace", env),
		log:   env.Log.With("loop", "namespace"),
	}
	enqueue := func(obj any) {
		if n, ok := obj.(*corev1.Namespace); ok && n.DeletionTimestamp != nil {
			c.queue.Add(n.Name)
		}
	}
	if _, err := ns.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		return nil, err
	}
	return c, nil
}

// Run empties deleted namespaces until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	c.queue.Run(ctx, workers, []toolscache.InformerSynced{c.synced}, c.syncNamespace)
}

// syncNamespace empties a namespace, looking again soon while objects
// are still on their way out.
func (c *Controller) syncNamespace(ctx context.Context, name string) error {
	left, err := c.sync(ctx, name)
	if err == nil && left {
		c.queue.AddAfter(name, recheck)
	}
	return err
}

// sync deletes what is in the namespace; it reports whether objects are
// still on their way out.
func (c *Controller) sync(ctx context.Context, name string) (bool, error) {
	ns, err := c.namespaces.Get(name)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if ns.DeletionTimestamp == nil || !slices.Contains(ns.Spec.Finalizers, corev1.FinalizerKubernetes) {
		return false, nil
	}
	progress := &deletion{remaining: map[string]int{}, finalizers: map[string]int{}}
	resources, err := c.namespacedResources(ctx)
	if err != nil {
		progress.discovery = err
	}
	// Pods go first: what they use (config, secrets, claims, service
	// accounts) stays until they are gone.
	pods := schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	c.empty(ctx, pods, name, progress)
	if progress.podsLeft == nil {
		for _, gvr := range resources {
			if gvr != pods {
				c.empty(ctx, gvr, name, progress)
			}
		}
	}
	if err := c.report(ctx, ns, progress); err != nil {
		return false, err
	}
	if progress.discovery != nil || len(progress.failed) > 0 {
		return false, errors.Join(append(progress.failed, progress.discovery)...)
	}
	if len(progress.remaining) > 0 {
		return true, nil
	}
	finalized := ns.DeepCopy()
	finalized.Spec.Finalizers = slices.DeleteFunc(finalized.Spec.Finalizers, func(f corev1.FinalizerName) bool { return f == corev1.FinalizerKubernetes })
	if err := c.client.FinalizeNamespace(ctx, finalized, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return false, fmt.Errorf("finalize namespace %s: %w", name, err)
	}
	c.log.Info("namespace emptied", "namespace", name)
	return false, nil
}

// namespacedResources are the resources that can hold objects in a
// namespace and be deleted.
func (c *Controller) namespacedResources(ctx context.Context) ([]schema.GroupVersionResource, error) {
	all, err := c.client.ServerResources(ctx)
	if err != nil {
		return nil, err
	}
	var out []schema.GroupVersionResource
	for _, r := range all {
		if r.Namespaced && r.Has("list", "deletecollection") {
			out = append(out, r.GroupVersionResource())
		}
	}
	return out, nil
}

// deletion is one pass's progress at emptying a namespace.
type deletion struct {
	discovery error
	failed    []error
	podsLeft  error
	// remaining counts the objects still there, per resource (and
	// group); finalizers counts those held, per finalizer.
	remaining, finalizers map[string]int
}

// empty deletes every object of gvr in the namespace and notes what is
// still there (finishing gracefully, or held by finalizers).
func (c *Controller) empty(ctx context.Context, gvr schema.GroupVersionResource, namespace string, d *deletion) {
	client := c.meta.Resource(gvr).Namespace(namespace)
	list, err := client.List(ctx, metav1.ListOptions{})
	if err != nil {
		if !apierrors.IsNotFound(err) && !apierrors.IsMethodNotSupported(err) {
			d.failed = append(d.failed, fmt.Errorf("list %s: %w", gvr.Resource, err))
		}
		return
	}
	if len(list.Items) == 0 {
		return
	}
	background := metav1.DeletePropagationBackground
	if err := client.DeleteCollection(ctx, metav1.DeleteOptions{PropagationPolicy: &background}, metav1.ListOptions{}); err != nil && !apierrors.IsNotFound(err) {
		d.failed = append(d.failed, fmt.Errorf("delete %s: %w", gvr.Resource, err))
		return
	}
	if list, err = client.List(ctx, metav1.ListOptions{}); err != nil {
		d.failed = append(d.failed, fmt.Errorf("list %s: %w", gvr.Resource, err))
		return
	}
	if len(list.Items) == 0 {
		return
	}
	d.remaining[gvr.Resource+"."+gvr.Group] += len(list.Items)
	for _, item := range list.Items {
		for _, f := range item.Finalizers {
			d.finalizers[f]++
		}
	}
	if gvr.Resource == "pods" && gvr.Group == "" {
		// As on Kubernetes: the rest waits for the pods, which its
		// conditions report as a content failure.
		d.podsLeft = fmt.Errorf("unexpected items still remain in namespace: %s for gvr: %s", namespace, gvr)
	}
}

// report writes the namespace's deletion conditions as Kubernetes' namespace
// controller words them, when they changed.
func (c *Controller) report(ctx context.Context, ns *corev1.Namespace, d *deletion) error {
	failed := map[corev1.NamespaceConditionType]corev1.NamespaceCondition{}
	if d.discovery != nil {
		failed[corev1.NamespaceDeletionDiscoveryFailure] = corev1.NamespaceCondition{Reason: "DiscoveryFailed", Message: d.discovery.Error()}
	}
	if errs := append(slices.Clone(d.failed), d.podsLeft); len(errs) > 1 || d.podsLeft != nil {
		var msgs []string
		for _, err := range errs {
			if err != nil {
				msgs = append(msgs, err.Error())
			}
		}
		sort.Strings(msgs)
		failed[corev1.NamespaceDeletionContentFailure] = corev1.NamespaceCondition{Reason: "ContentDeletionFailed",
			Message: fmt.Sprintf("Failed to delete all resource types, %d remaining: %s", len(msgs), strings.Join(msgs, ", "))}
	}
	if len(d.remaining) > 0 {
		var parts []string
		for r, n := range d.remaining {
			parts = append(parts, fmt.Sprintf("%s has %d resource instances", r, n))
		}
		sort.Strings(parts)
		failed[corev1.NamespaceContentRemaining] = corev1.NamespaceCondition{Reason: "SomeResourcesRemain",
			Message: "Some resources are remaining: " + strings.Join(parts, ", ")}
	}
	if len(d.finalizers) > 0 {
		var parts []string
		for f, n := range d.finalizers {
			parts = append(parts, fmt.Sprintf("%s in %d resource instances", f, n))
		}
		sort.Strings(parts)
		failed[corev1.NamespaceFinalizersRemaining] = corev1.NamespaceCondition{Reason: "SomeFinalizersRemain",
			Message: "Some content in the namespace has finalizers remaining: " + strings.Join(parts, ", ")}
	}
	updated := ns.DeepCopy()
	changed := false
	for _, ok := range deletionConditions {
		want, bad := failed[ok.Type]
		want.Type, want.Status = ok.Type, corev1.ConditionTrue
		if !bad {
			want = ok
		}
		i := slices.IndexFunc(updated.Status.Conditions, func(c corev1.NamespaceCondition) bool { return c.Type == ok.Type })
		switch {
		case i < 0:
			want.LastTransitionTime = metav1.Now()
			updated.Status.Conditions = append(updated.Status.Conditions, want)
			changed = true
		case updated.Status.Conditions[i].Status != want.Status || updated.Status.Conditions[i].Reason != want.Reason || updated.Status.Conditions[i].Message != want.Message:
			want.LastTransitionTime = updated.Status.Conditions[i].LastTransitionTime
			if updated.Status.Conditions[i].Status != want.Status {
				want.LastTransitionTime = metav1.Now()
			}
			updated.Status.Conditions[i] = want
			changed = true
		}
	}
	if !changed {
		return nil
	}
	if _, err := c.client.Namespaces().UpdateStatus(ctx, updated, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("namespace %s deletion conditions: %w", ns.Name, err)
	}
	return nil
}

// deletionConditions are the conditions a namespace being deleted carries,
// each as it reads when all is well.
var deletionConditions = []corev1.NamespaceCondition{
	{Type: corev1.NamespaceDeletionDiscoveryFailure, Status: corev1.ConditionFalse, Reason: "ResourcesDiscovered", Message: "All resources successfully discovered"},
	{Type: corev1.NamespaceDeletionGVParsingFailure, Status: corev1.ConditionFalse, Reason: "ParsedGroupVersions", Message: "All legacy kube types successfully parsed"},
	{Type: corev1.NamespaceDeletionContentFailure, Status: corev1.ConditionFalse, Reason: "ContentDeleted", Message: "All content successfully deleted, may be waiting on finalization"},
	{Type: corev1.NamespaceContentRemaining, Status: corev1.ConditionFalse, Reason: "ContentRemoved", Message: "All content successfully removed"},
	{Type: corev1.NamespaceFinalizersRemaining, Status: corev1.ConditionFalse, Reason: "ContentHasNoFinalizers", Message: "All content-preserving finalizers finished"},
}
