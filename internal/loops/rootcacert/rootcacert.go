// Package rootcacert keeps the kube-root-ca.crt ConfigMap in every
// namespace, holding the cluster CA under ca.crt, as Kubernetes' root-CA
// publisher does: pods' kube-api-access volumes read it to trust the API
// server, and tools wait for it in a new namespace. A deleted or changed
// one is put back; a new CA is written everywhere.
package rootcacert

import (
	"context"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/loops/controller"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
)

// Name is the ConfigMap's name, and Key its one key.
const (
	Name = "kube-root-ca.crt"
	Key  = "ca.crt"
)

// descriptionAnnotation says what the ConfigMap is for, as Kubernetes
// annotates it.
const descriptionAnnotation = "kubernetes.io/description"

const description = "The CA bundle that signs the API server's certificate, for clients inside the cluster " +
	"that reach it by the kubernetes Service (kubernetes.default.svc); nothing else is promised of it."

// Controller is the root-CA publisher loop.
type Controller struct {
	client     *kube.Client
	ca         func() []byte
	env        controller.Env
	namespaces corelisters.NamespaceLister
	configMaps corelisters.ConfigMapLister
	synced     []toolscache.InformerSynced
	queue      *controller.Queue[string]
	log        *slog.Logger
}

// caCheckInterval is how often the loop looks whether the CA it
// publishes changed (orch certificate rotate-ca).
const caCheckInterval = 10 * time.Second

// New registers the controller on the factory's informers; ca gives the
// PEM it publishes.
func New(client *kube.Client, factory *kube.Informers, ca func() []byte, env controller.Env) (*Controller, error) {
	ns, cms := factory.Namespaces(), factory.ConfigMapsNamed(Name)
	env = env.WithDefaults()
	c := &Controller{
		client: client, ca: ca, env: env, namespaces: ns.Lister(), configMaps: cms.Lister(), log: env.Log.With("loop", "rootcacert"),
		synced: []toolscache.InformerSynced{ns.Informer().HasSynced, cms.Informer().HasSynced},
		queue:  controller.NewQueue[string]("rootcacert", env),
	}
	if _, err := ns.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.queue.Add(obj.(*corev1.Namespace).Name) },
		UpdateFunc: func(_, obj any) { c.queue.Add(obj.(*corev1.Namespace).Name) },
	}); err != nil {
		return nil, err
	}
	onConfigMap := func(obj any) {
		if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if cm, ok := obj.(*corev1.ConfigMap); ok && cm.Name == Name {
			c.queue.Add(cm.Namespace)
		}
	}
	if _, err := cms.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, obj any) { onConfigMap(obj) },
		DeleteFunc: onConfigMap,
	}); err != nil {
		return nil, err
	}
	return c, nil
}

// Run keeps the ConfigMaps until ctx ends; a new CA is written in every
// namespace.
func (c *Controller) Run(ctx context.Context, workers int) {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		controller.WhenChanged(ctx, c.env.Clock, caCheckInterval, c.ca, func() {
			namespaces, _ := c.namespaces.List(labels.Everything())
			for _, ns := range namespaces {
				c.queue.Add(ns.Name)
			}
		})
	})
	c.queue.Run(ctx, workers, c.synced, c.sync)
}

func (c *Controller) sync(ctx context.Context, namespace string) error {
	if live, err := controller.LiveNamespace(c.namespaces, namespace); !live || err != nil {
		return err
	}
	want := map[string]string{Key: string(c.ca())}
	cm, err := c.configMaps.ConfigMaps(namespace).Get(Name)
	if apierrors.IsNotFound(err) {
		_, err = c.client.ConfigMaps(namespace).Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: Name, Annotations: map[string]string{descriptionAnnotation: description}},
			Data:       want,
		}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) || apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) || apierrors.IsNotFound(err) {
			return nil // the informer brings what is there; a namespace going away wants none
		}
		return err
	}
	if err != nil {
		return err
	}
	if maps.Equal(cm.Data, want) && len(cm.BinaryData) == 0 && cm.Annotations[descriptionAnnotation] == description {
		return nil
	}
	cm = cm.DeepCopy()
	cm.Data, cm.BinaryData = want, nil
	if cm.Annotations == nil {
		cm.Annotations = map[string]string{}
	}
	cm.Annotations[descriptionAnnotation] = description
	_, err = c.client.ConfigMaps(namespace).Update(ctx, cm, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		c.queue.Add(namespace)
		return nil
	}
	return err
}
