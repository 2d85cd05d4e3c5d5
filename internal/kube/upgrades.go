package kube

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/listers"

	"github.com/orch-dev/orch/internal/upgradeapi"
)

// Upgrades is typed access to orch's Upgrade plans (a custom resource the
// server installs, internal/loops/upgrade).
func (c *Client) Upgrades() Resource[*upgradeapi.Upgrade, *upgradeapi.UpgradeList] {
	return resource(c, upgradeapi.GroupVersion, "upgrades", "",
		func() *upgradeapi.Upgrade { return &upgradeapi.Upgrade{} }, func() *upgradeapi.UpgradeList { return &upgradeapi.UpgradeList{} })
}

// Upgrades is the shared Upgrade informer.
func (f *Informers) Upgrades() Shared[listers.ResourceIndexer[*upgradeapi.Upgrade]] {
	inf := informerFor(f, "upgrades", f.client.Upgrades(), &upgradeapi.Upgrade{})
	return Shared[listers.ResourceIndexer[*upgradeapi.Upgrade]]{inf, listers.New[*upgradeapi.Upgrade](inf.GetIndexer(), upgradeapi.GroupVersion.WithResource("upgrade").GroupResource())}
}

// Evict asks the eviction API to remove a pod (pods/eviction), as kubectl
// drain does: a PodDisruptionBudget it would break refuses it with 429.
func (c *Client) Evict(ctx context.Context, namespace, name string) error {
	ev := &policyv1.Eviction{TypeMeta: metav1.TypeMeta{APIVersion: "policy/v1", Kind: "Eviction"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
	return c.groups[corev1.SchemeGroupVersion].Post().Namespace(namespace).Resource("pods").Name(name).SubResource("eviction").
		Body(ev).Do(ctx).Error()
}
