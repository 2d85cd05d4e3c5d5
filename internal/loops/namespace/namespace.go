// Package namespace empties namespaces that are being deleted, as
// Kubernetes' namespace controller does: it deletes every object of every
// namespaced resource in it, waits for the ones that finish slowly (pods
// with a grace period, objects with finalizers), and then removes the
// "kubernetes" finalizer, which lets the namespace go.
package namespace

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
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
	resources, err := c.namespacedResources(ctx)
	if err != nil {
		return false, err
	}
	left := 0
	for _, gvr := range resources {
		n, err := c.empty(ctx, gvr, name)
		if err != nil {
			return false, err
		}
		left += n
	}
	if left > 0 {
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

// empty deletes every object of gvr in the namespace and returns how many
// are still there (finishing gracefully, or held by finalizers).
func (c *Controller) empty(ctx context.Context, gvr schema.GroupVersionResource, namespace string) (int, error) {
	client := c.meta.Resource(gvr).Namespace(namespace)
	list, err := client.List(ctx, metav1.ListOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) || apierrors.IsMethodNotSupported(err) {
			return 0, nil
		}
		return 0, err
	}
	if len(list.Items) == 0 {
		return 0, nil
	}
	background := metav1.DeletePropagationBackground
	if err := client.DeleteCollection(ctx, metav1.DeleteOptions{PropagationPolicy: &background}, metav1.ListOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return 0, fmt.Errorf("delete %s in %s: %w", gvr.Resource, namespace, err)
	}
	list, err = client.List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	return len(list.Items), nil
}
