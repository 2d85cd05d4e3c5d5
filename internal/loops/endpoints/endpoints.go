// Package endpoints keeps each Service's Endpoints and EndpointSlices in
// step with the pods its selector matches, as Kubernetes' endpoints and
// endpointslice controllers do: ready pods are addresses, pods not yet
// ready are notReadyAddresses (or endpoints with ready=false), named
// target ports are resolved per pod, and services without a selector are
// left to whoever manages their endpoints.
package endpoints

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/loops/controller"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	corelisters "k8s.io/client-go/listers/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

// Labels Kubernetes puts on the slices it manages.
const (
	managedBy   = "endpointslice-controller.k8s.io"
	maxPerSlice = 100
)

// Controller is the endpoints loop.
type Controller struct {
	client   *kube.Client
	services corelisters.ServiceLister
	pods     corelisters.PodLister
	synced   []toolscache.InformerSynced
	queue    *controller.Queue[string]
	log      *slog.Logger
}

// New registers the controller on the factory's informers.
func New(client *kube.Client, factory *kube.Informers, env controller.Env) (*Controller, error) {
	svc, pods := factory.Services(), factory.Pods()
	c := &Controller{
		client: client, services: svc.Lister(), pods: pods.Lister(), log: env.Log.With("loop", "endpoints"),
		synced: []toolscache.InformerSynced{svc.Informer().HasSynced, pods.Informer().HasSynced},
		queue:  controller.NewQueue[string]("endpoints", env),
	}
	enqueue := func(obj any) {
		if k, err := toolscache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			c.queue.Add(k)
		}
	}
	if _, err := svc.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, obj any) { enqueue(obj) }, DeleteFunc: enqueue,
	}); err != nil {
		return nil, err
	}
	podChanged := func(obj any) {
		if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if pod, ok := obj.(*corev1.Pod); ok {
			c.enqueueServicesOf(pod)
		}
	}
	// A slice of its own changed or deleted by someone else, or the
	// Endpoints deleted, is made again, as Kubernetes' controllers do.
	slices, endpoints := factory.EndpointSlices(), factory.Endpoints()
	sliceChanged := func(obj any) {
		if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if s, ok := obj.(*discoveryv1.EndpointSlice); ok && s.Labels[discoveryv1.LabelManagedBy] == managedBy && s.Labels[discoveryv1.LabelServiceName] != "" {
			c.queue.Add(s.Namespace + "/" + s.Labels[discoveryv1.LabelServiceName])
		}
	}
	if _, err := slices.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, obj any) { sliceChanged(obj) }, DeleteFunc: sliceChanged,
	}); err != nil {
		return nil, err
	}
	if _, err := endpoints.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{DeleteFunc: enqueue}); err != nil {
		return nil, err
	}
	c.synced = append(c.synced, slices.Informer().HasSynced, endpoints.Informer().HasSynced)
	if _, err := pods.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: podChanged,
		UpdateFunc: func(old, obj any) {
			// A relabelled pod leaves the services of its old labels.
			podChanged(old)
			podChanged(obj)
		},
		DeleteFunc: podChanged,
	}); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Controller) enqueueServicesOf(pod *corev1.Pod) {
	services, err := c.services.Services(pod.Namespace).List(labels.Everything())
	if err != nil {
		return
	}
	for _, s := range services {
		if len(s.Spec.Selector) > 0 && labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(pod.Labels)) {
			c.queue.Add(s.Namespace + "/" + s.Name)
		}
	}
}

// Run keeps endpoints until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	c.queue.Run(ctx, workers, c.synced, c.sync)
}

// endpoint is one pod behind a service, with its resolved ports.
type endpoint struct {
	pod   *corev1.Pod
	ready bool
	ports []corev1.EndpointPort
}

func (c *Controller) sync(ctx context.Context, k string) error {
	ns, name, _ := strings.Cut(k, "/")
	svc, err := c.services.Services(ns).Get(name)
	if apierrors.IsNotFound(err) {
		// The slices go with their owner; Endpoints have none.
		if err := c.client.Endpoints(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		return nil
	}
	if err != nil {
		return err
	}
	if len(svc.Spec.Selector) == 0 || svc.Spec.Type == corev1.ServiceTypeExternalName {
		return nil
	}
	pods, err := c.pods.Pods(ns).List(labels.SelectorFromSet(svc.Spec.Selector))
	if err != nil {
		return err
	}
	var eps []endpoint
	for _, p := range pods {
		if p.Status.PodIP == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if !controller.EndpointAddress(p.Status.PodIP) {
			// A hostNetwork pod on a node at 127.0.0.1: the API refuses
			// such an endpoint, and the whole slice with the others in it.
			continue
		}
		eps = append(eps, endpoint{pod: p, ready: podReady(p) && p.DeletionTimestamp == nil || svc.Spec.PublishNotReadyAddresses, ports: resolvePorts(svc, p)})
	}
	sort.Slice(eps, func(i, j int) bool { return eps[i].pod.Name < eps[j].pod.Name })
	if err := c.syncEndpoints(ctx, svc, eps); err != nil {
		return err
	}
	return c.syncSlices(ctx, svc, eps)
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// resolvePorts maps the service's ports onto the pod: a named targetPort
// is the pod's container port of that name, and a pod without it is not
// an endpoint for that port.
func resolvePorts(svc *corev1.Service, p *corev1.Pod) []corev1.EndpointPort {
	var out []corev1.EndpointPort
	for _, sp := range svc.Spec.Ports {
		port := int32(0)
		switch {
		case sp.TargetPort.Type == intstr.String && sp.TargetPort.StrVal != "":
			for _, ctr := range p.Spec.Containers {
				for _, cp := range ctr.Ports {
					if cp.Name == sp.TargetPort.StrVal && cp.Protocol == sp.Protocol {
						port = cp.ContainerPort
					}
				}
			}
		case sp.TargetPort.IntVal != 0:
			port = sp.TargetPort.IntVal
		default:
			port = sp.Port
		}
		if port != 0 {
			out = append(out, corev1.EndpointPort{Name: sp.Name, Port: port, Protocol: sp.Protocol, AppProtocol: sp.AppProtocol})
		}
	}
	return out
}

func portsKey(ports []corev1.EndpointPort) string {
	var b strings.Builder
	for _, p := range ports {
		fmt.Fprintf(&b, "%s/%d/%s,", p.Name, p.Port, p.Protocol)
	}
	return b.String()
}

// groups splits endpoints by their resolved ports, in a stable order.
func groups(eps []endpoint) ([]string, map[string][]endpoint) {
	by := map[string][]endpoint{}
	for _, e := range eps {
		if len(e.ports) == 0 {
			continue
		}
		by[portsKey(e.ports)] = append(by[portsKey(e.ports)], e)
	}
	keys := slices.Sorted(maps.Keys(by))
	return keys, by
}

// hostname is a pod's name under the Service's DNS name
// (<hostname>.<service>.<namespace>.svc), as Kubernetes gives it: the
// pod's spec.hostname when its spec.subdomain is the Service.
func hostname(svc *corev1.Service, p *corev1.Pod) string {
	if p.Spec.Hostname != "" && p.Spec.Subdomain == svc.Name {
		return p.Spec.Hostname
	}
	return ""
}

func targetRef(p *corev1.Pod) *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "Pod", Namespace: p.Namespace, Name: p.Name, UID: p.UID}
}

// syncEndpoints writes the core v1 Endpoints (still what many tools read).
func (c *Controller) syncEndpoints(ctx context.Context, svc *corev1.Service, eps []endpoint) error {
	keys, by := groups(eps)
	var subsets []corev1.EndpointSubset
	for _, k := range keys {
		s := corev1.EndpointSubset{Ports: by[k][0].ports}
		for _, e := range by[k] {
			addr := corev1.EndpointAddress{IP: e.pod.Status.PodIP, NodeName: ptr.To(e.pod.Spec.NodeName), TargetRef: targetRef(e.pod), Hostname: hostname(svc, e.pod)}
			if e.pod.Spec.NodeName == "" {
				addr.NodeName = nil
			}
			if e.ready {
				s.Addresses = append(s.Addresses, addr)
			} else if e.pod.DeletionTimestamp == nil {
				s.NotReadyAddresses = append(s.NotReadyAddresses, addr)
			}
		}
		if len(s.Addresses)+len(s.NotReadyAddresses) > 0 {
			subsets = append(subsets, s)
		}
	}
	client := c.client.Endpoints(svc.Namespace) //nolint:staticcheck // Endpoints are still served and read
	current, err := client.Get(ctx, svc.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		ep := &corev1.Endpoints{ObjectMeta: metav1.ObjectMeta{Name: svc.Name, Labels: svc.Labels}, Subsets: subsets} //nolint:staticcheck // as above
		_, err = client.Create(ctx, ep, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) || apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
			return nil
		}
		return err
	}
	if err != nil {
		return err
	}
	if equality.Semantic.DeepEqual(current.Subsets, subsets) && maps.Equal(current.Labels, svc.Labels) {
		return nil
	}
	updated := current.DeepCopy()
	updated.Subsets, updated.Labels = subsets, svc.Labels
	_, err = client.Update(ctx, updated, metav1.UpdateOptions{})
	return err
}

// syncSlices writes EndpointSlices: one per port mapping and hundred
// endpoints, reusing the existing slices in place.
func (c *Controller) syncSlices(ctx context.Context, svc *corev1.Service, eps []endpoint) error {
	keys, by := groups(eps)
	var want []*discoveryv1.EndpointSlice
	for _, k := range keys {
		group := by[k]
		for start := 0; start < len(group); start += maxPerSlice {
			chunk := group[start:min(start+maxPerSlice, len(group))]
			s := &discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeIPv4}
			for _, p := range chunk[0].ports {
				s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: ptr.To(p.Name), Port: ptr.To(p.Port), Protocol: ptr.To(p.Protocol), AppProtocol: p.AppProtocol})
			}
			for _, e := range chunk {
				terminating := e.pod.DeletionTimestamp != nil
				ep := discoveryv1.Endpoint{
					Addresses:  []string{e.pod.Status.PodIP},
					Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(e.ready && !terminating), Serving: ptr.To(podReady(e.pod)), Terminating: ptr.To(terminating)},
					TargetRef:  targetRef(e.pod),
				}
				if e.pod.Spec.NodeName != "" {
					ep.NodeName = ptr.To(e.pod.Spec.NodeName)
				}
				if h := hostname(svc, e.pod); h != "" {
					ep.Hostname = ptr.To(h)
				}
				s.Endpoints = append(s.Endpoints, ep)
			}
			want = append(want, s)
		}
	}
	// Read live, not from a cache: a slice created by the last sync must
	// be seen, or this one would create it again.
	api := c.client.EndpointSlices(svc.Namespace)
	list, err := api.List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(labels.Set{
		discoveryv1.LabelServiceName: svc.Name, discoveryv1.LabelManagedBy: managedBy}).String()})
	if err != nil {
		return err
	}
	existing := list.Items
	sort.Slice(existing, func(i, j int) bool { return existing[i].Name < existing[j].Name })
	sliceLabels := map[string]string{discoveryv1.LabelServiceName: svc.Name, discoveryv1.LabelManagedBy: managedBy}
	for k, v := range svc.Labels {
		if _, reserved := sliceLabels[k]; !reserved {
			sliceLabels[k] = v
		}
	}
	for i, s := range want {
		if i < len(existing) {
			cur := &existing[i]
			if equality.Semantic.DeepEqual(cur.Endpoints, s.Endpoints) && equality.Semantic.DeepEqual(cur.Ports, s.Ports) && maps.Equal(cur.Labels, sliceLabels) {
				continue
			}
			updated := cur.DeepCopy()
			updated.Endpoints, updated.Ports, updated.Labels, updated.AddressType = s.Endpoints, s.Ports, sliceLabels, s.AddressType
			if _, err := api.Update(ctx, updated, metav1.UpdateOptions{}); err != nil {
				return err
			}
			continue
		}
		s.GenerateName = svc.Name + "-"
		s.Labels = sliceLabels
		s.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(svc, corev1.SchemeGroupVersion.WithKind("Service"))}
		if _, err := api.Create(ctx, s, metav1.CreateOptions{}); err != nil && !apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
			return err
		}
	}
	// A service with no endpoints keeps one empty slice, as in Kubernetes.
	keep := max(len(want), 1)
	if len(want) == 0 && len(existing) == 0 {
		s := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{GenerateName: svc.Name + "-", Labels: sliceLabels, OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(svc, corev1.SchemeGroupVersion.WithKind("Service"))}},
			AddressType: discoveryv1.AddressTypeIPv4,
		}
		if _, err := api.Create(ctx, s, metav1.CreateOptions{}); err != nil && !apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
			return err
		}
	} else if len(want) == 0 && len(existing) > 0 && (len(existing[0].Endpoints) > 0 || len(existing[0].Ports) > 0) {
		updated := existing[0].DeepCopy()
		updated.Endpoints, updated.Ports = nil, nil
		if _, err := api.Update(ctx, updated, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	for _, extra := range existing[min(keep, len(existing)):] {
		if err := api.Delete(ctx, extra.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &extra.UID}}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
}
