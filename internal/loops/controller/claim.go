package controller

import (
	"context"
	"fmt"
	"sync"

	"github.com/orch-dev/orch/internal/kube"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// ClaimPods is Kubernetes' ControllerRefManager for pods: of the pods in
// owner's namespace, it adopts the orphans selector matches (unless owner
// or the pod is being deleted) and releases those owner controls that no
// longer match; it returns the pods owner controls afterwards. Patches
// carry the pod's uid, so a pod replaced under the same name is left alone.
func ClaimPods(ctx context.Context, client *kube.Client, owner metav1.Object, kind schema.GroupVersionKind, selector labels.Selector, pods []*corev1.Pod) (owned, released []*corev1.Pod, err error) {
	mayAdopt := MayAdopt(ctx, client, owner, kind)
	for _, p := range pods {
		ref := metav1.GetControllerOf(p)
		matches := selector.Matches(labels.Set(p.Labels))
		switch {
		case ref != nil && ref.UID == owner.GetUID() && matches:
			owned = append(owned, p)
		case ref != nil && ref.UID == owner.GetUID():
			patch := fmt.Sprintf(`{"metadata":{"ownerReferences":[{"$patch":"delete","uid":%q}],"uid":%q}}`, owner.GetUID(), p.UID)
			out, err := client.Pods(p.Namespace).Patch(ctx, p.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
			if err != nil {
				if apierrors.IsNotFound(err) || apierrors.IsInvalid(err) {
					continue
				}
				return nil, nil, fmt.Errorf("release pod %s: %w", p.Name, err)
			}
			released = append(released, out)
		case ref == nil && matches && p.DeletionTimestamp == nil && owner.GetDeletionTimestamp() == nil:
			if ok, err := mayAdopt(); err != nil {
				return nil, nil, err
			} else if !ok {
				continue
			}
			patch := fmt.Sprintf(`{"metadata":{"ownerReferences":[{"apiVersion":%q,"kind":%q,"name":%q,"uid":%q,"controller":true,"blockOwnerDeletion":true}],"uid":%q}}`,
				kind.GroupVersion().String(), kind.Kind, owner.GetName(), owner.GetUID(), p.UID)
			adopted, err := client.Pods(p.Namespace).Patch(ctx, p.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
			if err != nil {
				if apierrors.IsNotFound(err) || apierrors.IsInvalid(err) {
					continue // gone, or changed under us (uid precondition)
				}
				return nil, nil, fmt.Errorf("adopt pod %s: %w", p.Name, err)
			}
			owned = append(owned, adopted)
		}
	}
	return owned, released, nil
}

// MayAdopt reads owner from the API the first time it is called, and
// reports whether it may adopt: it exists, is the same object and is not
// being deleted. The owner a controller has is its informer's, which may
// not know yet that a deletion began: one that orphans its dependents
// (the collector takes their references off) would see them as orphans to
// adopt, tying them again to an owner about to go, and the collector
// would then delete them. Kubernetes' RecheckDeletionTimestamp.
func MayAdopt(ctx context.Context, client *kube.Client, owner metav1.Object, kind schema.GroupVersionKind) func() (bool, error) {
	return sync.OnceValues(func() (bool, error) {
		gvr, _ := meta.UnsafeGuessKindToResource(kind)
		fresh, err := client.Metadata().Resource(gvr).Namespace(owner.GetNamespace()).Get(ctx, owner.GetName(), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("read %s %s before adopting: %w", kind.Kind, owner.GetName(), err)
		}
		return fresh.UID == owner.GetUID() && fresh.DeletionTimestamp == nil, nil
	})
}
