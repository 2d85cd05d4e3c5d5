package api

import (
	"context"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// claimVolumes is which claim each volume is bound to, from one watch of
// claims, for the node authorizer: a node may read a volume bound to a
// claim one of its pods uses, as Kubernetes' graph allows.
type claimVolumes struct {
	mu      sync.RWMutex
	byClaim map[objectRef]string // claim → volume
	byPV    map[string]objectRef // volume → claim
	synced  chan struct{}
}

func newClaimVolumes() *claimVolumes {
	return &claimVolumes{byClaim: map[objectRef]string{}, byPV: map[string]objectRef{}, synced: make(chan struct{})}
}

// Replace implements follower.
func (c *claimVolumes) Replace(objs []runtime.Object) {
	c.mu.Lock()
	c.byClaim, c.byPV = map[objectRef]string{}, map[string]objectRef{}
	for _, o := range objs {
		c.setLocked(o.(*corev1.PersistentVolumeClaim))
	}
	c.mu.Unlock()
	select {
	case <-c.synced:
	default:
		close(c.synced)
	}
}

// Set implements follower.
func (c *claimVolumes) Set(obj runtime.Object) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.setLocked(obj.(*corev1.PersistentVolumeClaim))
}

// Delete implements follower.
func (c *claimVolumes) Delete(obj runtime.Object) {
	pvc := obj.(*corev1.PersistentVolumeClaim)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.removeLocked(objectRef{"persistentvolumeclaims", pvc.Namespace, pvc.Name})
}

func (c *claimVolumes) setLocked(pvc *corev1.PersistentVolumeClaim) {
	key := objectRef{"persistentvolumeclaims", pvc.Namespace, pvc.Name}
	c.removeLocked(key)
	if pvc.Spec.VolumeName != "" {
		c.byClaim[key], c.byPV[pvc.Spec.VolumeName] = pvc.Spec.VolumeName, key
	}
}

func (c *claimVolumes) removeLocked(key objectRef) {
	if pv, ok := c.byClaim[key]; ok {
		delete(c.byClaim, key)
		if c.byPV[pv] == key {
			delete(c.byPV, pv)
		}
	}
}

// claimOf is the claim the volume is bound to.
func (c *claimVolumes) claimOf(ctx context.Context, pv string) (objectRef, bool, error) {
	select {
	case <-c.synced:
	case <-ctx.Done():
		return objectRef{}, false, ctx.Err()
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	ref, ok := c.byPV[pv]
	return ref, ok, nil
}

// nodeRelations answers the node authorizer from the pod graph and the
// claims' volumes together.
type nodeRelations struct {
	*nodeGraph
	claims *claimVolumes
}

// UsesVolume reports whether a pod bound to node uses the claim the
// volume is bound to.
func (r nodeRelations) UsesVolume(ctx context.Context, node, pv string) (bool, error) {
	claim, ok, err := r.claims.claimOf(ctx, pv)
	if err != nil || !ok {
		return false, err
	}
	return r.Uses(ctx, node, claim.resource, claim.namespace, claim.name)
}
