// Package serviceaccount gives every namespace its "default"
// ServiceAccount, and puts it back when it is deleted, as Kubernetes'
// service account controller does: pods that name no service account run
// as this one.
package serviceaccount

import (
	"context"
	"log/slog"

	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/loops/controller"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
)

// Default is the service account every namespace gets.
const Default = "default"

// Controller is the service account loop.
type Controller struct {
	client     *kube.Client
	namespaces corelisters.NamespaceLister
	accounts   corelisters.ServiceAccountLister
	synced     []toolscache.InformerSynced
	queue      *controller.Queue[string]
	log        *slog.Logger
}

// New registers the controller on the factory's informers.
func New(client *kube.Client, factory *kube.Informers, env controller.Env) (*Controller, error) {
	ns, sa := factory.Namespaces(), factory.ServiceAccounts()
	c := &Controller{
		client: client, namespaces: ns.Lister(), accounts: sa.Lister(), log: env.Log.With("loop", "serviceaccount"),
		synced: []toolscache.InformerSynced{ns.Informer().HasSynced, sa.Informer().HasSynced},
		queue:  controller.NewQueue[string]("serviceaccount", env),
	}
	if _, err := ns.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.queue.Add(obj.(*corev1.Namespace).Name) },
		UpdateFunc: func(_, obj any) { c.queue.Add(obj.(*corev1.Namespace).Name) },
	}); err != nil {
		return nil, err
	}
	if _, err := sa.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if a, ok := obj.(*corev1.ServiceAccount); ok && a.Name == Default {
				c.queue.Add(a.Namespace)
			}
		},
	}); err != nil {
		return nil, err
	}
	return c, nil
}

// Run keeps the default service accounts until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	c.queue.Run(ctx, workers, c.synced, c.sync)
}

func (c *Controller) sync(ctx context.Context, namespace string) error {
	if live, err := controller.LiveNamespace(c.namespaces, namespace); !live || err != nil {
		return err
	}
	if _, err := c.accounts.ServiceAccounts(namespace).Get(Default); err == nil {
		return nil
	}
	_, err := c.client.ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: Default}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) || apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) || apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
