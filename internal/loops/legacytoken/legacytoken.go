// Package legacytoken fills in the kubernetes.io/service-account-token
// Secrets users still create, as Kubernetes' token controller does: a
// Secret naming its service account (annotation
// kubernetes.io/service-account.name) gets a token that never expires,
// the cluster CA and the namespace, and the account's UID; a Secret
// whose account is gone (or was recreated) is deleted, and so are an
// account's token Secrets when the account is.
package legacytoken

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
	"k8s.io/utils/ptr"
)

// Issue signs a legacy token for the account (namespace, name, uid)
// and the Secret that will hold it.
type Issue func(namespace, serviceAccount, serviceAccountUID, secret string) (string, error)

// Controller is the legacy token loop.
type Controller struct {
	client   *kube.Client
	issue    Issue
	ca       func() []byte
	env      controller.Env
	accounts corelisters.ServiceAccountLister
	secrets  corelisters.SecretLister
	synced   []toolscache.InformerSynced
	queue    *controller.Queue[string] // namespace/secret
	log      *slog.Logger
}

// New registers the controller on the factory's informers; ca gives the
// PEM each Secret carries as ca.crt.
func New(client *kube.Client, factory *kube.Informers, issue Issue, ca func() []byte, env controller.Env) (*Controller, error) {
	sa, sec := factory.ServiceAccounts(), factory.SecretsOfType(corev1.SecretTypeServiceAccountToken)
	env = env.WithDefaults()
	c := &Controller{
		client: client, issue: issue, ca: ca, env: env, accounts: sa.Lister(), secrets: sec.Lister(), log: env.Log.With("loop", "legacytoken"),
		synced: []toolscache.InformerSynced{sa.Informer().HasSynced, sec.Informer().HasSynced},
		queue:  controller.NewQueue[string]("legacytoken", env),
	}
	onSecret := func(obj any) {
		if k, err := toolscache.MetaNamespaceKeyFunc(obj); err == nil {
			c.queue.Add(k)
		}
	}
	if _, err := sec.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: onSecret, UpdateFunc: func(_, obj any) { onSecret(obj) },
	}); err != nil {
		return nil, err
	}
	// An account's change or deletion concerns the Secrets naming it.
	onAccount := func(obj any) {
		if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		a, ok := obj.(*corev1.ServiceAccount)
		if !ok {
			return
		}
		secrets, _ := c.secrets.Secrets(a.Namespace).List(labels.Everything())
		for _, s := range secrets {
			if s.Annotations[corev1.ServiceAccountNameKey] == a.Name {
				c.queue.Add(s.Namespace + "/" + s.Name)
			}
		}
	}
	if _, err := sa.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: onAccount, UpdateFunc: func(_, obj any) { onAccount(obj) }, DeleteFunc: onAccount,
	}); err != nil {
		return nil, err
	}
	return c, nil
}

// Run keeps the Secrets until ctx ends; a new CA is written in every
// one, as Kubernetes' token controller does.
func (c *Controller) Run(ctx context.Context, workers int) {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		controller.WhenChanged(ctx, c.env.Clock, caCheckInterval, c.ca, func() {
			secrets, _ := c.secrets.List(labels.Everything())
			for _, s := range secrets {
				c.queue.Add(s.Namespace + "/" + s.Name)
			}
		})
	})
	c.queue.Run(ctx, workers, c.synced, c.sync)
}

// caCheckInterval is how often the loop looks whether the CA changed
// (orch certificate rotate-ca).
const caCheckInterval = 10 * time.Second

func (c *Controller) sync(ctx context.Context, key string) error {
	namespace, name, err := toolscache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	sec, err := c.secrets.Secrets(namespace).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if sec.DeletionTimestamp != nil {
		return nil
	}
	accountName := sec.Annotations[corev1.ServiceAccountNameKey]
	account, err := c.accounts.ServiceAccounts(namespace).Get(accountName)
	if apierrors.IsNotFound(err) || err == nil && !belongs(sec, account) {
		// Its account is gone: so is the Secret, as in Kubernetes. The
		// UID precondition spares a Secret recreated meanwhile.
		err := c.client.Secrets(namespace).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: ptr.To(sec.UID)}})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		return err
	}
	if err != nil {
		return err
	}
	if len(sec.Data[corev1.ServiceAccountTokenKey]) > 0 && sec.Annotations[corev1.ServiceAccountUIDKey] == string(account.UID) &&
		string(sec.Data[corev1.ServiceAccountRootCAKey]) == string(c.ca()) && string(sec.Data[corev1.ServiceAccountNamespaceKey]) == namespace {
		return nil
	}
	ca := c.ca()
	token := sec.Data[corev1.ServiceAccountTokenKey]
	if len(token) == 0 {
		raw, err := c.issue(namespace, account.Name, string(account.UID), sec.Name)
		if err != nil {
			return err
		}
		token = []byte(raw)
	}
	sec = sec.DeepCopy()
	sec.Annotations = maps.Clone(sec.Annotations)
	sec.Annotations[corev1.ServiceAccountUIDKey] = string(account.UID)
	if sec.Data == nil {
		sec.Data = map[string][]byte{}
	}
	sec.Data[corev1.ServiceAccountTokenKey] = token
	sec.Data[corev1.ServiceAccountRootCAKey] = ca
	sec.Data[corev1.ServiceAccountNamespaceKey] = []byte(namespace)
	_, err = c.client.Secrets(namespace).Update(ctx, sec, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil // the informer brings the newer one, and another sync
	}
	return err
}

// belongs reports whether a Secret is for this incarnation of its
// account: one that names another UID was made for an account since
// deleted.
func belongs(sec *corev1.Secret, account *corev1.ServiceAccount) bool {
	uid := sec.Annotations[corev1.ServiceAccountUIDKey]
	return uid == "" || uid == string(account.UID)
}
