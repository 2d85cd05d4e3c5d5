package scheduler

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/orch-dev/orch/internal/localpath"
	"github.com/orch-dev/orch/internal/loops/volume"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/utils/ptr"
)

// kube-scheduler's VolumeBinding words.
const (
	reasonVolumeNodeConflict = "node(s) had volume node affinity conflict"
	reasonNoVolumeToBind     = "node(s) didn't find available persistent volumes to bind"
	unboundImmediate         = "pod has unbound immediate PersistentVolumeClaims"
)

// volumeListers read what the VolumeBinding step needs.
type volumeListers struct {
	pvcs    corelisters.PersistentVolumeClaimLister
	pvs     corelisters.PersistentVolumeLister
	classes storagelisters.StorageClassLister
}

// podVolumes is what a pod's claims ask of its node: the volumes already
// bound must be reachable from it, and the claims that wait for their
// first consumer must find a volume there (or be provisioned there).
type podVolumes struct {
	bound []*corev1.PersistentVolume
	// delayed are WaitForFirstConsumer claims not bound yet; static ones
	// need a volume the node reaches, local-path ones are made anywhere.
	delayed []delayedClaim
}

type delayedClaim struct {
	claim       *corev1.PersistentVolumeClaim
	provisioned bool
	candidates  []*corev1.PersistentVolume
}

// volumesOf reads the pod's claims; an error is why the pod fits nowhere
// now (a missing or unbound immediate claim), in kube-scheduler's words.
func (l volumeListers) volumesOf(pod *corev1.Pod) (*podVolumes, string, error) {
	var pv podVolumes
	for _, v := range pod.Spec.Volumes {
		src := v.PersistentVolumeClaim
		if src == nil {
			continue
		}
		pvc, err := l.pvcs.PersistentVolumeClaims(pod.Namespace).Get(src.ClaimName)
		if apierrors.IsNotFound(err) {
			return nil, fmt.Sprintf("persistentvolumeclaim %q not found", src.ClaimName), nil
		} else if err != nil {
			return nil, "", err
		}
		if pvc.DeletionTimestamp != nil {
			return nil, fmt.Sprintf("persistentvolumeclaim %q is being deleted", src.ClaimName), nil
		}
		if pvc.Spec.VolumeName != "" {
			vol, err := l.pvs.Get(pvc.Spec.VolumeName)
			if apierrors.IsNotFound(err) {
				return nil, "pvc(s) bound to non-existent pv(s)", nil
			} else if err != nil {
				return nil, "", err
			}
			pv.bound = append(pv.bound, vol)
			continue
		}
		class := ptr.Deref(pvc.Spec.StorageClassName, "")
		sc, err := l.classes.Get(class)
		if class == "" || apierrors.IsNotFound(err) || ptr.Deref(sc.VolumeBindingMode, "") != storagev1.VolumeBindingWaitForFirstConsumer {
			return nil, unboundImmediate, nil
		} else if err != nil {
			return nil, "", err
		}
		d := delayedClaim{claim: pvc, provisioned: sc.Provisioner == localpath.Provisioner}
		if !d.provisioned {
			all, err := l.pvs.List(labels.Everything())
			if err != nil {
				return nil, "", err
			}
			for _, candidate := range all {
				if volume.Fits(pvc, candidate) {
					d.candidates = append(d.candidates, candidate)
				}
			}
		}
		pv.delayed = append(pv.delayed, d)
	}
	return &pv, "", nil
}

// volumeReason is why node cannot hold the pod's volumes, "" if it can.
func (v *podVolumes) volumeReason(node *corev1.Node) string {
	if v == nil {
		return ""
	}
	for _, pv := range v.bound {
		if !volume.Reaches(pv, node) {
			return reasonVolumeNodeConflict
		}
	}
	for _, d := range v.delayed {
		if d.provisioned {
			continue
		}
		found := false
		for _, candidate := range d.candidates {
			if volume.Reaches(candidate, node) {
				found = true
				break
			}
		}
		if !found {
			return reasonNoVolumeToBind
		}
	}
	return ""
}

// bindTimeout bounds how long a pod waits for its claims to be bound on
// its node before it is scheduled again (kube-scheduler waits 600 s; a
// local-path volume takes milliseconds).
const bindTimeout = 2 * time.Minute

// selectNode tells the volume loop where the pod went, on each claim that
// waited for it, and waits for them to be bound, before the pod is bound,
// as kube-scheduler's volume binder does in PreBind: the node never sees
// a pod whose claims are not bound yet.
func (s *Scheduler) selectNode(ctx context.Context, v *podVolumes, node string) error {
	if v == nil {
		return nil
	}
	for _, d := range v.delayed {
		if d.claim.Annotations[localpath.SelectedNodeAnnotation] == node {
			continue
		}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{localpath.SelectedNodeAnnotation: node}}})
		if _, err := s.client.PersistentVolumeClaims(d.claim.Namespace).Patch(ctx, d.claim.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("claim %s: %w", d.claim.Name, err)
		}
	}
	return wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, bindTimeout, true, func(context.Context) (bool, error) {
		for _, d := range v.delayed {
			pvc, err := s.volumes.pvcs.PersistentVolumeClaims(d.claim.Namespace).Get(d.claim.Name)
			if err != nil || pvc.UID != d.claim.UID {
				return false, fmt.Errorf("claim %s went away", d.claim.Name)
			}
			if pvc.Spec.VolumeName == "" || pvc.Status.Phase != corev1.ClaimBound {
				return false, nil
			}
		}
		return true, nil
	})
}
