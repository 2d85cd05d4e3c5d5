// Package ingressstatus fills the status of the Ingresses orch's nodes
// serve, as an ingress controller reports where it serves them: each
// Ingress of a class whose controller is orch's gets the addresses of the
// Ready, schedulable nodes (every node serves it on ports 80 and 443) in
// status.loadBalancer.ingress, the same addresses ServiceLB gives a
// LoadBalancer Service. Ingresses of other classes are left to their
// controllers.
package ingressstatus

import (
	"context"
	"log/slog"

	"github.com/orch-dev/orch/internal/ingressclass"
	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/loops/controller"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	networkinglisters "k8s.io/client-go/listers/networking/v1"
	toolscache "k8s.io/client-go/tools/cache"
)

// Controller is the Ingress status loop.
type Controller struct {
	client    *kube.Client
	ingresses networkinglisters.IngressLister
	classes   networkinglisters.IngressClassLister
	nodes     corelisters.NodeLister
	synced    []toolscache.InformerSynced
	queue     *controller.Queue[string]
	log       *slog.Logger
}

// New registers the loop on the factory's informers.
func New(client *kube.Client, factory *kube.Informers, env controller.Env) (*Controller, error) {
	ings, classes, nodes := factory.Ingresses(), factory.IngressClasses(), factory.Nodes()
	c := &Controller{client: client, ingresses: ings.Lister(), classes: classes.Lister(), nodes: nodes.Lister(),
		synced: []toolscache.InformerSynced{ings.Informer().HasSynced, classes.Informer().HasSynced, nodes.Informer().HasSynced},
		queue:  controller.NewQueue[string]("ingressstatus", env), log: env.Log.With("loop", "ingressstatus")}
	enqueue := func(obj any) {
		if k, err := toolscache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			c.queue.Add(k)
		}
	}
	if _, err := ings.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		return nil, err
	}
	all := func(any) {
		list, _ := c.ingresses.List(labels.Everything())
		for _, in := range list {
			enqueue(in)
		}
	}
	if _, err := classes.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: all, DeleteFunc: all, UpdateFunc: func(_, obj any) { all(obj) },
	}); err != nil {
		return nil, err
	}
	if _, err := nodes.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: all, DeleteFunc: all,
		UpdateFunc: func(old, cur any) {
			if controller.ServingChanged(old.(*corev1.Node), cur.(*corev1.Node)) {
				all(cur)
			}
		},
	}); err != nil {
		return nil, err
	}
	return c, nil
}

// Run syncs until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	c.queue.Run(ctx, workers, c.synced, c.sync)
}

func (c *Controller) sync(ctx context.Context, key string) error {
	namespace, name, err := toolscache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	in, err := c.ingresses.Ingresses(namespace).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	classes, err := c.classes.List(labels.Everything())
	if err != nil {
		return err
	}
	if !ingressclass.Ours(classes)[ingressclass.Of(in)] {
		return nil // another controller's
	}
	want, err := c.addresses()
	if err != nil {
		return err
	}
	if equality.Semantic.DeepEqual(in.Status.LoadBalancer.Ingress, want) {
		return nil
	}
	updated := in.DeepCopy()
	updated.Status.LoadBalancer.Ingress = want
	_, err = c.client.Ingresses(namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		c.queue.Add(key) // gone, or changed since the informer saw it
		return nil
	}
	if err == nil {
		c.log.Info("ingress addresses", "ingress", key, "addresses", len(want))
	}
	return err
}

// addresses are the Ready, schedulable nodes' addresses, sorted.
func (c *Controller) addresses() ([]networkingv1.IngressLoadBalancerIngress, error) {
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	out := []networkingv1.IngressLoadBalancerIngress{}
	for _, ip := range controller.ServingAddresses(nodes, nil) {
		out = append(out, networkingv1.IngressLoadBalancerIngress{IP: ip})
	}
	return out, nil
}
