package nodegraph

import (
	"context"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Claims is which claim each volume is bound to, from one watch of
// claims, for the node authorizer: a node may read a volume bound to a
// claim one of its pods uses, as Kubernetes' graph allows.
type Claims struct {
	mu      sync.RWMutex
	byClaim map[Ref]string // claim → volume
	byPV    map[string]Ref // volume → claim
	synced  chan struct{}
}

// NewClaims is empty until its first list.
func NewClaims() *Claims {
	return &Claims{byClaim: map[Ref]string{}, byPV: map[string]Ref{}, synced: make(chan struct{})}
}

// Replace implements the API server's follower.
func (c *Claims) Replace(objs []runtime.Object) {
	c.mu.Lock()
	c.byClaim, c.byPV = map[Ref]string{}, map[string]Ref{}
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

// Set implements the API server's follower.
func (c *Claims) Set(obj runtime.Object) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.setLocked(obj.(*corev1.PersistentVolumeClaim))
}

// Delete implements the API server's follower.
func (c *Claims) Delete(obj runtime.Object) {
	pvc := obj.(*corev1.PersistentVolumeClaim)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.removeLocked(Ref{"persistentvolumeclaims", pvc.Namespace, pvc.Name})
}

func (c *Claims) setLocked(pvc *corev1.PersistentVolumeClaim) {
	key := Ref{"persistentvolumeclaims", pvc.Namespace, pvc.Name}
	c.removeLocked(key)
	if pvc.Spec.VolumeName != "" {
		c.byClaim[key], c.byPV[pvc.Spec.VolumeName] = pvc.Spec.VolumeName, key
	}
}

func (c *Claims) removeLocked(key Ref) {
	if pv, ok := c.byClaim[key]; ok {
		delete(c.byClaim, key)
		if c.byPV[pv] == key {
			delete(c.byPV, pv)
		}
	}
}

// claimOf is the claim the volume is bound to.
func (c *Claims) claimOf(ctx context.Context, pv string) (Ref, bool, error) {
	select {
	case <-c.synced:
	case <-ctx.Done():
		return Ref{}, false, ctx.Err()
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	ref, ok := c.byPV[pv]
	return ref, ok, nil
}

// Relations answers the node authorizer from the pod graph and the
// claims' volumes together.
type Relations struct {
	*Graph
	Claims *Claims
	// Ingresses and Gateways say which Secrets every node may read to
	// serve HTTPS.
	Ingresses *IngressSecrets
	Gateways  *GatewaySecrets
}

// ServesSecret reports whether an Ingress or a Gateway the nodes serve
// names the Secret for TLS.
func (r Relations) ServesSecret(ctx context.Context, namespace, name string) (bool, error) {
	if r.Gateways != nil && r.Gateways.Serves(namespace, name) {
		return true, nil
	}
	return r.Ingresses.Serves(ctx, namespace, name)
}

// UsesVolume reports whether a pod bound to node uses the claim the
// volume is bound to.
func (r Relations) UsesVolume(ctx context.Context, node, pv string) (bool, error) {
	claim, ok, err := r.Claims.claimOf(ctx, pv)
	if err != nil || !ok {
		return false, err
	}
	return r.Uses(ctx, node, claim.Resource, claim.Namespace, claim.Name)
}
