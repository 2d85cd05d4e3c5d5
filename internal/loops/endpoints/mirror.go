package endpoints

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"

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
)

// mirrorManagedBy marks the slices the mirror keeps, as Kubernetes'
// EndpointSliceMirroring controller marks its own.
const mirrorManagedBy = "endpointslicemirroring-controller.k8s.io"

// Mirror is Kubernetes' EndpointSliceMirroring controller: the Endpoints a
// user keeps for a Service without a selector (an external database, a
// service on another network) are mirrored into EndpointSlices, which is
// what every node's proxy reads; without it such a Service has no
// backends. Endpoints labelled endpointslice.kubernetes.io/skip-mirror are
// left alone (the server's own kubernetes Endpoints are).
type Mirror struct {
	client    *kube.Client
	services  corelisters.ServiceLister
	endpoints corelisters.EndpointsLister
	slices    discoverylisters.EndpointSliceLister
	synced    []toolscache.InformerSynced
	queue     *controller.Queue[string]
	log       *slog.Logger
}

// NewMirror registers the mirror on the factory's informers.
func NewMirror(client *kube.Client, factory *kube.Informers, env controller.Env) (*Mirror, error) {
	svc, eps, sl := factory.Services(), factory.Endpoints(), factory.EndpointSlices()
	m := &Mirror{client: client, services: svc.Lister(), endpoints: eps.Lister(), slices: sl.Lister(), log: env.Log.With("loop", "endpointslicemirroring"),
		synced: []toolscache.InformerSynced{svc.Informer().HasSynced, eps.Informer().HasSynced, sl.Informer().HasSynced},
		queue:  controller.NewQueue[string]("endpointslicemirroring", env)}
	if err := m.queue.EnqueueObjects(eps.Informer(), controller.NamespacedKey); err != nil {
		return nil, err
	}
	// A Service gaining or losing its selector changes what is mirrored.
	if err := m.queue.EnqueueObjects(svc.Informer(), controller.NamespacedKey); err != nil {
		return nil, err
	}
	enqueueOwner := func(obj any) {
		if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if s, ok := obj.(*discoveryv1.EndpointSlice); ok && s.Labels[discoveryv1.LabelManagedBy] == mirrorManagedBy {
			m.queue.Add(s.Namespace + "/" + s.Labels[discoveryv1.LabelServiceName])
		}
	}
	if _, err := sl.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: enqueueOwner, UpdateFunc: func(_, obj any) { enqueueOwner(obj) }, DeleteFunc: enqueueOwner,
	}); err != nil {
		return nil, err
	}
	return m, nil
}

// Run mirrors Endpoints until ctx ends.
func (m *Mirror) Run(ctx context.Context, workers int) {
	m.queue.Run(ctx, workers, m.synced, m.sync)
}

func (m *Mirror) sync(ctx context.Context, k string) error {
	ns, name, _ := strings.Cut(k, "/")
	existing, err := m.slices.EndpointSlices(ns).List(labels.SelectorFromSet(labels.Set{
		discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: mirrorManagedBy}))
	if err != nil {
		return err
	}
	var want []*discoveryv1.EndpointSlice
	if eps, err := m.endpoints.Endpoints(ns).Get(name); err == nil && eps.Labels[discoveryv1.LabelSkipMirror] != "true" {
		if svc, err := m.services.Services(ns).Get(name); err == nil && len(svc.Spec.Selector) == 0 {
			want = mirrored(eps)
		}
	} else if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	// Each wanted slice takes the place of an existing one of its address
	// type and ports, so a change updates slices rather than replacing them.
	taken := map[string]bool{}
	for _, w := range want {
		var match *discoveryv1.EndpointSlice
		for _, e := range existing {
			if !taken[e.Name] && e.AddressType == w.AddressType && equality.Semantic.DeepEqual(e.Ports, w.Ports) {
				match = e
				break
			}
		}
		if match == nil {
			if _, err := m.client.EndpointSlices(ns).Create(ctx, w, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("mirror %s: %w", k, err)
			}
			continue
		}
		taken[match.Name] = true
		if equality.Semantic.DeepEqual(match.Endpoints, w.Endpoints) && equality.Semantic.DeepEqual(match.Labels, w.Labels) &&
			equality.Semantic.DeepEqual(match.Annotations, w.Annotations) {
			continue
		}
		updated := match.DeepCopy()
		updated.Endpoints, updated.Labels, updated.Annotations = w.Endpoints, w.Labels, w.Annotations
		if _, err := m.client.EndpointSlices(ns).Update(ctx, updated, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("mirror %s: %w", k, err)
		}
	}
	for _, e := range existing {
		if taken[e.Name] {
			continue
		}
		err := m.client.EndpointSlices(ns).Delete(ctx, e.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &e.UID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("mirror %s: %w", k, err)
		}
	}
	return nil
}

// mirrored is the slices an Endpoints object makes: one per subset's ports
// and address family, its addresses ready and its not-ready addresses not,
// with the Endpoints' labels and annotations, owned by it.
func mirrored(eps *corev1.Endpoints) []*discoveryv1.EndpointSlice {
	var out []*discoveryv1.EndpointSlice
	for _, subset := range eps.Subsets {
		ports := make([]discoveryv1.EndpointPort, 0, len(subset.Ports))
		for _, p := range subset.Ports {
			ports = append(ports, discoveryv1.EndpointPort{Name: &p.Name, Port: &p.Port, Protocol: &p.Protocol, AppProtocol: p.AppProtocol})
		}
		byType := map[discoveryv1.AddressType]*discoveryv1.EndpointSlice{}
		add := func(a corev1.EndpointAddress, ready bool) {
			ip, err := netip.ParseAddr(a.IP)
			if err != nil {
				return // Kubernetes skips what is not an address
			}
			t := discoveryv1.AddressTypeIPv4
			if ip.Is6() && !ip.Is4In6() {
				t = discoveryv1.AddressTypeIPv6
			}
			s := byType[t]
			if s == nil {
				s = newMirrorSlice(eps, ports, t)
				byType[t] = s
				out = append(out, s)
			}
			e := discoveryv1.Endpoint{Addresses: []string{ip.String()}, Conditions: discoveryv1.EndpointConditions{Ready: &ready},
				TargetRef: a.TargetRef, NodeName: a.NodeName}
			if a.Hostname != "" {
				e.Hostname = &a.Hostname
			}
			s.Endpoints = append(s.Endpoints, e)
		}
		for _, a := range subset.Addresses {
			add(a, true)
		}
		for _, a := range subset.NotReadyAddresses {
			add(a, false)
		}
	}
	return out
}

func newMirrorSlice(eps *corev1.Endpoints, ports []discoveryv1.EndpointPort, t discoveryv1.AddressType) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{GenerateName: eps.Name + "-", Namespace: eps.Namespace,
		Labels: map[string]string{}, Annotations: map[string]string{},
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(eps, corev1.SchemeGroupVersion.WithKind("Endpoints"))}},
		AddressType: t, Ports: slices.Clone(ports), Endpoints: []discoveryv1.Endpoint{}}
	for k, v := range eps.Labels {
		s.Labels[k] = v
	}
	s.Labels[discoveryv1.LabelServiceName], s.Labels[discoveryv1.LabelManagedBy] = eps.Name, mirrorManagedBy
	for k, v := range eps.Annotations {
		if k != corev1.EndpointsLastChangeTriggerTime && k != corev1.LastAppliedConfigAnnotation {
			s.Annotations[k] = v
		}
	}
	return s
}
