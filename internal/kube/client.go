// Package kube is the small Kubernetes client orch's own parts (the loops,
// the agent) use: typed access to the resources they work with, informers
// and listers for them, API discovery and an event recorder. It stands on client-go's REST client,
// cache and listers, but not on its clientset, informer factory,
// discovery or event packages: those link every API group Kubernetes has
// (56, with their apply configurations), where orch serves eight, and
// would more than double the size of bin/orch.
package kube

import (
	"context"
	"fmt"
	"slices"

	"github.com/orch-dev/orch/internal/gatewayapi"
	"github.com/orch-dev/orch/internal/upgradeapi"

	"github.com/orch-dev/orch/internal/apis"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	svmv1 "k8s.io/api/storagemigration/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// Scheme holds the types of the groups the loops use.
var Scheme = newScheme()

var codecs = serializer.NewCodecFactory(Scheme)

// newScheme is the served groups', the Gateway API's and orch's Upgrade,
// which the server installs as custom resources.
func newScheme() *runtime.Scheme {
	s := apis.NewScheme()
	utilruntime.Must(gatewayv1.Install(s))
	utilruntime.Must(upgradeapi.AddToScheme(s))
	return s
}

// Client reaches the API server for the loops.
type Client struct {
	groups map[schema.GroupVersion]*rest.RESTClient
	meta   metadata.Interface
	config *rest.Config
}

// NewForConfig makes a client from a rest config (the loopback one).
func NewForConfig(cfg *rest.Config) (*Client, error) {
	c := &Client{groups: map[schema.GroupVersion]*rest.RESTClient{}, config: cfg}
	for _, gv := range append(slices.Clip(apis.Served), apis.GroupVersion{GroupVersion: gatewayapi.GroupVersion}, apis.GroupVersion{GroupVersion: upgradeapi.GroupVersion}) {
		rc, err := restClient(cfg, gv.GroupVersion)
		if err != nil {
			return nil, err
		}
		c.groups[gv.GroupVersion] = rc
	}
	var err error
	if c.meta, err = metadata.NewForConfig(cfg); err != nil {
		return nil, fmt.Errorf("metadata client: %w", err)
	}
	return c, nil
}

func restClient(cfg *rest.Config, gv schema.GroupVersion) (*rest.RESTClient, error) {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &gv
	c.APIPath = "/apis"
	if gv.Group == "" {
		c.APIPath = "/api"
	}
	c.NegotiatedSerializer = codecs.WithoutConversion()
	if c.ContentType == "" || gv == gatewayapi.GroupVersion || gv == upgradeapi.GroupVersion {
		// Custom resources are JSON only.
		c.ContentType, c.AcceptContentTypes = runtime.ContentTypeJSON, ""
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("REST client for %s: %w", gv, err)
	}
	return rc, nil
}

// Metadata is the metadata-only client, for the garbage collector and the
// namespace controller, which work across every resource.
func (c *Client) Metadata() metadata.Interface { return c.meta }

// Resource is typed access to one resource, in one namespace or cluster-wide.
type Resource[T, L runtime.Object] struct {
	rest      *rest.RESTClient
	resource  string
	namespace string
	newObj    func() T
	newList   func() L
}

func resource[T, L runtime.Object](c *Client, gv schema.GroupVersion, name, namespace string, newObj func() T, newList func() L) Resource[T, L] {
	return Resource[T, L]{rest: c.groups[gv], resource: name, namespace: namespace, newObj: newObj, newList: newList}
}

func (r Resource[T, L]) request(verb string) *rest.Request {
	return r.rest.Verb(verb).NamespaceIfScoped(r.namespace, r.namespace != "").Resource(r.resource)
}

// Get reads one object.
func (r Resource[T, L]) Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error) {
	out := r.newObj()
	err := r.request("GET").Name(name).VersionedParams(&opts, metav1.ParameterCodec).Do(ctx).Into(out)
	return out, err
}

// List reads a collection.
func (r Resource[T, L]) List(ctx context.Context, opts metav1.ListOptions) (L, error) {
	out := r.newList()
	err := r.request("GET").VersionedParams(&opts, metav1.ParameterCodec).Do(ctx).Into(out)
	return out, err
}

// Watch streams a collection's changes.
func (r Resource[T, L]) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return r.request("GET").VersionedParams(&opts, metav1.ParameterCodec).Watch(ctx)
}

// Create writes a new object.
func (r Resource[T, L]) Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error) {
	out := r.newObj()
	err := r.request("POST").VersionedParams(&opts, metav1.ParameterCodec).Body(obj).Do(ctx).Into(out)
	return out, err
}

// Update replaces an object.
func (r Resource[T, L]) Update(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error) {
	return r.put(ctx, obj, "", opts)
}

// UpdateStatus replaces an object's status.
func (r Resource[T, L]) UpdateStatus(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error) {
	return r.put(ctx, obj, "status", opts)
}

func (r Resource[T, L]) put(ctx context.Context, obj T, sub string, opts metav1.UpdateOptions) (T, error) {
	out := r.newObj()
	m, err := meta.Accessor(obj)
	if err != nil {
		return out, err
	}
	req := r.request("PUT").Name(m.GetName())
	if sub != "" {
		req = req.SubResource(sub)
	}
	err = req.VersionedParams(&opts, metav1.ParameterCodec).Body(obj).Do(ctx).Into(out)
	return out, err
}

// Patch changes an object (or a subresource of it) with a patch.
func (r Resource[T, L]) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (T, error) {
	out := r.newObj()
	err := r.request("PATCH").Name(name).SubResource(subresources...).VersionedParams(&opts, metav1.ParameterCodec).Body(data).SetHeader("Content-Type", string(pt)).Do(ctx).Into(out)
	return out, err
}

// Delete removes an object.
func (r Resource[T, L]) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	return r.request("DELETE").Name(name).Body(&opts).Do(ctx).Error()
}

// Pods is typed access to pods.
func (c *Client) Pods(ns string) Resource[*corev1.Pod, *corev1.PodList] {
	return resource(c, corev1.SchemeGroupVersion, "pods", ns, func() *corev1.Pod { return &corev1.Pod{} }, func() *corev1.PodList { return &corev1.PodList{} })
}

// PodDisruptionBudgets is typed access to disruption budgets.
func (c *Client) PodDisruptionBudgets(ns string) Resource[*policyv1.PodDisruptionBudget, *policyv1.PodDisruptionBudgetList] {
	return resource(c, policyv1.SchemeGroupVersion, "poddisruptionbudgets", ns, func() *policyv1.PodDisruptionBudget { return &policyv1.PodDisruptionBudget{} },
		func() *policyv1.PodDisruptionBudgetList { return &policyv1.PodDisruptionBudgetList{} })
}

// HorizontalPodAutoscalers is typed access to autoscalers (autoscaling/v2).
func (c *Client) HorizontalPodAutoscalers(ns string) Resource[*autoscalingv2.HorizontalPodAutoscaler, *autoscalingv2.HorizontalPodAutoscalerList] {
	return resource(c, autoscalingv2.SchemeGroupVersion, "horizontalpodautoscalers", ns, func() *autoscalingv2.HorizontalPodAutoscaler { return &autoscalingv2.HorizontalPodAutoscaler{} },
		func() *autoscalingv2.HorizontalPodAutoscalerList { return &autoscalingv2.HorizontalPodAutoscalerList{} })
}

// PodMetrics reads the pods' resource usage the metrics API serves.
func (c *Client) PodMetrics(ns string) Resource[*metricsv1beta1.PodMetrics, *metricsv1beta1.PodMetricsList] {
	return resource(c, metricsv1beta1.SchemeGroupVersion, "pods", ns, func() *metricsv1beta1.PodMetrics { return &metricsv1beta1.PodMetrics{} },
		func() *metricsv1beta1.PodMetricsList { return &metricsv1beta1.PodMetricsList{} })
}

// ConfigMaps is typed access to config maps.
func (c *Client) ConfigMaps(ns string) Resource[*corev1.ConfigMap, *corev1.ConfigMapList] {
	return resource(c, corev1.SchemeGroupVersion, "configmaps", ns, func() *corev1.ConfigMap { return &corev1.ConfigMap{} }, func() *corev1.ConfigMapList { return &corev1.ConfigMapList{} })
}

// Secrets is typed access to secrets.
func (c *Client) Secrets(ns string) Resource[*corev1.Secret, *corev1.SecretList] {
	return resource(c, corev1.SchemeGroupVersion, "secrets", ns, func() *corev1.Secret { return &corev1.Secret{} }, func() *corev1.SecretList { return &corev1.SecretList{} })
}

// Nodes is typed access to nodes.
func (c *Client) Nodes() Resource[*corev1.Node, *corev1.NodeList] {
	return resource(c, corev1.SchemeGroupVersion, "nodes", "", func() *corev1.Node { return &corev1.Node{} }, func() *corev1.NodeList { return &corev1.NodeList{} })
}

// Namespaces is typed access to namespaces.
func (c *Client) Namespaces() Resource[*corev1.Namespace, *corev1.NamespaceList] {
	return resource(c, corev1.SchemeGroupVersion, "namespaces", "", func() *corev1.Namespace { return &corev1.Namespace{} }, func() *corev1.NamespaceList { return &corev1.NamespaceList{} })
}

// Services is typed access to services.
func (c *Client) Services(ns string) Resource[*corev1.Service, *corev1.ServiceList] {
	return resource(c, corev1.SchemeGroupVersion, "services", ns, func() *corev1.Service { return &corev1.Service{} }, func() *corev1.ServiceList { return &corev1.ServiceList{} })
}

// Endpoints is typed access to endpoints.
//
//nolint:staticcheck // Endpoints are still served and read
func (c *Client) Endpoints(ns string) Resource[*corev1.Endpoints, *corev1.EndpointsList] {
	return resource(c, corev1.SchemeGroupVersion, "endpoints", ns, func() *corev1.Endpoints { return &corev1.Endpoints{} }, func() *corev1.EndpointsList { return &corev1.EndpointsList{} })
}

// ServiceAccounts is typed access to service accounts.
func (c *Client) ServiceAccounts(ns string) Resource[*corev1.ServiceAccount, *corev1.ServiceAccountList] {
	return resource(c, corev1.SchemeGroupVersion, "serviceaccounts", ns, func() *corev1.ServiceAccount { return &corev1.ServiceAccount{} }, func() *corev1.ServiceAccountList { return &corev1.ServiceAccountList{} })
}

// ResourceQuotas is typed access to resource quotas.
func (c *Client) ResourceQuotas(ns string) Resource[*corev1.ResourceQuota, *corev1.ResourceQuotaList] {
	return resource(c, corev1.SchemeGroupVersion, "resourcequotas", ns, func() *corev1.ResourceQuota { return &corev1.ResourceQuota{} }, func() *corev1.ResourceQuotaList { return &corev1.ResourceQuotaList{} })
}

// ReplicationControllers is typed access to ReplicationControllers.
func (c *Client) ReplicationControllers(ns string) Resource[*corev1.ReplicationController, *corev1.ReplicationControllerList] {
	return resource(c, corev1.SchemeGroupVersion, "replicationcontrollers", ns, func() *corev1.ReplicationController { return &corev1.ReplicationController{} }, func() *corev1.ReplicationControllerList { return &corev1.ReplicationControllerList{} })
}

// ReplicaSets is typed access to ReplicaSets.
func (c *Client) ReplicaSets(ns string) Resource[*appsv1.ReplicaSet, *appsv1.ReplicaSetList] {
	return resource(c, appsv1.SchemeGroupVersion, "replicasets", ns, func() *appsv1.ReplicaSet { return &appsv1.ReplicaSet{} }, func() *appsv1.ReplicaSetList { return &appsv1.ReplicaSetList{} })
}

// Deployments is typed access to Deployments.
func (c *Client) Deployments(ns string) Resource[*appsv1.Deployment, *appsv1.DeploymentList] {
	return resource(c, appsv1.SchemeGroupVersion, "deployments", ns, func() *appsv1.Deployment { return &appsv1.Deployment{} }, func() *appsv1.DeploymentList { return &appsv1.DeploymentList{} })
}

// DaemonSets is typed access to DaemonSets.
func (c *Client) DaemonSets(ns string) Resource[*appsv1.DaemonSet, *appsv1.DaemonSetList] {
	return resource(c, appsv1.SchemeGroupVersion, "daemonsets", ns, func() *appsv1.DaemonSet { return &appsv1.DaemonSet{} }, func() *appsv1.DaemonSetList { return &appsv1.DaemonSetList{} })
}

// Jobs is typed access to Jobs.
func (c *Client) Jobs(ns string) Resource[*batchv1.Job, *batchv1.JobList] {
	return resource(c, batchv1.SchemeGroupVersion, "jobs", ns, func() *batchv1.Job { return &batchv1.Job{} }, func() *batchv1.JobList { return &batchv1.JobList{} })
}

// CronJobs is typed access to CronJobs.
func (c *Client) CronJobs(ns string) Resource[*batchv1.CronJob, *batchv1.CronJobList] {
	return resource(c, batchv1.SchemeGroupVersion, "cronjobs", ns, func() *batchv1.CronJob { return &batchv1.CronJob{} }, func() *batchv1.CronJobList { return &batchv1.CronJobList{} })
}

// StatefulSets is typed access to StatefulSets.
func (c *Client) StatefulSets(ns string) Resource[*appsv1.StatefulSet, *appsv1.StatefulSetList] {
	return resource(c, appsv1.SchemeGroupVersion, "statefulsets", ns, func() *appsv1.StatefulSet { return &appsv1.StatefulSet{} }, func() *appsv1.StatefulSetList { return &appsv1.StatefulSetList{} })
}

// ControllerRevisions is typed access to ControllerRevisions.
func (c *Client) ControllerRevisions(ns string) Resource[*appsv1.ControllerRevision, *appsv1.ControllerRevisionList] {
	return resource(c, appsv1.SchemeGroupVersion, "controllerrevisions", ns, func() *appsv1.ControllerRevision { return &appsv1.ControllerRevision{} }, func() *appsv1.ControllerRevisionList { return &appsv1.ControllerRevisionList{} })
}

// StorageVersionMigrations is typed access to StorageVersionMigrations.
func (c *Client) StorageVersionMigrations() Resource[*svmv1.StorageVersionMigration, *svmv1.StorageVersionMigrationList] {
	return resource(c, svmv1.SchemeGroupVersion, "storageversionmigrations", "", func() *svmv1.StorageVersionMigration { return &svmv1.StorageVersionMigration{} }, func() *svmv1.StorageVersionMigrationList { return &svmv1.StorageVersionMigrationList{} })
}

// PersistentVolumes is typed access to PersistentVolumes.
func (c *Client) PersistentVolumes() Resource[*corev1.PersistentVolume, *corev1.PersistentVolumeList] {
	return resource(c, corev1.SchemeGroupVersion, "persistentvolumes", "", func() *corev1.PersistentVolume { return &corev1.PersistentVolume{} }, func() *corev1.PersistentVolumeList { return &corev1.PersistentVolumeList{} })
}

// PersistentVolumeClaims is typed access to PersistentVolumeClaims.
func (c *Client) PersistentVolumeClaims(ns string) Resource[*corev1.PersistentVolumeClaim, *corev1.PersistentVolumeClaimList] {
	return resource(c, corev1.SchemeGroupVersion, "persistentvolumeclaims", ns, func() *corev1.PersistentVolumeClaim { return &corev1.PersistentVolumeClaim{} }, func() *corev1.PersistentVolumeClaimList { return &corev1.PersistentVolumeClaimList{} })
}

// RuntimeClasses is typed access to RuntimeClasses.
func (c *Client) RuntimeClasses() Resource[*nodev1.RuntimeClass, *nodev1.RuntimeClassList] {
	return resource(c, nodev1.SchemeGroupVersion, "runtimeclasses", "", func() *nodev1.RuntimeClass { return &nodev1.RuntimeClass{} }, func() *nodev1.RuntimeClassList { return &nodev1.RuntimeClassList{} })
}

// StorageClasses is typed access to StorageClasses.
func (c *Client) StorageClasses() Resource[*storagev1.StorageClass, *storagev1.StorageClassList] {
	return resource(c, storagev1.SchemeGroupVersion, "storageclasses", "", func() *storagev1.StorageClass { return &storagev1.StorageClass{} }, func() *storagev1.StorageClassList { return &storagev1.StorageClassList{} })
}

// Leases is typed access to Leases.
func (c *Client) Leases(ns string) Resource[*coordinationv1.Lease, *coordinationv1.LeaseList] {
	return resource(c, coordinationv1.SchemeGroupVersion, "leases", ns, func() *coordinationv1.Lease { return &coordinationv1.Lease{} }, func() *coordinationv1.LeaseList { return &coordinationv1.LeaseList{} })
}

// EndpointSlices is typed access to EndpointSlices.
func (c *Client) EndpointSlices(ns string) Resource[*discoveryv1.EndpointSlice, *discoveryv1.EndpointSliceList] {
	return resource(c, discoveryv1.SchemeGroupVersion, "endpointslices", ns, func() *discoveryv1.EndpointSlice { return &discoveryv1.EndpointSlice{} }, func() *discoveryv1.EndpointSliceList { return &discoveryv1.EndpointSliceList{} })
}

// Ingresses is typed access to Ingresses.
func (c *Client) Ingresses(ns string) Resource[*networkingv1.Ingress, *networkingv1.IngressList] {
	return resource(c, networkingv1.SchemeGroupVersion, "ingresses", ns, func() *networkingv1.Ingress { return &networkingv1.Ingress{} }, func() *networkingv1.IngressList { return &networkingv1.IngressList{} })
}

// CertificateSigningRequests is typed access to certificate requests.
func (c *Client) CertificateSigningRequests() Resource[*certificatesv1.CertificateSigningRequest, *certificatesv1.CertificateSigningRequestList] {
	return resource(c, certificatesv1.SchemeGroupVersion, "certificatesigningrequests", "", func() *certificatesv1.CertificateSigningRequest { return &certificatesv1.CertificateSigningRequest{} },
		func() *certificatesv1.CertificateSigningRequestList {
			return &certificatesv1.CertificateSigningRequestList{}
		})
}

// ClusterTrustBundles is typed access to trust bundles.
func (c *Client) ClusterTrustBundles() Resource[*certificatesv1.ClusterTrustBundle, *certificatesv1.ClusterTrustBundleList] {
	return resource(c, certificatesv1.SchemeGroupVersion, "clustertrustbundles", "", func() *certificatesv1.ClusterTrustBundle { return &certificatesv1.ClusterTrustBundle{} },
		func() *certificatesv1.ClusterTrustBundleList { return &certificatesv1.ClusterTrustBundleList{} })
}

// PodCertificateRequests is typed access to pod certificate requests.
func (c *Client) PodCertificateRequests(ns string) Resource[*certificatesv1.PodCertificateRequest, *certificatesv1.PodCertificateRequestList] {
	return resource(c, certificatesv1.SchemeGroupVersion, "podcertificaterequests", ns, func() *certificatesv1.PodCertificateRequest { return &certificatesv1.PodCertificateRequest{} },
		func() *certificatesv1.PodCertificateRequestList { return &certificatesv1.PodCertificateRequestList{} })
}

// UpdateApproval replaces a certificate request's Approved and Denied
// conditions (its approval subresource).
func (r Resource[T, L]) UpdateApproval(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error) {
	return r.put(ctx, obj, "approval", opts)
}

// SubjectAccessReview asks the API server whether a user may do something.
func (c *Client) SubjectAccessReview(ctx context.Context, review *authorizationv1.SubjectAccessReview) (*authorizationv1.SubjectAccessReview, error) {
	out := &authorizationv1.SubjectAccessReview{}
	err := c.groups[authorizationv1.SchemeGroupVersion].Post().Resource("subjectaccessreviews").Body(review).Do(ctx).Into(out)
	return out, err
}

// NetworkPolicies is typed access to NetworkPolicies.
func (c *Client) NetworkPolicies(ns string) Resource[*networkingv1.NetworkPolicy, *networkingv1.NetworkPolicyList] {
	return resource(c, networkingv1.SchemeGroupVersion, "networkpolicies", ns, func() *networkingv1.NetworkPolicy { return &networkingv1.NetworkPolicy{} }, func() *networkingv1.NetworkPolicyList { return &networkingv1.NetworkPolicyList{} })
}

// IngressClasses is typed access to IngressClasses.
func (c *Client) IngressClasses() Resource[*networkingv1.IngressClass, *networkingv1.IngressClassList] {
	return resource(c, networkingv1.SchemeGroupVersion, "ingressclasses", "", func() *networkingv1.IngressClass { return &networkingv1.IngressClass{} }, func() *networkingv1.IngressClassList { return &networkingv1.IngressClassList{} })
}

// Events is typed access to events.k8s.io Events.
func (c *Client) Events(ns string) Resource[*eventsv1.Event, *eventsv1.EventList] {
	return resource(c, eventsv1.SchemeGroupVersion, "events", ns, func() *eventsv1.Event { return &eventsv1.Event{} }, func() *eventsv1.EventList { return &eventsv1.EventList{} })
}

// ClusterRoles is typed access to ClusterRoles.
func (c *Client) ClusterRoles() Resource[*rbacv1.ClusterRole, *rbacv1.ClusterRoleList] {
	return resource(c, rbacv1.SchemeGroupVersion, "clusterroles", "", func() *rbacv1.ClusterRole { return &rbacv1.ClusterRole{} }, func() *rbacv1.ClusterRoleList { return &rbacv1.ClusterRoleList{} })
}

// Bind assigns a pod to a node through pods/binding.
func (c *Client) Bind(ctx context.Context, b *corev1.Binding, opts metav1.CreateOptions) error {
	return c.groups[corev1.SchemeGroupVersion].Post().Namespace(b.Namespace).Resource("pods").Name(b.Name).SubResource("binding").
		VersionedParams(&opts, metav1.ParameterCodec).Body(b).Do(ctx).Error()
}

// FinalizeNamespace writes a namespace's spec.finalizers.
func (c *Client) FinalizeNamespace(ctx context.Context, ns *corev1.Namespace, opts metav1.UpdateOptions) error {
	return c.groups[corev1.SchemeGroupVersion].Put().Resource("namespaces").Name(ns.Name).SubResource("finalize").
		VersionedParams(&opts, metav1.ParameterCodec).Body(ns).Do(ctx).Error()
}

// CreateToken asks a token for a service account through
// serviceaccounts/token (a TokenRequest), as the kubelet does for its
// pods' projected tokens.
func (c *Client) CreateToken(ctx context.Context, namespace, serviceAccount string, tr *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error) {
	out := &authenticationv1.TokenRequest{}
	err := c.groups[corev1.SchemeGroupVersion].Post().Namespace(namespace).Resource("serviceaccounts").Name(serviceAccount).SubResource("token").
		Body(tr).Do(ctx).Into(out)
	return out, err
}
