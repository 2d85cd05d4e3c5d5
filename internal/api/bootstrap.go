package api

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/orch-dev/orch/internal/api/resources/scheduling"
	"net/netip"
	"slices"

	"github.com/orch-dev/orch/internal/api/registry"
	"github.com/orch-dev/orch/internal/api/resources/flowcontrol"
	"github.com/orch-dev/orch/internal/atomicfile"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
)

// defaultNamespaces exist in every cluster, as in Kubernetes.
var defaultNamespaces = []string{metav1.NamespaceDefault, metav1.NamespaceSystem, metav1.NamespacePublic, corev1.NamespaceNodeLease}

// bootstrap creates the default namespaces and the kubernetes Service with
// its endpoints, and keeps the endpoints on the advertised address.
func (s *Server) bootstrap(ctx context.Context, serviceIP netip.Addr) error {
	for _, name := range defaultNamespaces {
		if err := createIfMissing(ctx, s.storage("", "namespaces"), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
			return err
		}
		// The service account loop keeps these too; made here, a pod
		// in them never waits for the loops to start.
		if err := createIfMissing(ctx, s.storage("", "serviceaccounts"), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: name}}); err != nil {
			return err
		}
	}
	if err := s.bootstrapRBAC(ctx); err != nil {
		return err
	}
	labels := map[string]string{"component": "apiserver", "provider": "kubernetes"}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: metav1.NamespaceDefault, Labels: labels},
		Spec: corev1.ServiceSpec{ClusterIP: serviceIP.String(), Ports: []corev1.ServicePort{{
			Name: "https", Port: 443, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt(s.port()),
		}}},
	}
	if err := createIfMissing(ctx, s.storage("", "services"), svc); err != nil {
		return err
	}
	if err := s.kubeDNS(ctx); err != nil {
		return err
	}
	if err := s.defaultServiceCIDR(ctx); err != nil {
		return err
	}
	// API Priority and Fairness' mandatory configuration, made again at
	// each start as kube-apiserver keeps it.
	levels, schemas := flowcontrol.Mandatory()
	for _, l := range levels {
		if err := createIfMissing(ctx, s.storage("flowcontrol.apiserver.k8s.io", "prioritylevelconfigurations"), l); err != nil {
			return err
		}
	}
	for _, fs := range schemas {
		if err := createIfMissing(ctx, s.storage("flowcontrol.apiserver.k8s.io", "flowschemas"), fs); err != nil {
			return err
		}
	}
	if err := s.bootstrapPriorityClasses(ctx); err != nil {
		return err
	}
	if err := s.ingressClass(ctx); err != nil {
		return err
	}
	if err := s.localPathClass(ctx); err != nil {
		return err
	}
	if s.sharedStore() {
		// Servers sharing a datastore list themselves together.
		return s.listAPIServers(ctx, true)
	}
	return s.kubernetesEndpoints(ctx, []netip.Addr{s.advertise})
}

// kubernetesEndpoints keeps the kubernetes Service's Endpoints and
// EndpointSlice on addrs, the API servers' advertised addresses. An address
// a Service may not send traffic to (Kubernetes' endpoint validation
// refuses loopback and link-local ones) is left out: with none left,
// in-cluster clients are refused at once rather than sent to their own
// node's loopback.
func (s *Server) kubernetesEndpoints(ctx context.Context, addrs []netip.Addr) error {
	// Said once per change of the servers, not at every renewal.
	s.endpointsMu.Lock()
	changed := !slices.Equal(s.endpointsSeen, addrs)
	s.endpointsSeen = slices.Clone(addrs)
	s.endpointsMu.Unlock()
	var usable []netip.Addr
	for _, a := range addrs {
		if special(a) {
			if changed {
				s.log.Warn("the kubernetes Service leaves out an API server advertised at "+a.String()+" (--advertise-address): pods cannot reach it there", "advertise", a.String())
			}
			continue
		}
		usable = append(usable, a)
	}
	if len(usable) == 0 {
		if changed {
			s.log.Warn("the kubernetes Service has no endpoints: pods cannot reach an API server advertised at "+s.advertise.String()+" (--advertise-address)",
				"advertise", s.advertise.String())
		}
		for _, r := range []struct{ group, resource string }{{"", "endpoints"}, {"discovery.k8s.io", "endpointslices"}} {
			if _, err := s.storage(r.group, r.resource).Delete(ctx, metav1.NamespaceDefault, "kubernetes", &metav1.DeleteOptions{}, registry.WriteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
		}
		return nil
	}
	port := int32(s.port())
	var epAddrs []corev1.EndpointAddress
	var sliceEndpoints []discoveryv1.Endpoint
	for _, a := range usable {
		epAddrs = append(epAddrs, corev1.EndpointAddress{IP: a.String()})
		sliceEndpoints = append(sliceEndpoints, discoveryv1.Endpoint{Addresses: []string{a.String()}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	ep := &corev1.Endpoints{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: metav1.NamespaceDefault, Labels: map[string]string{"endpointslice.kubernetes.io/skip-mirror": "true"}},
		Subsets: []corev1.EndpointSubset{{
			Addresses: epAddrs,
			Ports:     []corev1.EndpointPort{{Name: "https", Port: port, Protocol: corev1.ProtocolTCP}},
		}},
	}
	if err := ensure(ctx, s.storage("", "endpoints"), ep, func(cur runtime.Object) bool {
		return apiequality.Semantic.DeepEqual(cur.(*corev1.Endpoints).Subsets, ep.Subsets)
	}); err != nil {
		return err
	}
	addrType := discoveryv1.AddressTypeIPv4
	if usable[0].Is6() {
		addrType = discoveryv1.AddressTypeIPv6
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: metav1.NamespaceDefault,
			Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes"}},
		AddressType: addrType,
		Endpoints:   sliceEndpoints,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: &port, Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	return ensure(ctx, s.storage("discovery.k8s.io", "endpointslices"), slice, func(cur runtime.Object) bool {
		c := cur.(*discoveryv1.EndpointSlice)
		return apiequality.Semantic.DeepEqual(c.Endpoints, slice.Endpoints) && apiequality.Semantic.DeepEqual(c.Ports, slice.Ports)
	})
}

// KubeDNSTargetPort is where each node's agent answers the cluster DNS
// (internal/netproxy/dns.Port), the kube-dns Service's target port.
const KubeDNSTargetPort = 10053

// kubeDNS creates the kube-dns Service in kube-system at --cluster-dns,
// as Kubernetes distributions do, for tools that look for it: without a
// selector (its endpoints are the nodes', kept by the clusterdns loop)
// and with internalTrafficPolicy Local, so that each pod asks its own
// node. A kube-dns the user made (CoreDNS, say) is left alone; an address
// already taken leaves the cluster without one, said in the log.
func (s *Server) kubeDNS(ctx context.Context) error {
	if s.cfg.ClusterDNS == "" {
		return nil
	}
	target := intstr.FromInt32(KubeDNSTargetPort)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Namespace: metav1.NamespaceSystem,
			Labels: map[string]string{"k8s-app": "kube-dns", "kubernetes.io/cluster-service": "true", "kubernetes.io/name": "KubeDNS"}},
		Spec: corev1.ServiceSpec{ClusterIP: s.cfg.ClusterDNS, InternalTrafficPolicy: ptr.To(corev1.ServiceInternalTrafficPolicyLocal),
			Ports: []corev1.ServicePort{
				{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: target},
				{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: target},
			}},
	}
	err := createIfMissing(ctx, s.storage("", "services"), svc)
	if apierrors.IsInvalid(err) || apierrors.IsConflict(err) {
		s.log.Warn("no kube-dns Service: pods' resolv.conf names an address nothing answers", "clusterDNS", s.cfg.ClusterDNS, "err", err)
		return nil
	}
	return err
}

// special is an address no endpoint may have.
func special(a netip.Addr) bool {
	return a.IsUnspecified() || a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast()
}

// defaultServiceCIDR keeps the ServiceCIDR "kubernetes" that describes
// --service-cidr, Ready, as kube-apiserver's default ServiceCIDR
// controller does.
func (s *Server) defaultServiceCIDR(ctx context.Context) error {
	cidr, err := netip.ParsePrefix(s.cfg.ServiceCIDR)
	if err != nil {
		return err
	}
	st := s.storage("networking.k8s.io", "servicecidrs")
	want := []string{cidr.Masked().String()}
	obj := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: want}}
	// Its range is immutable: a new --service-cidr replaces it.
	if current, err := st.Get(ctx, "", "kubernetes"); err == nil && !slices.Equal(current.(*networkingv1.ServiceCIDR).Spec.CIDRs, want) {
		if _, err := st.Delete(ctx, "", "kubernetes", &metav1.DeleteOptions{}, registry.WriteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("default ServiceCIDR: %w", err)
		}
	}
	if err := createIfMissing(ctx, st, obj); err != nil {
		return fmt.Errorf("default ServiceCIDR: %w", err)
	}
	_, _, err = st.Update(ctx, "", "kubernetes", func(_ context.Context, current runtime.Object) (runtime.Object, error) {
		c := current.(*networkingv1.ServiceCIDR).DeepCopy()
		if meta.IsStatusConditionTrue(c.Status.Conditions, networkingv1.ServiceCIDRConditionReady) {
			return current, nil
		}
		meta.SetStatusCondition(&c.Status.Conditions, metav1.Condition{Type: networkingv1.ServiceCIDRConditionReady, Status: metav1.ConditionTrue,
			Reason: "ServiceCIDRReady", Message: "Kubernetes default Service CIDR is ready", ObservedGeneration: c.Generation})
		return c, nil
	}, registry.UpdateOptions{Subresource: "status"})
	return err
}

func createIfMissing(ctx context.Context, st *registry.Storage, obj runtime.Object) error {
	if _, err := st.Get(ctx, metaNamespace(obj), metaName(obj)); err == nil || !apierrors.IsNotFound(err) {
		return err
	}
	_, err := st.Create(ctx, obj, registry.WriteOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// ensure creates obj, or replaces the stored one unless same says it matches.
func ensure(ctx context.Context, st *registry.Storage, obj runtime.Object, same func(current runtime.Object) bool) error {
	_, err := st.Create(ctx, obj.DeepCopyObject(), registry.WriteOptions{})
	if !apierrors.IsAlreadyExists(err) {
		return err
	}
	_, _, err = st.Update(ctx, metaNamespace(obj), metaName(obj), func(_ context.Context, current runtime.Object) (runtime.Object, error) {
		if current == nil {
			return obj.DeepCopyObject(), nil
		}
		if same(current) {
			return current, nil
		}
		next := obj.DeepCopyObject()
		setResourceVersion(next, "")
		return next, nil
	}, registry.UpdateOptions{})
	return err
}

// writeKubeconfig writes the admin kubeconfig (mode 0600).
func (s *Server) writeKubeconfig(path string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["default"] = &clientcmdapi.Cluster{Server: s.URL(), CertificateAuthorityData: s.ca().Bundle()}
	cfg.AuthInfos["default"] = &clientcmdapi.AuthInfo{ClientCertificateData: s.admin.CertPEM, ClientKeyData: s.admin.KeyPEM}
	cfg.Contexts["default"] = &clientcmdapi.Context{Cluster: "default", AuthInfo: "default"}
	cfg.CurrentContext = "default"
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	return atomicfile.Write(path, data, 0o600)
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

func metaNamespace(obj runtime.Object) string { return obj.(metav1.Object).GetNamespace() }
func metaName(obj runtime.Object) string      { return obj.(metav1.Object).GetName() }
func setResourceVersion(obj runtime.Object, rv string) {
	obj.(metav1.Object).SetResourceVersion(rv)
}

// bootstrapPriorityClasses makes the system's PriorityClasses, as
// kube-apiserver does at each start.
func (s *Server) bootstrapPriorityClasses(ctx context.Context) error {
	for _, pc := range scheduling.SystemPriorityClasses() {
		if err := createIfMissing(ctx, s.storage("scheduling.k8s.io", "priorityclasses"), pc); err != nil {
			return err
		}
	}
	return nil
}
