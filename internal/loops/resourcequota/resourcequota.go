// Package resourcequota keeps each ResourceQuota's status: hard as its
// spec says, used as counted from the objects of its namespace (with the
// quota package's rules, the ones quota admission charges by), as
// Kubernetes' resource quota controller does. Admission charges a quota
// at each create; this loop gives back what deleted and finished objects
// held — at once for pods and Services, which it watches, and at the next
// full recount (every Resync) for other kinds.
package resourcequota

import (
	"context"
	"log/slog"
	"time"

	"github.com/orch-dev/orch/internal/apis"
	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/loops/controller"
	"github.com/orch-dev/orch/internal/quota"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	corelisters "k8s.io/client-go/listers/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
)

// Resync is how often every quota is counted again from scratch.
const Resync = 30 * time.Second

// Controller is the resource quota loop.
type Controller struct {
	client   *kube.Client
	quotas   corelisters.ResourceQuotaLister
	pods     corelisters.PodLister
	services corelisters.ServiceLister
	claims   corelisters.PersistentVolumeClaimLister
	synced   []toolscache.InformerSynced
	queue    *controller.Queue[string] // namespace/name
	env      controller.Env
	log      *slog.Logger
}

// New registers the controller on the factory's informers.
func New(client *kube.Client, factory *kube.Informers, env controller.Env) (*Controller, error) {
	rq, pods, svcs, claims := factory.ResourceQuotas(), factory.Pods(), factory.Services(), factory.PersistentVolumeClaims()
	c := &Controller{
		client: client, quotas: rq.Lister(), pods: pods.Lister(), services: svcs.Lister(), claims: claims.Lister(), env: env, log: env.Log.With("loop", "resourcequota"),
		synced: []toolscache.InformerSynced{rq.Informer().HasSynced, pods.Informer().HasSynced, svcs.Informer().HasSynced, claims.Informer().HasSynced},
		queue:  controller.NewQueue[string]("resourcequota", env),
	}
	if _, err := rq.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { c.enqueue(obj.(*corev1.ResourceQuota)) },
		UpdateFunc: func(_, obj any) {
			if q := obj.(*corev1.ResourceQuota); !apiequality.Semantic.DeepEqual(q.Spec.Hard, q.Status.Hard) {
				c.enqueue(q)
			}
		},
	}); err != nil {
		return nil, err
	}
	// What a deleted or finished object held comes back at once.
	namespaceOf := func(obj any) string {
		if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if m, ok := obj.(metav1.Object); ok {
			return m.GetNamespace()
		}
		return ""
	}
	if _, err := pods.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		UpdateFunc: func(old, obj any) {
			if !quota.Finished(old.(*corev1.Pod)) && quota.Finished(obj.(*corev1.Pod)) {
				c.enqueueNamespace(namespaceOf(obj))
			}
		},
		DeleteFunc: func(obj any) { c.enqueueNamespace(namespaceOf(obj)) },
	}); err != nil {
		return nil, err
	}
	if _, err := claims.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		DeleteFunc: func(obj any) { c.enqueueNamespace(namespaceOf(obj)) },
	}); err != nil {
		return nil, err
	}
	if _, err := svcs.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		UpdateFunc: func(old, obj any) {
			if old.(*corev1.Service).Spec.Type != obj.(*corev1.Service).Spec.Type {
				c.enqueueNamespace(namespaceOf(obj))
			}
		},
		DeleteFunc: func(obj any) { c.enqueueNamespace(namespaceOf(obj)) },
	}); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Controller) enqueue(q *corev1.ResourceQuota) { c.queue.Add(q.Namespace + "/" + q.Name) }

func (c *Controller) enqueueNamespace(ns string) {
	quotas, _ := c.quotas.ResourceQuotas(ns).List(labels.Everything())
	for _, q := range quotas {
		c.enqueue(q)
	}
}

// Run keeps the quotas' status until ctx ends, counting every quota
// again each Resync.
func (c *Controller) Run(ctx context.Context, workers int) {
	go func() {
		t := c.env.Clock.NewTicker(Resync)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C():
				quotas, _ := c.quotas.List(labels.Everything())
				for _, q := range quotas {
					c.enqueue(q)
				}
			}
		}
	}()
	c.queue.Run(ctx, workers, c.synced, c.sync)
}

func (c *Controller) sync(ctx context.Context, key string) error {
	namespace, name, err := toolscache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	q, err := c.quotas.ResourceQuotas(namespace).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	used, err := c.count(ctx, q)
	if err != nil {
		return err
	}
	if apiequality.Semantic.DeepEqual(q.Status.Hard, q.Spec.Hard) && apiequality.Semantic.DeepEqual(q.Status.Used, used) {
		return nil
	}
	q = q.DeepCopy()
	q.Status.Hard, q.Status.Used = q.Spec.Hard, used
	_, err = c.client.ResourceQuotas(namespace).UpdateStatus(ctx, q, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		c.queue.Add(key) // admission charged it meanwhile: count again
		return nil
	}
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// count is what the objects of the quota's namespace use of each
// resource it limits.
func (c *Controller) count(ctx context.Context, q *corev1.ResourceQuota) (corev1.ResourceList, error) {
	used := corev1.ResourceList{}
	for r := range q.Spec.Hard {
		used[r] = resource.MustParse("0")
	}
	add := func(u corev1.ResourceList) { quota.Add(&used, quota.Limited(q.Spec.Hard, u), false) }
	pods, err := c.pods.Pods(q.Namespace).List(labels.Everything())
	if err != nil {
		return nil, err
	}
	podsGR := schema.GroupResource{Resource: "pods"}
	for _, p := range pods {
		if !quota.Finished(p) && quota.Matches(q, p) {
			add(quota.Usage(podsGR, p))
		}
	}
	services, err := c.services.Services(q.Namespace).List(labels.Everything())
	if err != nil {
		return nil, err
	}
	svcGR := schema.GroupResource{Resource: "services"}
	for _, s := range services {
		if quota.Matches(q, s) {
			add(quota.Usage(svcGR, s))
		}
	}
	claims, err := c.claims.PersistentVolumeClaims(q.Namespace).List(labels.Everything())
	if err != nil {
		return nil, err
	}
	claimsGR := schema.GroupResource{Resource: "persistentvolumeclaims"}
	for _, pvc := range claims {
		if quota.Matches(q, pvc) {
			add(quota.Usage(claimsGR, pvc))
		}
	}
	// Other kinds are counted by listing them: only object counts.
	counted := map[schema.GroupResource]bool{podsGR: true, svcGR: true, claimsGR: true}
	for r := range q.Spec.Hard {
		gr, ok := quota.CountedKind(r)
		if !ok || counted[gr] {
			continue
		}
		counted[gr] = true
		if quota.Scoped(q) {
			continue // scopes select pods only
		}
		n, err := c.countObjects(ctx, gr, q.Namespace)
		if err != nil {
			return nil, err
		}
		for _, key := range []corev1.ResourceName{quota.CountKey(gr), quota.ClassicName(gr)} {
			if _, limited := q.Spec.Hard[key]; limited && key != "" {
				used[key] = *resource.NewQuantity(n, resource.DecimalSI)
			}
		}
	}
	return used, nil
}

// countObjects lists the kind's objects in namespace (their metadata
// only); a kind the server does not serve has none.
func (c *Controller) countObjects(ctx context.Context, gr schema.GroupResource, namespace string) (int64, error) {
	for _, gv := range apis.Served {
		if gv.Group != gr.Group {
			continue
		}
		list, err := c.client.Metadata().Resource(gv.WithResource(gr.Resource)).Namespace(namespace).List(ctx, metav1.ListOptions{})
		if apierrors.IsNotFound(err) {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
		return int64(len(list.Items)), nil
	}
	return 0, nil
}
