// Package servicelb gives Services of type LoadBalancer addresses on bare
// metal, as k3s's ServiceLB does: each such Service gets the addresses of
// the nodes that can take its traffic in status.loadBalancer.ingress (a
// node's ExternalIP, else its InternalIP; with externalTrafficPolicy
// Local, only the nodes with one of its endpoints), and every node's
// service proxy accepts the Service's ports on those addresses. Services
// with a loadBalancerClass are another load balancer's (MetalLB's, say).
package servicelb

import (
	"context"
	"log/slog"

	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/loops/controller"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

// Controller is the ServiceLB loop.
type Controller struct {
	client   *kube.Client
	services corelisters.ServiceLister
	nodes    corelisters.NodeLister
	slices   discoverylisters.EndpointSliceLister
	synced   []toolscache.InformerSynced
	queue    *controller.Queue[string]
	log      *slog.Logger
}

// New registers the controller on the factory's informers.
func New(client *kube.Client, factory *kube.Informers, env controller.Env) (*Controller, error) {
	svcs, nodes, eps := factory.Services(), factory.Nodes(), factory.EndpointSlices()
	c := &Controller{client: client, services: svcs.Lister(), nodes: nodes.Lister(), slices: eps.Lister(),
		synced: []toolscache.InformerSynced{svcs.Informer().HasSynced, nodes.Informer().HasSynced, eps.Informer().HasSynced},
		queue:  controller.NewQueue[string]("servicelb", env), log: env.Log.With("loop", "servicelb")}
	enqueue := func(obj any) {
		if k, err := toolscache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			c.queue.Add(k)
		}
	}
	if _, err := svcs.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		return nil, err
	}
	// A node coming, going or changing address changes every
	// LoadBalancer Service's addresses.
	all := func(any) {
		list, _ := c.services.List(labels.Everything())
		for _, s := range list {
			if s.Spec.Type == corev1.ServiceTypeLoadBalancer {
				enqueue(s)
			}
		}
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
	// Endpoints moving matter to Services with externalTrafficPolicy Local.
	byService := func(obj any) {
		if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if s, ok := obj.(*discoveryv1.EndpointSlice); ok && s.Labels[discoveryv1.LabelServiceName] != "" {
			c.queue.Add(s.Namespace + "/" + s.Labels[discoveryv1.LabelServiceName])
		}
	}
	if _, err := eps.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: byService, UpdateFunc: func(_, obj any) { byService(obj) }, DeleteFunc: byService,
	}); err != nil {
		return nil, err
	}
	return c, nil
}

// Run keeps the LoadBalancer Services' addresses until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	c.queue.Run(ctx, workers, c.synced, c.sync)
}

func (c *Controller) sync(ctx context.Context, key string) error {
	namespace, name, err := toolscache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	svc, err := c.services.Services(namespace).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer || svc.Spec.LoadBalancerClass != nil {
		return nil // not ours: a ClusterIP again, or another load balancer's
	}
	ingress, err := c.ingress(svc)
	if err != nil {
		return err
	}
	if equality.Semantic.DeepEqual(svc.Status.LoadBalancer.Ingress, ingress) {
		return nil
	}
	updated := svc.DeepCopy()
	updated.Status.LoadBalancer.Ingress = ingress
	_, err = c.client.Services(namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		c.queue.Add(key) // gone, or changed since the informer saw it
		return nil
	}
	if err == nil {
		c.log.Info("load balancer addresses", "service", key, "ingress", len(ingress))
	}
	return err
}

// ingress are the addresses of the Ready nodes that can take svc's
// traffic, sorted: with externalTrafficPolicy Local only those with a
// ready endpoint of it.
func (c *Controller) ingress(svc *corev1.Service) ([]corev1.LoadBalancerIngress, error) {
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	var local map[string]bool
	if svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
		local = map[string]bool{}
		slices, err := c.slices.EndpointSlices(svc.Namespace).List(labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: svc.Name}))
		if err != nil {
			return nil, err
		}
		for _, s := range slices {
			for _, e := range s.Endpoints {
				if e.NodeName != nil && (e.Conditions.Ready == nil || *e.Conditions.Ready) {
					local[*e.NodeName] = true
				}
			}
		}
	}
	var keep func(*corev1.Node) bool
	if local != nil {
		keep = func(n *corev1.Node) bool { return local[n.Name] }
	}
	ingress := []corev1.LoadBalancerIngress{}
	for _, ip := range controller.ServingAddresses(nodes, keep) {
		ingress = append(ingress, corev1.LoadBalancerIngress{IP: ip, IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)})
	}
	return ingress, nil
}
