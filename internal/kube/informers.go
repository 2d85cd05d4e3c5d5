package kube

import (
	"context"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	svmv1 "k8s.io/api/storagemigration/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	appslisters "k8s.io/client-go/listers/apps/v1"
	autoscalinglisters "k8s.io/client-go/listers/autoscaling/v2"
	batchlisters "k8s.io/client-go/listers/batch/v1"
	certificateslisters "k8s.io/client-go/listers/certificates/v1"
	coordinationlisters "k8s.io/client-go/listers/coordination/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	networkinglisters "k8s.io/client-go/listers/networking/v1"
	policylisters "k8s.io/client-go/listers/policy/v1"
	rbaclisters "k8s.io/client-go/listers/rbac/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	svmlisters "k8s.io/client-go/listers/storagemigration/v1"
	"k8s.io/client-go/tools/cache"
)

// Informers shares one informer per resource among the loops, as
// client-go's SharedInformerFactory does.
type Informers struct {
	client *Client
	resync time.Duration

	mu        sync.Mutex
	informers map[string]*fanOut
	// whole are the informers of every object of a resource (no
	// selector), which another loop watching all of it may share.
	whole map[schema.GroupVersionResource]cache.SharedIndexInformer
	wg    sync.WaitGroup
}

// NewInformers makes the factory; resync re-delivers every cached object
// that often.
func NewInformers(c *Client, resync time.Duration) *Informers {
	return &Informers{client: c, resync: resync, informers: map[string]*fanOut{},
		whole: map[schema.GroupVersionResource]cache.SharedIndexInformer{}}
}

// informerFor is the shared informer of r. It takes the Resource itself,
// not an interface of its List and Watch: a Resource in an interface
// would keep every method of each of its two dozen instantiations in the
// binary (the budget, design.md).
func informerFor[T, L runtime.Object](f *Informers, name string, r Resource[T, L], example T) cache.SharedIndexInformer {
	return selectingInformer(f, name, r, "", example)
}

// selectingInformer is informerFor listing and watching only what the
// field selector selects (all with none).
func selectingInformer[T, L runtime.Object](f *Informers, name string, r Resource[T, L], selector string, example T) cache.SharedIndexInformer {
	f.mu.Lock()
	defer f.mu.Unlock()
	if inf, ok := f.informers[name]; ok {
		return inf
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			if selector != "" {
				opts.FieldSelector = selector
			}
			return r.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			if selector != "" {
				opts.FieldSelector = selector
			}
			return r.Watch(ctx, opts)
		},
	}
	informer := cache.NewSharedIndexInformer(lw, example, f.resync, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	_ = informer.SetTransform(DropManagedFields) // fails only once started
	inf := newFanOut(informer, f.resync)
	f.informers[name] = inf
	if gvk, err := GroupVersionKindOf(example); selector == "" && err == nil && gvk.Kind != "" {
		f.whole[gvk.GroupVersion().WithResource(name)] = inf
	}
	return inf
}

// Existing is the informer of every object of gvr when a loop has asked
// for one: the garbage collector shares it rather than watching the
// resource a second time, as Kubernetes' collector takes the controller
// manager's typed informers where they exist. A nil factory has none.
func (f *Informers) Existing(gvr schema.GroupVersionResource) (cache.SharedIndexInformer, bool) {
	if f == nil {
		return nil, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	inf, ok := f.whole[gvr]
	return inf, ok
}

// DropManagedFields is an informer transform: no loop reads
// managedFields, so caches do without them (Kubernetes' controller
// manager trims them too); an update written from a cached object keeps
// the stored ones.
func DropManagedFields(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// ClusterRoles is the shared ClusterRole informer.
func (f *Informers) ClusterRoles() Shared[rbaclisters.ClusterRoleLister] {
	inf := informerFor(f, "clusterroles", f.client.ClusterRoles(), &rbacv1.ClusterRole{})
	return Shared[rbaclisters.ClusterRoleLister]{inf, rbaclisters.NewClusterRoleLister(inf.GetIndexer())}
}

// Pods is the shared pod informer.
func (f *Informers) Pods() Shared[corelisters.PodLister] {
	inf := informerFor(f, "pods", f.client.Pods(""), &corev1.Pod{})
	return Shared[corelisters.PodLister]{inf, corelisters.NewPodLister(inf.GetIndexer())}
}

// Nodes is the shared node informer.
func (f *Informers) Nodes() Shared[corelisters.NodeLister] {
	inf := informerFor(f, "nodes", f.client.Nodes(), &corev1.Node{})
	return Shared[corelisters.NodeLister]{inf, corelisters.NewNodeLister(inf.GetIndexer())}
}

// Namespaces is the shared namespace informer.
func (f *Informers) Namespaces() Shared[corelisters.NamespaceLister] {
	inf := informerFor(f, "namespaces", f.client.Namespaces(), &corev1.Namespace{})
	return Shared[corelisters.NamespaceLister]{inf, corelisters.NewNamespaceLister(inf.GetIndexer())}
}

// Services is the shared service informer.
func (f *Informers) Services() Shared[corelisters.ServiceLister] {
	inf := informerFor(f, "services", f.client.Services(""), &corev1.Service{})
	return Shared[corelisters.ServiceLister]{inf, corelisters.NewServiceLister(inf.GetIndexer())}
}

// EndpointSlices is the shared EndpointSlice informer.
func (f *Informers) EndpointSlices() Shared[discoverylisters.EndpointSliceLister] {
	inf := informerFor(f, "endpointslices", f.client.EndpointSlices(""), &discoveryv1.EndpointSlice{})
	return Shared[discoverylisters.EndpointSliceLister]{inf, discoverylisters.NewEndpointSliceLister(inf.GetIndexer())}
}

// Ingresses is the shared Ingress informer.
func (f *Informers) Ingresses() Shared[networkinglisters.IngressLister] {
	inf := informerFor(f, "ingresses", f.client.Ingresses(""), &networkingv1.Ingress{})
	return Shared[networkinglisters.IngressLister]{inf, networkinglisters.NewIngressLister(inf.GetIndexer())}
}

// IngressClasses is the shared IngressClass informer.
func (f *Informers) IngressClasses() Shared[networkinglisters.IngressClassLister] {
	inf := informerFor(f, "ingressclasses", f.client.IngressClasses(), &networkingv1.IngressClass{})
	return Shared[networkinglisters.IngressClassLister]{inf, networkinglisters.NewIngressClassLister(inf.GetIndexer())}
}

// CertificateSigningRequests is the shared certificate request informer.
func (f *Informers) CertificateSigningRequests() Shared[certificateslisters.CertificateSigningRequestLister] {
	inf := informerFor(f, "certificatesigningrequests", f.client.CertificateSigningRequests(), &certificatesv1.CertificateSigningRequest{})
	return Shared[certificateslisters.CertificateSigningRequestLister]{inf, certificateslisters.NewCertificateSigningRequestLister(inf.GetIndexer())}
}

// NetworkPolicies is the shared NetworkPolicy informer.
func (f *Informers) NetworkPolicies() Shared[networkinglisters.NetworkPolicyLister] {
	inf := informerFor(f, "networkpolicies", f.client.NetworkPolicies(""), &networkingv1.NetworkPolicy{})
	return Shared[networkinglisters.NetworkPolicyLister]{inf, networkinglisters.NewNetworkPolicyLister(inf.GetIndexer())}
}

// ServiceAccounts is the shared service account informer.
func (f *Informers) ServiceAccounts() Shared[corelisters.ServiceAccountLister] {
	inf := informerFor(f, "serviceaccounts", f.client.ServiceAccounts(""), &corev1.ServiceAccount{})
	return Shared[corelisters.ServiceAccountLister]{inf, corelisters.NewServiceAccountLister(inf.GetIndexer())}
}

// ResourceQuotas is the shared ResourceQuota informer.
func (f *Informers) ResourceQuotas() Shared[corelisters.ResourceQuotaLister] {
	inf := informerFor(f, "resourcequotas", f.client.ResourceQuotas(""), &corev1.ResourceQuota{})
	return Shared[corelisters.ResourceQuotaLister]{inf, corelisters.NewResourceQuotaLister(inf.GetIndexer())}
}

// ReplicaSets is the shared ReplicaSet informer.
func (f *Informers) ReplicaSets() Shared[appslisters.ReplicaSetLister] {
	inf := informerFor(f, "replicasets", f.client.ReplicaSets(""), &appsv1.ReplicaSet{})
	return Shared[appslisters.ReplicaSetLister]{inf, appslisters.NewReplicaSetLister(inf.GetIndexer())}
}

// Endpoints is the shared Endpoints informer.
func (f *Informers) Endpoints() Shared[corelisters.EndpointsLister] {
	inf := informerFor(f, "endpoints", f.client.Endpoints(""), &corev1.Endpoints{})
	return Shared[corelisters.EndpointsLister]{inf, corelisters.NewEndpointsLister(inf.GetIndexer())}
}

// ReplicationControllers is the shared ReplicationController informer.
func (f *Informers) ReplicationControllers() Shared[corelisters.ReplicationControllerLister] {
	inf := informerFor(f, "replicationcontrollers", f.client.ReplicationControllers(""), &corev1.ReplicationController{})
	return Shared[corelisters.ReplicationControllerLister]{inf, corelisters.NewReplicationControllerLister(inf.GetIndexer())}
}

// PodDisruptionBudgets is the shared PodDisruptionBudget informer.
func (f *Informers) PodDisruptionBudgets() Shared[policylisters.PodDisruptionBudgetLister] {
	inf := informerFor(f, "poddisruptionbudgets", f.client.PodDisruptionBudgets(""), &policyv1.PodDisruptionBudget{})
	return Shared[policylisters.PodDisruptionBudgetLister]{inf, policylisters.NewPodDisruptionBudgetLister(inf.GetIndexer())}
}

// HorizontalPodAutoscalers is the shared autoscaler informer.
func (f *Informers) HorizontalPodAutoscalers() Shared[autoscalinglisters.HorizontalPodAutoscalerLister] {
	inf := informerFor(f, "horizontalpodautoscalers", f.client.HorizontalPodAutoscalers(""), &autoscalingv2.HorizontalPodAutoscaler{})
	return Shared[autoscalinglisters.HorizontalPodAutoscalerLister]{inf, autoscalinglisters.NewHorizontalPodAutoscalerLister(inf.GetIndexer())}
}

// Deployments is the shared Deployment informer.
func (f *Informers) Deployments() Shared[appslisters.DeploymentLister] {
	inf := informerFor(f, "deployments", f.client.Deployments(""), &appsv1.Deployment{})
	return Shared[appslisters.DeploymentLister]{inf, appslisters.NewDeploymentLister(inf.GetIndexer())}
}

// DaemonSets is the shared DaemonSet informer.
func (f *Informers) DaemonSets() Shared[appslisters.DaemonSetLister] {
	inf := informerFor(f, "daemonsets", f.client.DaemonSets(""), &appsv1.DaemonSet{})
	return Shared[appslisters.DaemonSetLister]{inf, appslisters.NewDaemonSetLister(inf.GetIndexer())}
}

// Jobs is the shared Job informer.
func (f *Informers) Jobs() Shared[batchlisters.JobLister] {
	inf := informerFor(f, "jobs", f.client.Jobs(""), &batchv1.Job{})
	return Shared[batchlisters.JobLister]{inf, batchlisters.NewJobLister(inf.GetIndexer())}
}

// CronJobs is the shared CronJob informer.
func (f *Informers) CronJobs() Shared[batchlisters.CronJobLister] {
	inf := informerFor(f, "cronjobs", f.client.CronJobs(""), &batchv1.CronJob{})
	return Shared[batchlisters.CronJobLister]{inf, batchlisters.NewCronJobLister(inf.GetIndexer())}
}

// StatefulSets is the shared StatefulSet informer.
func (f *Informers) StatefulSets() Shared[appslisters.StatefulSetLister] {
	inf := informerFor(f, "statefulsets", f.client.StatefulSets(""), &appsv1.StatefulSet{})
	return Shared[appslisters.StatefulSetLister]{inf, appslisters.NewStatefulSetLister(inf.GetIndexer())}
}

// ControllerRevisions is the shared ControllerRevision informer.
func (f *Informers) ControllerRevisions() Shared[appslisters.ControllerRevisionLister] {
	inf := informerFor(f, "controllerrevisions", f.client.ControllerRevisions(""), &appsv1.ControllerRevision{})
	return Shared[appslisters.ControllerRevisionLister]{inf, appslisters.NewControllerRevisionLister(inf.GetIndexer())}
}

// StorageVersionMigrations is the shared StorageVersionMigration informer.
func (f *Informers) StorageVersionMigrations() Shared[svmlisters.StorageVersionMigrationLister] {
	inf := informerFor(f, "storageversionmigrations", f.client.StorageVersionMigrations(), &svmv1.StorageVersionMigration{})
	return Shared[svmlisters.StorageVersionMigrationLister]{inf, svmlisters.NewStorageVersionMigrationLister(inf.GetIndexer())}
}

// PersistentVolumes is the shared PersistentVolume informer.
func (f *Informers) PersistentVolumes() Shared[corelisters.PersistentVolumeLister] {
	inf := informerFor(f, "persistentvolumes", f.client.PersistentVolumes(), &corev1.PersistentVolume{})
	return Shared[corelisters.PersistentVolumeLister]{inf, corelisters.NewPersistentVolumeLister(inf.GetIndexer())}
}

// PersistentVolumeClaims is the shared PersistentVolumeClaim informer.
func (f *Informers) PersistentVolumeClaims() Shared[corelisters.PersistentVolumeClaimLister] {
	inf := informerFor(f, "persistentvolumeclaims", f.client.PersistentVolumeClaims(""), &corev1.PersistentVolumeClaim{})
	return Shared[corelisters.PersistentVolumeClaimLister]{inf, corelisters.NewPersistentVolumeClaimLister(inf.GetIndexer())}
}

// StorageClasses is the shared StorageClass informer.
func (f *Informers) StorageClasses() Shared[storagelisters.StorageClassLister] {
	inf := informerFor(f, "storageclasses", f.client.StorageClasses(), &storagev1.StorageClass{})
	return Shared[storagelisters.StorageClassLister]{inf, storagelisters.NewStorageClassLister(inf.GetIndexer())}
}

// Leases is the shared Lease informer.
func (f *Informers) Leases() Shared[coordinationlisters.LeaseLister] {
	inf := informerFor(f, "leases", f.client.Leases(""), &coordinationv1.Lease{})
	return Shared[coordinationlisters.LeaseLister]{inf, coordinationlisters.NewLeaseLister(inf.GetIndexer())}
}

// Shared is one shared informer and the lister over its cache, as
// client-go's typed informers give them.
type Shared[L any] struct {
	informer cache.SharedIndexInformer
	lister   L
}

// Informer is the shared informer.
func (s Shared[L]) Informer() cache.SharedIndexInformer { return s.informer }

// Lister reads its cache.
func (s Shared[L]) Lister() L { return s.lister }

// Start runs every informer asked for so far that is not running yet,
// until ctx ends. A context, not its Done channel: client-go wraps a bare
// channel in a context of its own, and every context made from that one
// costs a goroutine watching it (80 in a server with its agent and 30
// pods).
func (f *Informers) Start(ctx context.Context) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, inf := range f.informers {
		if inf.start() {
			f.wg.Go(func() { inf.RunWithContext(ctx) })
		}
	}
}

// WaitForCacheSync waits for every started informer to fill its cache,
// and reports the resources whose cache did not.
func (f *Informers) WaitForCacheSync(stop <-chan struct{}) map[string]bool {
	f.mu.Lock()
	synced := map[string]cache.InformerSynced{}
	for name, inf := range f.informers {
		if inf.running() {
			synced[name] = inf.HasSynced
		}
	}
	f.mu.Unlock()
	out := map[string]bool{}
	for name, hasSynced := range synced {
		out[name] = cache.WaitForCacheSync(stop, hasSynced)
	}
	return out
}

// Shutdown waits for the informers to stop once their stop channel closed.
func (f *Informers) Shutdown() { f.wg.Wait() }

// GroupVersionKindOf names an object's kind by this package's scheme.
func GroupVersionKindOf(obj runtime.Object) (schema.GroupVersionKind, error) {
	gvks, _, err := Scheme.ObjectKinds(obj)
	if err != nil || len(gvks) == 0 {
		return schema.GroupVersionKind{}, err
	}
	return gvks[0], nil
}

// ConfigMapsNamed is a shared informer of the ConfigMaps of one name in
// every namespace (kube-root-ca.crt): only those are listed and kept,
// not every ConfigMap of the cluster.
func (f *Informers) ConfigMapsNamed(name string) Shared[corelisters.ConfigMapLister] {
	inf := selectingInformer(f, "configmaps/"+name, f.client.ConfigMaps(""), "metadata.name="+name, &corev1.ConfigMap{})
	return Shared[corelisters.ConfigMapLister]{inf, corelisters.NewConfigMapLister(inf.GetIndexer())}
}

// SecretsOfType is a shared informer of the Secrets of one type
// (kubernetes.io/service-account-token): only those are listed and kept.
func (f *Informers) SecretsOfType(t corev1.SecretType) Shared[corelisters.SecretLister] {
	inf := selectingInformer(f, "secrets/"+string(t), f.client.Secrets(""), "type="+string(t), &corev1.Secret{})
	return Shared[corelisters.SecretLister]{inf, corelisters.NewSecretLister(inf.GetIndexer())}
}
