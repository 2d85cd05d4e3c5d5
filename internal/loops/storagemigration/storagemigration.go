// Package storagemigration carries out StorageVersionMigrations, as
// Kubernetes' storage version migrator does: it notes the resource's
// resourceVersion when the migration starts (Running), writes every
// object of the resource that is not newer than that back unchanged (the
// server stores again only what it now stores differently: a custom
// resource's new storage version, a new encryption key), and ends
// Succeeded, or Failed when the resource is not served.
package storagemigration

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/loops/controller"

	svmv1 "k8s.io/api/storagemigration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	svmlisters "k8s.io/client-go/listers/storagemigration/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
)

// Reasons of the conditions, Kubernetes' own.
const (
	reasonRunning   = "MigrationRunning"
	reasonSucceeded = "StorageVersionMigrationSucceeded"
	reasonFailed    = "StorageVersionMigrationFailed"
)

// notServedGrace is how long a migration waits for its resource to be
// served (a custom resource's definition just created) before failing.
const notServedGrace = time.Minute

// Controller is the storage-migration loop.
type Controller struct {
	client     *kube.Client
	migrations svmlisters.StorageVersionMigrationLister
	synced     []toolscache.InformerSynced
	queue      *controller.Queue[string]
	log        *slog.Logger
	clock      clock.PassiveClock
}

// New registers the controller on the factory's informers.
func New(client *kube.Client, factory *kube.Informers, env controller.Env) (*Controller, error) {
	inf := factory.StorageVersionMigrations()
	c := &Controller{client: client, migrations: inf.Lister(), synced: []toolscache.InformerSynced{inf.Informer().HasSynced},
		queue: controller.NewQueue[string]("storageversionmigration", env), log: env.Log.With("loop", "storagemigration"), clock: env.Clock}
	enqueue := func(obj any) {
		if k, err := toolscache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			c.queue.Add(k)
		}
	}
	if _, err := inf.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		return nil, err
	}
	return c, nil
}

// Run migrates until ctx ends; one migration at a time, as each may write
// a whole resource.
func (c *Controller) Run(ctx context.Context) {
	c.queue.Run(ctx, 1, c.synced, c.sync)
}

func (c *Controller) sync(ctx context.Context, name string) error {
	m, err := c.migrations.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if apimeta.IsStatusConditionTrue(m.Status.Conditions, string(svmv1.MigrationSucceeded)) ||
		apimeta.IsStatusConditionTrue(m.Status.Conditions, string(svmv1.MigrationFailed)) {
		return nil
	}
	resource, err := c.served(ctx, m)
	if err != nil {
		return err
	}
	if resource == nil {
		if wait := m.CreationTimestamp.Add(notServedGrace).Sub(c.clock.Now()); wait > 0 {
			c.queue.AddAfter(name, wait)
			return nil
		}
		return c.finish(ctx, m, svmv1.MigrationFailed, reasonFailed, "unable to obtain GVR from discovery: "+m.Spec.Resource.String()+" is not served")
	}
	gvr := resource.GroupVersionResource()
	if m.Status.ResourceVersion == "" {
		// The mark: objects written after it are in the current form.
		list, err := c.client.Metadata().Resource(gvr).List(ctx, metav1.ListOptions{Limit: 1})
		if err != nil {
			return fmt.Errorf("list %s: %w", gvr, err)
		}
		updated := m.DeepCopy()
		updated.Status.ResourceVersion = list.ResourceVersion
		apimeta.SetStatusCondition(&updated.Status.Conditions, metav1.Condition{Type: string(svmv1.MigrationRunning), Status: metav1.ConditionTrue,
			Reason: reasonRunning, Message: "The migration is running"})
		_, err = c.client.StorageVersionMigrations().UpdateStatus(ctx, updated, metav1.UpdateOptions{})
		return err // the update requeues the migration
	}
	mark, err := strconv.ParseUint(m.Status.ResourceVersion, 10, 64)
	if err != nil {
		return c.finish(ctx, m, svmv1.MigrationFailed, reasonFailed, "status.resourceVersion is not this server's: "+m.Status.ResourceVersion)
	}
	total, rewritten := 0, 0
	opts := metav1.ListOptions{Limit: 500}
	for {
		list, err := c.client.Metadata().Resource(gvr).List(ctx, opts)
		if err != nil {
			return fmt.Errorf("list %s: %w", gvr, err)
		}
		for _, obj := range list.Items {
			total++
			if rv, err := strconv.ParseUint(obj.ResourceVersion, 10, 64); err == nil && rv > mark {
				continue // written since the mark
			}
			err := c.client.Rewrite(ctx, *resource, obj.Namespace, obj.Name, obj.ResourceVersion)
			switch {
			case err == nil:
				rewritten++
			case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
			default:
				return fmt.Errorf("rewrite %s %s/%s: %w", gvr, obj.Namespace, obj.Name, err)
			}
		}
		if opts.Continue = list.Continue; opts.Continue == "" {
			break
		}
	}
	c.log.Info("storage migrated", "migration", name, "resource", gvr.String(), "objects", total, "rewritten", rewritten)
	return c.finish(ctx, m, svmv1.MigrationSucceeded, reasonSucceeded, fmt.Sprintf("%d objects verified migrated", total))
}

// served finds the migration's resource among those served (its
// preferred version), or nil.
func (c *Controller) served(ctx context.Context, m *svmv1.StorageVersionMigration) (*kube.APIResource, error) {
	all, err := c.client.ServerResources(ctx)
	if err != nil {
		return nil, err
	}
	for _, r := range all {
		if r.GroupVersion.Group == m.Spec.Resource.Group && r.Name == m.Spec.Resource.Resource && r.Has("list", "patch") {
			return &r, nil
		}
	}
	return nil, nil
}

// finish sets the migration's last condition; Running turns False.
func (c *Controller) finish(ctx context.Context, m *svmv1.StorageVersionMigration, t svmv1.MigrationConditionType, reason, message string) error {
	updated := m.DeepCopy()
	if apimeta.FindStatusCondition(updated.Status.Conditions, string(svmv1.MigrationRunning)) != nil {
		apimeta.SetStatusCondition(&updated.Status.Conditions, metav1.Condition{Type: string(svmv1.MigrationRunning), Status: metav1.ConditionFalse,
			Reason: reason, Message: message})
	}
	apimeta.SetStatusCondition(&updated.Status.Conditions, metav1.Condition{Type: string(t), Status: metav1.ConditionTrue, Reason: reason, Message: message})
	_, err := c.client.StorageVersionMigrations().UpdateStatus(ctx, updated, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
