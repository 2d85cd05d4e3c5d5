// Package gateway is the controller of orch's Gateway API implementation:
// it installs the standard channel's definitions and the GatewayClass
// orch (install.go), gives each of orch's Gateways its address, and keeps
// the statuses of GatewayClasses, Gateways and HTTPRoutes and the routing
// configuration every node's proxy serves, all from one resolution
// (internal/gatewayapi), so that a status says what the proxies do.
//
// A Gateway's address is the cluster IP of a Service the loop makes for
// it (<gateway>-orch-gateway, owned by the Gateway, one port per listener
// port, with the addresses the Gateway names as external IPs). Its
// endpoints are the nodes themselves with internalTrafficPolicy and
// externalTrafficPolicy Local: each node's service proxy sends the
// Gateway's traffic to its own proxy, which tells Gateways apart by the
// address the client asked for. So every node serves every Gateway, also
// while the server is away.
package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"k8s.io/utils/ptr"
	"log/slog"
	"slices"
	"strconv"
	"strings"

	"github.com/orch-dev/orch/internal/gatewayapi"
	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/loops/controller"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	toolscache "k8s.io/client-go/tools/cache"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// managedBy marks the Services and EndpointSlices the loop makes.
const managedBy = "gateway.orch.io"

// Controller is the Gateway API loop.
type Controller struct {
	client     *kube.Client
	classes    kube.GatewayLister[*gatewayv1.GatewayClass]
	gateways   kube.GatewayLister[*gatewayv1.Gateway]
	routes     kube.GatewayLister[*gatewayv1.HTTPRoute]
	grants     kube.GatewayLister[*gatewayv1.ReferenceGrant]
	namespaces corelisters.NamespaceLister
	services   corelisters.ServiceLister
	slices     discoverylisters.EndpointSliceLister
	nodes      corelisters.NodeLister
	secrets    corelisters.SecretLister
	synced     []toolscache.InformerSynced
	queue      *controller.Queue[string]
	log        *slog.Logger
	// written is the configuration last written.
	written string
}

// New registers the loop on the factory's informers; Install must have
// put the definitions in first, or their informers never sync.
func New(client *kube.Client, factory *kube.Informers, env controller.Env) (*Controller, error) {
	classes, gws, routes, grants := factory.GatewayClasses(), factory.Gateways(), factory.HTTPRoutes(), factory.ReferenceGrants()
	nss, svcs, eps, nodes, secrets := factory.Namespaces(), factory.Services(), factory.EndpointSlices(), factory.Nodes(), factory.SecretsOfType(corev1.SecretTypeTLS)
	c := &Controller{client: client, classes: classes.Lister(), gateways: gws.Lister(), routes: routes.Lister(), grants: grants.Lister(),
		namespaces: nss.Lister(), services: svcs.Lister(), slices: eps.Lister(), nodes: nodes.Lister(), secrets: secrets.Lister(),
		queue: controller.NewQueue[string]("gateway", env), log: env.Log.With("loop", "gateway")}
	all := func(any) { c.queue.Add("") }
	handler := toolscache.ResourceEventHandlerFuncs{AddFunc: all, UpdateFunc: func(_, cur any) { all(cur) }, DeleteFunc: all}
	for _, inf := range []toolscache.SharedIndexInformer{classes.Informer(), gws.Informer(), routes.Informer(), grants.Informer(), secrets.Informer()} {
		if _, err := inf.AddEventHandler(handler); err != nil {
			return nil, err
		}
		c.synced = append(c.synced, inf.HasSynced)
	}
	// Of namespaces, Services and nodes only what the resolution reads.
	if _, err := nss.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: all, DeleteFunc: all,
		UpdateFunc: func(old, cur any) {
			if !equality.Semantic.DeepEqual(old.(*corev1.Namespace).Labels, cur.(*corev1.Namespace).Labels) {
				all(cur)
			}
		}}); err != nil {
		return nil, err
	}
	if _, err := svcs.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: all, DeleteFunc: all,
		UpdateFunc: func(old, cur any) {
			o, n := old.(*corev1.Service), cur.(*corev1.Service)
			if !equality.Semantic.DeepEqual(o.Spec, n.Spec) {
				all(cur)
			}
		}}); err != nil {
		return nil, err
	}
	if _, err := nodes.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: all, DeleteFunc: all,
		UpdateFunc: func(old, cur any) {
			if internalIP(old.(*corev1.Node)) != internalIP(cur.(*corev1.Node)) {
				all(cur)
			}
		}}); err != nil {
		return nil, err
	}
	c.synced = append(c.synced, nss.Informer().HasSynced, svcs.Informer().HasSynced, eps.Informer().HasSynced, nodes.Informer().HasSynced)
	return c, nil
}

// Run syncs until ctx ends. Everything is resolved at once: a change to
// one object can change the status of many.
func (c *Controller) Run(ctx context.Context) {
	c.queue.Add("")
	c.queue.Run(ctx, 1, c.synced, func(ctx context.Context, _ string) error { return c.sync(ctx) })
}

func (c *Controller) sync(ctx context.Context) error {
	cl := gatewayapi.Cluster{
		NamespaceLabels: func(name string) (map[string]string, bool) {
			ns, err := c.namespaces.Get(name)
			if err != nil {
				return nil, false
			}
			return ns.Labels, true
		},
		Service: func(namespace, name string) *corev1.Service {
			svc, _ := c.services.Services(namespace).Get(name)
			return svc
		},
		Certificate: func(namespace, name string) error {
			s, err := c.secrets.Secrets(namespace).Get(name)
			if err != nil {
				return fmt.Errorf("no %s Secret of that name", corev1.SecretTypeTLS)
			}
			return gatewayapi.CheckCertificate(s)
		},
	}
	var err error
	if cl.Classes, err = c.classes.List(labels.Everything()); err != nil {
		return err
	}
	if cl.Gateways, err = c.gateways.List(labels.Everything()); err != nil {
		return err
	}
	if cl.Routes, err = c.routes.List(labels.Everything()); err != nil {
		return err
	}
	if cl.Grants, err = c.grants.List(labels.Everything()); err != nil {
		return err
	}
	// Each of orch's Gateways gets its Service first: its address is the
	// Service's cluster IP.
	var errs []error
	cl.Addresses = func(gw *gatewayv1.Gateway) ([]gatewayv1.GatewayStatusAddress, string) {
		addrs, why, err := c.address(ctx, gw)
		if err != nil {
			errs = append(errs, err)
		}
		return addrs, why
	}
	resolved := gatewayapi.Resolve(cl)
	if err := c.removeServices(ctx, resolved); err != nil {
		errs = append(errs, err)
	}
	if err := c.writeConfig(ctx, resolved.Config); err != nil {
		errs = append(errs, err)
	}
	for _, gc := range cl.Classes {
		if st, ok := resolved.Classes[gc.Name]; ok && !sameStatus(gc.Status, st) {
			next := gc.DeepCopy()
			next.Status = st
			if _, err := c.client.GatewayClasses().UpdateStatus(ctx, next, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("gatewayClass %s status: %w", gc.Name, err))
			}
		}
	}
	for _, gw := range cl.Gateways {
		if st, ok := resolved.Gateways[types.NamespacedName{Namespace: gw.Namespace, Name: gw.Name}]; ok && !sameStatus(gw.Status, st) {
			next := gw.DeepCopy()
			next.Status = st
			if _, err := c.client.Gateways(gw.Namespace).UpdateStatus(ctx, next, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("gateway %s/%s status: %w", gw.Namespace, gw.Name, err))
			}
		}
	}
	for _, rt := range cl.Routes {
		parents := routeParents(rt, resolved.Routes[types.NamespacedName{Namespace: rt.Namespace, Name: rt.Name}])
		if sameStatus(rt.Status.Parents, parents) {
			continue
		}
		next := rt.DeepCopy()
		next.Status.Parents = parents
		if _, err := c.client.HTTPRoutes(rt.Namespace).UpdateStatus(ctx, next, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("httpRoute %s/%s status: %w", rt.Namespace, rt.Name, err))
		}
	}
	if len(errs) > 0 {
		// A conflict is an object changed since the informer saw it: its
		// event brings the loop back.
		return errs[0]
	}
	return nil
}

// routeParents are the route's parent statuses: other controllers' kept,
// orch's replaced by ours.
func routeParents(rt *gatewayv1.HTTPRoute, ours []gatewayv1.RouteParentStatus) []gatewayv1.RouteParentStatus {
	out := []gatewayv1.RouteParentStatus{}
	for _, p := range rt.Status.Parents {
		if p.ControllerName != gatewayapi.ControllerName {
			out = append(out, p)
		}
	}
	return append(out, ours...)
}

// sameStatus compares statuses without the conditions' transition times,
// which Resolve sets afresh for conditions that changed.
func sameStatus(a, b any) bool {
	strip := func(v any) string {
		data, _ := json.Marshal(v)
		var generic any
		_ = json.Unmarshal(data, &generic)
		dropTimes(generic)
		out, _ := json.Marshal(generic)
		return string(out)
	}
	return strip(a) == strip(b)
}

func dropTimes(v any) {
	switch x := v.(type) {
	case map[string]any:
		delete(x, "lastTransitionTime")
		for _, e := range x {
			dropTimes(e)
		}
	case []any:
		for _, e := range x {
			dropTimes(e)
		}
	}
}

// ServiceName is the name of a Gateway's Service: <gateway>-orch-gateway,
// shortened with a hash of the whole when that is too long for a Service.
func ServiceName(gateway string) string {
	name := gateway + "-orch-gateway"
	if len(name) <= 63 {
		return name
	}
	sum := sha256.Sum256([]byte(gateway))
	return gateway[:63-len("-orch-gateway")-9] + "-" + hex.EncodeToString(sum[:4]) + "-orch-gateway"
}

// address makes sure of the Gateway's Service and endpoints, and returns
// its addresses (the cluster IP, then those it names), or why it has
// none yet.
func (c *Controller) address(ctx context.Context, gw *gatewayv1.Gateway) ([]gatewayv1.GatewayStatusAddress, string, error) {
	want := c.service(gw)
	svcs := c.client.Services(gw.Namespace)
	svc, err := c.services.Services(gw.Namespace).Get(want.Name)
	switch {
	case apierrors.IsNotFound(err):
		if svc, err = svcs.Create(ctx, want, metav1.CreateOptions{}); err != nil {
			return nil, "its Service cannot be made: " + err.Error(), fmt.Errorf("gateway %s/%s: %w", gw.Namespace, gw.Name, err)
		}
		c.log.Info("gateway address", "gateway", gw.Namespace+"/"+gw.Name, "service", svc.Name, "clusterIP", svc.Spec.ClusterIP)
	case err != nil:
		return nil, err.Error(), err
	case !metav1.IsControlledBy(svc, gw):
		return nil, fmt.Sprintf("Service %s is not the Gateway's: rename one of them", want.Name), nil
	case !equality.Semantic.DeepEqual(svc.Spec.Ports, want.Spec.Ports) || !equality.Semantic.DeepEqual(svc.Spec.ExternalIPs, want.Spec.ExternalIPs) ||
		svc.Spec.ExternalTrafficPolicy != want.Spec.ExternalTrafficPolicy || !subset(want.Labels, svc.Labels) || !subset(want.Annotations, svc.Annotations):
		next := svc.DeepCopy()
		next.Spec.Ports, next.Spec.ExternalIPs, next.Spec.ExternalTrafficPolicy = want.Spec.Ports, want.Spec.ExternalIPs, want.Spec.ExternalTrafficPolicy
		next.Labels, next.Annotations = merged(next.Labels, want.Labels), merged(next.Annotations, want.Annotations)
		if svc, err = svcs.Update(ctx, next, metav1.UpdateOptions{}); err != nil {
			return nil, "its Service cannot be updated: " + err.Error(), fmt.Errorf("gateway %s/%s: %w", gw.Namespace, gw.Name, err)
		}
	}
	if err := c.endpoints(ctx, svc); err != nil {
		return nil, "its endpoints cannot be written: " + err.Error(), err
	}
	if svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return nil, "its Service has no cluster IP yet", nil
	}
	// The addresses it names, when it names some; else its own.
	ip := gatewayv1.IPAddressType
	addrs := []gatewayv1.GatewayStatusAddress{}
	for _, a := range svc.Spec.ExternalIPs {
		addrs = append(addrs, gatewayv1.GatewayStatusAddress{Type: &ip, Value: a})
	}
	if len(addrs) == 0 {
		addrs = append(addrs, gatewayv1.GatewayStatusAddress{Type: &ip, Value: svc.Spec.ClusterIP})
	}
	return addrs, "", nil
}

// service is the Service a Gateway should have.
func (c *Controller) service(gw *gatewayv1.Gateway) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: ServiceName(gw.Name), Namespace: gw.Namespace,
			Labels: map[string]string{gatewayv1.GatewayNameLabelKey: gw.Name, gatewayv1.GatewayClassNameLabelKey: string(gw.Spec.GatewayClassName),
				discoveryv1.LabelManagedBy: managedBy},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(gw, gatewayapi.GroupVersion.WithKind("Gateway"))}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, InternalTrafficPolicy: ptr.To(corev1.ServiceInternalTrafficPolicyLocal)},
	}
	// The Gateway's infrastructure labels and annotations go on what is
	// made for it, as the spec asks (orch's own labels win).
	if infra := gw.Spec.Infrastructure; infra != nil {
		for k, v := range infra.Labels {
			if _, ours := svc.Labels[string(k)]; !ours {
				svc.Labels[string(k)] = string(v)
			}
		}
		for k, v := range infra.Annotations {
			if svc.Annotations == nil {
				svc.Annotations = map[string]string{}
			}
			svc.Annotations[string(k)] = string(v)
		}
	}
	var ports []int32
	for _, l := range gw.Spec.Listeners {
		ports = append(ports, int32(l.Port))
	}
	slices.Sort(ports)
	for _, p := range slices.Compact(ports) {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: "port-" + strconv.Itoa(int(p)), Protocol: corev1.ProtocolTCP, Port: p, TargetPort: intstr.FromInt32(p)})
	}
	for _, a := range gw.Spec.Addresses {
		if (a.Type == nil || *a.Type == gatewayv1.IPAddressType) && gatewayapi.UsableAddress(a.Value) {
			svc.Spec.ExternalIPs = append(svc.Spec.ExternalIPs, a.Value)
		}
	}
	if len(svc.Spec.ExternalIPs) > 0 {
		svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}
	return svc
}

// endpoints keeps the Service's EndpointSlice: every node, at its
// internal address, on the listener ports.
func (c *Controller) endpoints(ctx context.Context, svc *corev1.Service) error {
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		return err
	}
	slices.SortFunc(nodes, func(a, b *corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	want := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: svc.Name, Namespace: svc.Namespace,
			Labels:          map[string]string{discoveryv1.LabelServiceName: svc.Name, discoveryv1.LabelManagedBy: managedBy},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(svc, corev1.SchemeGroupVersion.WithKind("Service"))}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{},
	}
	for _, p := range svc.Spec.Ports {
		want.Ports = append(want.Ports, discoveryv1.EndpointPort{Name: ptr.To(p.Name), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(p.Port)})
	}
	for _, n := range nodes {
		ip := internalIP(n)
		if ip == "" || !controller.EndpointAddress(ip) {
			continue
		}
		// Ready always: each node takes only its own endpoint (Local
		// policies), and a node's proxy serves while it runs.
		want.Endpoints = append(want.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, NodeName: ptr.To(n.Name),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}})
	}
	eps := c.client.EndpointSlices(svc.Namespace)
	have, err := c.slices.EndpointSlices(svc.Namespace).Get(svc.Name)
	switch {
	case apierrors.IsNotFound(err):
		_, err = eps.Create(ctx, want, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil // the informer has not seen it yet
		}
		return err
	case err != nil:
		return err
	case equality.Semantic.DeepEqual(have.Endpoints, want.Endpoints) && equality.Semantic.DeepEqual(have.Ports, want.Ports):
		return nil
	}
	next := have.DeepCopy()
	next.Endpoints, next.Ports = want.Endpoints, want.Ports
	_, err = eps.Update(ctx, next, metav1.UpdateOptions{})
	return err
}

// internalIP is the IPv4 address a node's service proxy reaches it at.
func internalIP(n *corev1.Node) string {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	return controller.NodeAddress(n)
}

// removeServices deletes the Services of Gateways no longer orch's (those
// of deleted Gateways go with them, by their owner reference).
func (c *Controller) removeServices(ctx context.Context, resolved gatewayapi.Resolved) error {
	sel := labels.SelectorFromSet(labels.Set{discoveryv1.LabelManagedBy: managedBy})
	svcs, err := c.services.List(sel)
	if err != nil {
		return err
	}
	for _, svc := range svcs {
		gw := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Labels[gatewayv1.GatewayNameLabelKey]}
		if _, ok := resolved.Gateways[gw]; ok {
			continue
		}
		if err := c.client.Services(svc.Namespace).Delete(ctx, svc.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// writeConfig writes the nodes' configuration when it changed.
func (c *Controller) writeConfig(ctx context.Context, cfg gatewayapi.Config) error {
	data, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	if string(data) == c.written {
		return nil
	}
	cms := c.client.ConfigMaps(gatewayapi.ConfigNamespace)
	want := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: gatewayapi.ConfigName, Namespace: gatewayapi.ConfigNamespace,
		Labels: map[string]string{discoveryv1.LabelManagedBy: managedBy}}, Data: map[string]string{gatewayapi.ConfigKey: string(data)}}
	have, err := cms.Get(ctx, gatewayapi.ConfigName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = cms.Create(ctx, want, metav1.CreateOptions{})
	case err == nil && have.Data[gatewayapi.ConfigKey] != string(data):
		next := have.DeepCopy()
		next.Data = want.Data
		_, err = cms.Update(ctx, next, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("gateway routes: %w", err)
	}
	c.written = string(data)
	return nil
}

// subset reports whether have holds every key of want with its value.
func subset(want, have map[string]string) bool {
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
	}
	return true
}

// merged is have with want's keys set.
func merged(have, want map[string]string) map[string]string {
	if len(want) == 0 {
		return have
	}
	if have == nil {
		have = map[string]string{}
	}
	for k, v := range want {
		have[k] = v
	}
	return have
}
