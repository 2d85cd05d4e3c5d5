// Package clusterdns keeps the kube-dns Service's endpoints: every node's
// agent answers the cluster DNS on its own address, and the Service
// (internalTrafficPolicy Local) sends each pod's questions to its own
// node. The endpoints are the nodes' InternalIPs, ready while the node
// is, on the Service's target ports. A kube-dns with a selector is
// someone else's (CoreDNS the user runs) and left to the endpoints loop.
package clusterdns

import (
	"context"
	"log/slog"
	"net/netip"
	"sort"

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

// The Service and the slice the loop keeps.
const (
	serviceName = "kube-dns"
	sliceName   = "kube-dns-nodes"
	managedBy   = "clusterdns.orch.dev"
	key         = metav1.NamespaceSystem + "/" + serviceName
)

// Controller is the cluster DNS endpoints loop.
type Controller struct {
	client   *kube.Client
	services corelisters.ServiceLister
	nodes    corelisters.NodeLister
	slices   discoverylisters.EndpointSliceLister
	synced   []toolscache.InformerSynced
	queue    *controller.Queue[string]
	log      *slog.Logger
}

// New registers the loop on the factory's informers.
func New(client *kube.Client, factory *kube.Informers, env controller.Env) (*Controller, error) {
	svcs, nodes, eps := factory.Services(), factory.Nodes(), factory.EndpointSlices()
	c := &Controller{client: client, services: svcs.Lister(), nodes: nodes.Lister(), slices: eps.Lister(),
		synced: []toolscache.InformerSynced{svcs.Informer().HasSynced, nodes.Informer().HasSynced, eps.Informer().HasSynced},
		queue:  controller.NewQueue[string]("clusterdns", env), log: env.Log.With("loop", "clusterdns")}
	wake := func(any) { c.queue.Add(key) }
	if _, err := nodes.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: wake, DeleteFunc: wake,
		// Nodes report their status every few seconds: only readiness and
		// addresses matter here.
		UpdateFunc: func(old, cur any) {
			o, n := old.(*corev1.Node), cur.(*corev1.Node)
			if controller.NodeReady(o) != controller.NodeReady(n) || internalIP(o) != internalIP(n) {
				wake(cur)
			}
		},
	}); err != nil {
		return nil, err
	}
	ours := func(obj any) {
		if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if m, ok := obj.(metav1.Object); ok && m.GetNamespace() == metav1.NamespaceSystem && (m.GetName() == serviceName || m.GetName() == sliceName) {
			wake(obj)
		}
	}
	for _, inf := range []toolscache.SharedIndexInformer{svcs.Informer(), eps.Informer()} {
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc: ours, UpdateFunc: func(_, obj any) { ours(obj) }, DeleteFunc: ours,
		}); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Run keeps the endpoints until ctx ends.
func (c *Controller) Run(ctx context.Context) {
	c.queue.Run(ctx, 1, c.synced, func(ctx context.Context, _ string) error { return c.sync(ctx) })
}

func (c *Controller) sync(ctx context.Context) error {
	api := c.client.EndpointSlices(metav1.NamespaceSystem)
	svc, err := c.services.Services(metav1.NamespaceSystem).Get(serviceName)
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	current, cerr := c.slices.EndpointSlices(metav1.NamespaceSystem).Get(sliceName)
	if cerr != nil && !apierrors.IsNotFound(cerr) {
		return cerr
	}
	if svc == nil || len(svc.Spec.Selector) > 0 {
		// No kube-dns, or the user's: its endpoints are not ours to keep.
		if current != nil && current.Labels[discoveryv1.LabelManagedBy] == managedBy {
			if err := api.Delete(ctx, sliceName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
		}
		return nil
	}
	want, err := c.slice(svc)
	if err != nil {
		return err
	}
	switch {
	case current == nil:
		_, err = api.Create(ctx, want, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			c.queue.Add(key)
			return nil
		}
	case equality.Semantic.DeepEqual(current.Endpoints, want.Endpoints) && equality.Semantic.DeepEqual(current.Ports, want.Ports) &&
		equality.Semantic.DeepEqual(current.Labels, want.Labels):
		return nil
	default:
		updated := current.DeepCopy()
		updated.Labels, updated.Endpoints, updated.Ports, updated.OwnerReferences = want.Labels, want.Endpoints, want.Ports, want.OwnerReferences
		_, err = api.Update(ctx, updated, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			c.queue.Add(key)
			return nil
		}
	}
	if err == nil {
		c.log.Info("cluster DNS endpoints", "nodes", len(want.Endpoints))
	}
	return err
}

// slice is the kube-dns slice as the nodes stand: one endpoint per node
// with an InternalIP an endpoint may have, ready while the node is, on
// the Service's target ports.
func (c *Controller) slice(svc *corev1.Service) (*discoveryv1.EndpointSlice, error) {
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: sliceName, Namespace: metav1.NamespaceSystem,
			Labels: map[string]string{discoveryv1.LabelServiceName: serviceName, discoveryv1.LabelManagedBy: managedBy},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: svc.Name, UID: svc.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for _, p := range svc.Spec.Ports {
		port := p.TargetPort.IntValue()
		if port <= 0 {
			port = int(p.Port)
		}
		s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: ptr.To(p.Name), Port: ptr.To(int32(port)), Protocol: ptr.To(p.Protocol)})
	}
	for _, n := range nodes {
		ip := internalIP(n)
		if addr, err := netip.ParseAddr(ip); err != nil || !addr.Is4() || !controller.EndpointAddress(ip) {
			continue // no address a Service may send to (a node at 127.0.0.1)
		}
		r := controller.NodeReady(n)
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, NodeName: ptr.To(n.Name),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(r), Serving: ptr.To(r), Terminating: ptr.To(false)}})
	}
	// sort.Slice, not slices.SortFunc: a generic sort of a struct type
	// costs the binary budget (design.md) some 15 KB.
	sort.Slice(s.Endpoints, func(i, j int) bool { return *s.Endpoints[i].NodeName < *s.Endpoints[j].NodeName })
	return s, nil
}

func internalIP(n *corev1.Node) string {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	return ""
}
