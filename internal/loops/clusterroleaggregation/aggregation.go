// Package clusterroleaggregation is Kubernetes' ClusterRole aggregation
// controller: a ClusterRole with an aggregationRule holds the rules of
// every other ClusterRole its selectors match, kept as they change, so
// that admin, edit and view grow with the roles labelled for them (an
// operator's CRDs, for instance).
package clusterroleaggregation

import (
	"context"
	"log/slog"
	"sort"

	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/loops/controller"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	rbaclisters "k8s.io/client-go/listers/rbac/v1"
	toolscache "k8s.io/client-go/tools/cache"
)

// Controller is the aggregation loop.
type Controller struct {
	client *kube.Client
	roles  rbaclisters.ClusterRoleLister
	synced []toolscache.InformerSynced
	queue  *controller.Queue[string]
	log    *slog.Logger
}

// New registers the loop on the factory's informers.
func New(client *kube.Client, factory *kube.Informers, env controller.Env) (*Controller, error) {
	roles := factory.ClusterRoles()
	c := &Controller{client: client, roles: roles.Lister(), synced: []toolscache.InformerSynced{roles.Informer().HasSynced},
		queue: controller.NewQueue[string]("clusterroleaggregation", env), log: env.Log.With("loop", "clusterroleaggregation")}
	// Any role's change may change what any aggregated role gathers: the
	// aggregated ones are few (Kubernetes' controller does the same).
	wake := func(any) { c.enqueueAggregated() }
	if _, err := roles.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: wake, UpdateFunc: func(_, cur any) { wake(cur) }, DeleteFunc: wake,
	}); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Controller) enqueueAggregated() {
	all, err := c.roles.List(labels.Everything())
	if err != nil {
		return
	}
	for _, r := range all {
		if r.AggregationRule != nil {
			c.queue.Add(r.Name)
		}
	}
}

// Run keeps the aggregated roles until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	c.queue.Run(ctx, workers, c.synced, c.sync)
}

func (c *Controller) sync(ctx context.Context, name string) error {
	role, err := c.roles.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if role.AggregationRule == nil {
		return nil
	}
	rules, err := c.gather(role)
	if err != nil {
		return err
	}
	if equality.Semantic.DeepEqual(rules, role.Rules) {
		return nil
	}
	updated := role.DeepCopy()
	updated.Rules = rules
	if _, err := c.client.ClusterRoles().Update(ctx, updated, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			c.queue.Add(name) // the informer brings the newer one
			return nil
		}
		return err
	}
	c.log.Info("aggregated clusterrole", "name", name, "rules", len(rules))
	return nil
}

// gather is the rules of the roles role's selectors match, in the order
// of their names, each rule once; never role's own.
func (c *Controller) gather(role *rbacv1.ClusterRole) ([]rbacv1.PolicyRule, error) {
	matched := map[string]*rbacv1.ClusterRole{}
	for i := range role.AggregationRule.ClusterRoleSelectors {
		sel, err := metav1.LabelSelectorAsSelector(&role.AggregationRule.ClusterRoleSelectors[i])
		if err != nil {
			continue // validation refuses such selectors
		}
		found, err := c.roles.List(sel)
		if err != nil {
			return nil, err
		}
		for _, r := range found {
			if r.Name != role.Name {
				matched[r.Name] = r
			}
		}
	}
	names := make([]string, 0, len(matched))
	for n := range matched {
		names = append(names, n)
	}
	sort.Strings(names)
	rules := []rbacv1.PolicyRule{}
	for _, n := range names {
		for _, r := range matched[n].Rules {
			if !contains(rules, r) {
				rules = append(rules, r)
			}
		}
	}
	return rules, nil
}

func contains(rules []rbacv1.PolicyRule, r rbacv1.PolicyRule) bool {
	for _, have := range rules {
		if equality.Semantic.DeepEqual(have, r) {
			return true
		}
	}
	return false
}
