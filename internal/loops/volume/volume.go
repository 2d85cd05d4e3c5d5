// Package volume is Kubernetes' PersistentVolume controller with orch's
// local-path provisioner and the storage protection controllers in one
// loop: it binds claims to the smallest volume that fits them (access
// modes, capacity, class, selector, mode; a WaitForFirstConsumer claim
// only once the scheduler has picked its pod's node, and only to a
// volume that node can reach), makes a hostPath volume on that node for a
// claim of the local-path class, releases a volume whose claim is gone
// and reclaims it (Retain keeps it, Delete has its node remove the data
// and then deletes it), and lifts the protection finalizers once no pod
// uses a claim being deleted and no claim a volume.
package volume

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/localpath"
	"github.com/orch-dev/orch/internal/loops/controller"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/utils/ptr"
)

// Kubernetes' annotations of a binding the controller made.
const (
	boundByController = "pv.kubernetes.io/bound-by-controller"
	bindCompleted     = "pv.kubernetes.io/bind-completed"
	pvcProtection     = "kubernetes.io/pvc-protection"
	pvProtection      = "kubernetes.io/pv-protection"
)

// RemoveDir asks a node's agent to remove a local-path volume's data.
type RemoveDir func(ctx context.Context, node, pv string) error

// Options configure the loop.
type Options struct {
	// StoragePath is where on each node local-path volumes go; empty
	// provisions none.
	StoragePath string
	// RemoveDir removes a deleted local-path volume's directory on its
	// node; nil keeps the data (the volume is then deleted all the same).
	RemoveDir RemoveDir
}

// Controller is the volume loop.
type Controller struct {
	client   *kube.Client
	pvs      corelisters.PersistentVolumeLister
	pvcs     corelisters.PersistentVolumeClaimLister
	classes  storagelisters.StorageClassLister
	pods     corelisters.PodLister
	nodes    corelisters.NodeLister
	synced   []toolscache.InformerSynced
	claims   *controller.Queue[string]
	volumes  *controller.Queue[string]
	recorder kube.EventRecorder
	log      *slog.Logger
	opts     Options
}

// New registers the loop on the factory's informers.
func New(client *kube.Client, factory *kube.Informers, recorder kube.EventRecorder, opts Options, env controller.Env) (*Controller, error) {
	pvs, pvcs, classes, pods, nodes := factory.PersistentVolumes(), factory.PersistentVolumeClaims(), factory.StorageClasses(), factory.Pods(), factory.Nodes()
	c := &Controller{
		client: client, pvs: pvs.Lister(), pvcs: pvcs.Lister(), classes: classes.Lister(), pods: pods.Lister(), nodes: nodes.Lister(),
		synced: []toolscache.InformerSynced{pvs.Informer().HasSynced, pvcs.Informer().HasSynced, classes.Informer().HasSynced,
			pods.Informer().HasSynced, nodes.Informer().HasSynced},
		claims: controller.NewQueue[string]("volume-claims", env), volumes: controller.NewQueue[string]("volumes", env),
		recorder: recorder, log: env.Log.With("loop", "volume"), opts: opts,
	}
	claimChanged := func(obj any) {
		if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if pvc, ok := obj.(*corev1.PersistentVolumeClaim); ok {
			c.claims.Add(pvc.Namespace + "/" + pvc.Name)
			if pvc.Spec.VolumeName != "" {
				c.volumes.Add(pvc.Spec.VolumeName)
			}
		}
	}
	volumeChanged := func(obj any) {
		if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if pv, ok := obj.(*corev1.PersistentVolume); ok {
			c.volumes.Add(pv.Name)
			if ref := pv.Spec.ClaimRef; ref != nil {
				c.claims.Add(ref.Namespace + "/" + ref.Name)
			}
		}
	}
	// A claim being deleted waits for the pods that use it to go.
	podChanged := func(obj any) {
		if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if pod, ok := obj.(*corev1.Pod); ok {
			for _, v := range pod.Spec.Volumes {
				if v.PersistentVolumeClaim != nil {
					c.claims.Add(pod.Namespace + "/" + v.PersistentVolumeClaim.ClaimName)
				}
			}
		}
	}
	for _, h := range []struct {
		inf toolscache.SharedIndexInformer
		fn  func(any)
	}{{pvcs.Informer(), claimChanged}, {pvs.Informer(), volumeChanged}, {pods.Informer(), podChanged}} {
		fn := h.fn
		if _, err := h.inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: fn, UpdateFunc: func(_, obj any) { fn(obj) }, DeleteFunc: fn}); err != nil {
			return nil, err
		}
	}
	// A new class or node may let a waiting claim go on.
	retryPending := func(any) {
		all, _ := c.pvcs.List(labels.Everything())
		for _, pvc := range all {
			if pvc.Status.Phase == corev1.ClaimPending {
				c.claims.Add(pvc.Namespace + "/" + pvc.Name)
			}
		}
	}
	if _, err := classes.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: retryPending}); err != nil {
		return nil, err
	}
	return c, nil
}

// Run binds, provisions and reclaims until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.volumes.Run(ctx, workers, c.synced, c.syncVolume)
	}()
	c.claims.Run(ctx, workers, c.synced, c.syncClaim)
	<-done
}

func (c *Controller) syncClaim(ctx context.Context, key string) error {
	ns, name, _ := strings.Cut(key, "/")
	shared, err := c.pvcs.PersistentVolumeClaims(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	pvc := shared.DeepCopy()
	if pvc.DeletionTimestamp != nil {
		return c.unprotectClaim(ctx, pvc)
	}
	if pvc.Spec.VolumeName != "" {
		return c.completeBinding(ctx, pvc)
	}
	class := ptr.Deref(pvc.Spec.StorageClassName, "")
	var sc *storagev1.StorageClass
	if class != "" {
		if sc, err = c.classes.Get(class); apierrors.IsNotFound(err) {
			c.recorder.Eventf(pvc, nil, corev1.EventTypeWarning, "ProvisioningFailed", "Provision", "storageclass.storage.k8s.io %q not found", class)
			return nil
		} else if err != nil {
			return err
		}
	}
	node := ""
	if sc != nil && ptr.Deref(sc.VolumeBindingMode, "") == storagev1.VolumeBindingWaitForFirstConsumer {
		if node = pvc.Annotations[localpath.SelectedNodeAnnotation]; node == "" {
			c.recorder.Eventf(pvc, nil, corev1.EventTypeNormal, "WaitForFirstConsumer", "Bind", "waiting for first consumer to be created before binding")
			return nil
		}
	}
	if pv, err := c.findVolume(pvc, node); err != nil {
		return err
	} else if pv != nil {
		return c.bind(ctx, pvc, pv)
	}
	switch {
	case sc == nil:
		c.recorder.Eventf(pvc, nil, corev1.EventTypeNormal, "FailedBinding", "Bind", "no persistent volumes available for this claim and no storage class is set")
		return nil
	case sc.Provisioner != localpath.Provisioner || c.opts.StoragePath == "":
		c.recorder.Eventf(pvc, nil, corev1.EventTypeNormal, "ExternalProvisioning", "Provision",
			"Waiting for a volume to be created either by the external provisioner %q or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered.", sc.Provisioner)
		return nil
	}
	return c.provision(ctx, pvc, sc, node)
}

// findVolume is the smallest available volume the claim fits, on node
// when the claim waited for its pod's.
func (c *Controller) findVolume(pvc *corev1.PersistentVolumeClaim, node string) (*corev1.PersistentVolume, error) {
	all, err := c.pvs.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	var best *corev1.PersistentVolume
	for _, pv := range all {
		if !Fits(pvc, pv) || node != "" && !c.reachableFrom(pv, node) {
			continue
		}
		if best == nil || pv.Spec.Capacity.Storage().Cmp(*best.Spec.Capacity.Storage()) < 0 {
			best = pv
		}
	}
	return best, nil
}

// Fits says whether an unbound claim may take the volume: available (or
// pre-bound to the claim), of the claim's class, at least its size, with
// its access modes and volume mode, and selected by its selector.
func Fits(pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) bool {
	if ref := pv.Spec.ClaimRef; ref != nil {
		// Pre-bound volumes go only to the claim they name.
		if ref.Namespace != pvc.Namespace || ref.Name != pvc.Name || ref.UID != "" && ref.UID != pvc.UID {
			return false
		}
	} else if pvc.Spec.Selector != nil {
		selector, err := metav1.LabelSelectorAsSelector(pvc.Spec.Selector)
		if err != nil || !selector.Matches(labels.Set(pv.Labels)) {
			return false
		}
	}
	want := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	return pv.DeletionTimestamp == nil && (pv.Status.Phase == corev1.VolumeAvailable || pv.Status.Phase == corev1.VolumePending) &&
		pv.Spec.StorageClassName == ptr.Deref(pvc.Spec.StorageClassName, "") && pv.Spec.Capacity.Storage().Cmp(want) >= 0 &&
		ptr.Deref(pv.Spec.VolumeMode, corev1.PersistentVolumeFilesystem) == ptr.Deref(pvc.Spec.VolumeMode, corev1.PersistentVolumeFilesystem) &&
		hasModes(pv.Spec.AccessModes, pvc.Spec.AccessModes)
}

func hasModes(have, want []corev1.PersistentVolumeAccessMode) bool {
	for _, m := range want {
		if !slices.Contains(have, m) {
			return false
		}
	}
	return true
}

// reachableFrom says whether a pod on node may use the volume.
func (c *Controller) reachableFrom(pv *corev1.PersistentVolume, node string) bool {
	n, err := c.nodes.Get(node)
	return err == nil && Reaches(pv, n)
}

// Reaches says whether a pod on node may use the volume: its node
// affinity, if any, selects the node.
func Reaches(pv *corev1.PersistentVolume, node *corev1.Node) bool {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return true
	}
	ok, err := nodeaffinity.NewLazyErrorNodeSelector(pv.Spec.NodeAffinity.Required).Match(node)
	return err == nil && ok
}

// bind writes the two halves of a binding, the volume's first, as
// Kubernetes does: a volume whose claimRef names the claim is taken.
func (c *Controller) bind(ctx context.Context, pvc *corev1.PersistentVolumeClaim, shared *corev1.PersistentVolume) error {
	pv := shared.DeepCopy()
	if ref := pv.Spec.ClaimRef; ref == nil || ref.UID != pvc.UID {
		pv.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: pvc.Namespace, Name: pvc.Name,
			UID: pvc.UID, ResourceVersion: pvc.ResourceVersion}
		setAnnotation(&pv.ObjectMeta, boundByController, "yes")
		var err error
		if pv, err = c.client.PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("bind volume %s: %w", shared.Name, err)
		}
	}
	if err := c.setVolumePhase(ctx, pv, corev1.VolumeBound, ""); err != nil {
		return err
	}
	pvc.Spec.VolumeName = pv.Name
	setAnnotation(&pvc.ObjectMeta, boundByController, "yes")
	setAnnotation(&pvc.ObjectMeta, bindCompleted, "yes")
	updated, err := c.client.PersistentVolumeClaims(pvc.Namespace).Update(ctx, pvc, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("bind claim: %w", err)
	}
	return c.claimBound(ctx, updated, pv)
}

// completeBinding finishes a claim that names its volume: one bound by a
// user (spec.volumeName) gets the volume's half, and the status follows.
func (c *Controller) completeBinding(ctx context.Context, pvc *corev1.PersistentVolumeClaim) error {
	pv, err := c.pvs.Get(pvc.Spec.VolumeName)
	if apierrors.IsNotFound(err) {
		if pvc.Status.Phase == corev1.ClaimBound {
			c.recorder.Eventf(pvc, nil, corev1.EventTypeWarning, "ClaimLost", "Bind", "Bound claim has lost reference to PersistentVolume. Data on the volume is lost!")
			return c.setClaimPhase(ctx, pvc, corev1.ClaimLost)
		}
		c.recorder.Eventf(pvc, nil, corev1.EventTypeNormal, "FailedBinding", "Bind", "volume %q not found", pvc.Spec.VolumeName)
		return nil
	}
	if err != nil {
		return err
	}
	switch ref := pv.Spec.ClaimRef; {
	case ref == nil || ref.Namespace == pvc.Namespace && ref.Name == pvc.Name && ref.UID == "":
		return c.bind(ctx, pvc, pv)
	case ref.UID != pvc.UID:
		c.recorder.Eventf(pvc, nil, corev1.EventTypeWarning, "FailedBinding", "Bind", "volume %q already bound to a different claim.", pv.Name)
		return nil
	}
	return c.claimBound(ctx, pvc, pv)
}

func (c *Controller) claimBound(ctx context.Context, pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) error {
	capacity := pv.Spec.Capacity[corev1.ResourceStorage]
	if pvc.Status.Phase == corev1.ClaimBound && slices.Equal(pvc.Status.AccessModes, pv.Spec.AccessModes) {
		if have, ok := pvc.Status.Capacity[corev1.ResourceStorage]; ok && have.Cmp(capacity) == 0 {
			return nil
		}
	}
	pvc.Status.Phase, pvc.Status.AccessModes = corev1.ClaimBound, pv.Spec.AccessModes
	pvc.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: capacity}
	if _, err := c.client.PersistentVolumeClaims(pvc.Namespace).UpdateStatus(ctx, pvc, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("claim status: %w", err)
	}
	return nil
}

// provision makes a local-path volume for the claim on node (for an
// Immediate claim, on a Ready node the loop picks), pre-bound to it.
func (c *Controller) provision(ctx context.Context, pvc *corev1.PersistentVolumeClaim, sc *storagev1.StorageClass, node string) error {
	if node == "" {
		var err error
		if node, err = c.anyReadyNode(); err != nil {
			return err
		}
		if node == "" {
			c.recorder.Eventf(pvc, nil, corev1.EventTypeWarning, "ProvisioningFailed", "Provision", "no Ready node to make the volume on")
			return nil
		}
	}
	name := "pvc-" + string(pvc.UID)
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{localpath.ProvisionedByAnnotation: localpath.Provisioner}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:    corev1.ResourceList{corev1.ResourceStorage: pvc.Spec.Resources.Requests[corev1.ResourceStorage]},
			AccessModes: pvc.Spec.AccessModes, StorageClassName: sc.Name, VolumeMode: pvc.Spec.VolumeMode, MountOptions: sc.MountOptions,
			PersistentVolumeReclaimPolicy: ptr.Deref(sc.ReclaimPolicy, corev1.PersistentVolumeReclaimDelete),
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{
				Path: localpath.Dir(c.opts.StoragePath, name, pvc), Type: ptr.To(corev1.HostPathDirectoryOrCreate)}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{hostnameOf(c.nodes, node)}}}}}}},
			ClaimRef: &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: pvc.Namespace, Name: pvc.Name, UID: pvc.UID, ResourceVersion: pvc.ResourceVersion},
		},
	}
	c.recorder.Eventf(pvc, nil, corev1.EventTypeNormal, "Provisioning", "Provision", "External provisioner is provisioning volume for claim %q", pvc.Namespace+"/"+pvc.Name)
	made, err := c.client.PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil // made before; its own event binds it
	}
	if err != nil {
		c.recorder.Eventf(pvc, nil, corev1.EventTypeWarning, "ProvisioningFailed", "Provision", "failed to provision volume with StorageClass %q: %v", sc.Name, err)
		return err
	}
	c.recorder.Eventf(pvc, nil, corev1.EventTypeNormal, "ProvisioningSucceeded", "Provision", "Successfully provisioned volume %s", made.Name)
	return c.bind(ctx, pvc, made)
}

func (c *Controller) anyReadyNode() (string, error) {
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		return "", err
	}
	slices.SortFunc(nodes, func(a, b *corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	for _, n := range nodes {
		if controller.NodeReady(n) && !n.Spec.Unschedulable {
			return n.Name, nil
		}
	}
	return "", nil
}

// hostnameOf is the node's kubernetes.io/hostname label, which the volume's
// node affinity names (its name when it has none).
func hostnameOf(nodes corelisters.NodeLister, name string) string {
	if n, err := nodes.Get(name); err == nil && n.Labels[corev1.LabelHostname] != "" {
		return n.Labels[corev1.LabelHostname]
	}
	return name
}

// unprotectClaim lifts pvc-protection from a claim being deleted once no
// pod that may still run uses it.
func (c *Controller) unprotectClaim(ctx context.Context, pvc *corev1.PersistentVolumeClaim) error {
	if !slices.Contains(pvc.Finalizers, pvcProtection) {
		return nil
	}
	pods, err := c.pods.Pods(pvc.Namespace).List(labels.Everything())
	if err != nil {
		return err
	}
	for _, p := range pods {
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, v := range p.Spec.Volumes {
			if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == pvc.Name {
				return nil // the pod's deletion brings the claim back here
			}
		}
	}
	pvc.Finalizers = slices.DeleteFunc(pvc.Finalizers, func(f string) bool { return f == pvcProtection })
	if _, err := c.client.PersistentVolumeClaims(pvc.Namespace).Update(ctx, pvc, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("lift pvc-protection: %w", err)
	}
	return nil
}

func (c *Controller) syncVolume(ctx context.Context, name string) error {
	shared, err := c.pvs.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	pv := shared.DeepCopy()
	ref := pv.Spec.ClaimRef
	if pv.DeletionTimestamp != nil {
		if pv.Status.Phase == corev1.VolumeBound && ref != nil && c.claimExists(ctx, ref) {
			return nil
		}
		return c.unprotectVolume(ctx, pv)
	}
	if ref == nil {
		return c.setVolumePhase(ctx, pv, corev1.VolumeAvailable, "")
	}
	if ref.UID == "" { // pre-bound by a user: the claim's sync binds it
		c.claims.Add(ref.Namespace + "/" + ref.Name)
		return c.setVolumePhase(ctx, pv, corev1.VolumeAvailable, "")
	}
	if c.claimExists(ctx, ref) {
		if pv.Status.Phase != corev1.VolumeBound {
			c.claims.Add(ref.Namespace + "/" + ref.Name)
		}
		return nil
	}
	// The claim is gone: released, then reclaimed by policy.
	if err := c.setVolumePhase(ctx, pv, corev1.VolumeReleased, ""); err != nil {
		return err
	}
	switch pv.Spec.PersistentVolumeReclaimPolicy {
	case corev1.PersistentVolumeReclaimRetain:
		return nil
	case corev1.PersistentVolumeReclaimDelete:
		if !localpath.Provisioned(pv) {
			if pv.Annotations[localpath.ProvisionedByAnnotation] != "" {
				return nil // another provisioner's to delete
			}
			c.recorder.Eventf(pv, nil, corev1.EventTypeWarning, "VolumeFailedDelete", "Delete", "error getting deleter volume plugin for volume %q: no deletable volume plugin matched", pv.Name)
			return c.setVolumePhase(ctx, pv, corev1.VolumeFailed, "no deletable volume plugin matched")
		}
		return c.deleteLocal(ctx, pv)
	default:
		c.recorder.Eventf(pv, nil, corev1.EventTypeWarning, "VolumeFailedRecycle", "Recycle", "recycling is not supported: delete the volume's data and the volume")
		return c.setVolumePhase(ctx, pv, corev1.VolumeFailed, "recycling is not supported")
	}
}

// deleteLocal has the volume's node remove its directory, then deletes
// the volume; a node that cannot be reached is asked again later.
func (c *Controller) deleteLocal(ctx context.Context, pv *corev1.PersistentVolume) error {
	if c.opts.RemoveDir != nil {
		node := nodeOf(pv, c.nodes)
		if err := c.opts.RemoveDir(ctx, node, pv.Name); err != nil {
			c.recorder.Eventf(pv, nil, corev1.EventTypeWarning, "VolumeFailedDelete", "Delete", "node %s did not remove the volume's data: %v", node, err)
			return fmt.Errorf("remove %s on %s: %w", pv.Name, node, err)
		}
	}
	err := c.client.PersistentVolumes().Delete(ctx, pv.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pv.UID}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete volume: %w", err)
	}
	return nil
}

// nodeOf is the node a local-path volume's affinity names.
func nodeOf(pv *corev1.PersistentVolume, nodes corelisters.NodeLister) string {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return ""
	}
	for _, term := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		for _, req := range term.MatchExpressions {
			if req.Key == corev1.LabelHostname && req.Operator == corev1.NodeSelectorOpIn && len(req.Values) == 1 {
				all, _ := nodes.List(labels.Everything())
				for _, n := range all {
					if n.Labels[corev1.LabelHostname] == req.Values[0] {
						return n.Name
					}
				}
				return req.Values[0]
			}
		}
	}
	return ""
}

// claimExists says whether the claim ref names is there, with its UID; a
// claim the cache does not have is asked of the API, as Kubernetes does,
// so that a slow watch never releases a bound volume.
func (c *Controller) claimExists(ctx context.Context, ref *corev1.ObjectReference) bool {
	pvc, err := c.pvcs.PersistentVolumeClaims(ref.Namespace).Get(ref.Name)
	if apierrors.IsNotFound(err) {
		pvc, err = c.client.PersistentVolumeClaims(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	}
	return err == nil && pvc.UID == ref.UID || err != nil && !apierrors.IsNotFound(err)
}

func (c *Controller) unprotectVolume(ctx context.Context, pv *corev1.PersistentVolume) error {
	if !slices.Contains(pv.Finalizers, pvProtection) {
		return nil
	}
	pv.Finalizers = slices.DeleteFunc(pv.Finalizers, func(f string) bool { return f == pvProtection })
	if _, err := c.client.PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("lift pv-protection: %w", err)
	}
	return nil
}

// setVolumePhase writes the volume's phase; pv (the caller's own copy)
// becomes what was stored.
func (c *Controller) setVolumePhase(ctx context.Context, pv *corev1.PersistentVolume, phase corev1.PersistentVolumePhase, message string) error {
	if pv.Status.Phase == phase && pv.Status.Message == message {
		return nil
	}
	now := metav1.Now()
	pv.Status.Phase, pv.Status.Message, pv.Status.LastPhaseTransitionTime = phase, message, &now
	updated, err := c.client.PersistentVolumes().UpdateStatus(ctx, pv, metav1.UpdateOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("volume status: %w", err)
	}
	if err == nil {
		*pv = *updated
	}
	return nil
}

func (c *Controller) setClaimPhase(ctx context.Context, pvc *corev1.PersistentVolumeClaim, phase corev1.PersistentVolumeClaimPhase) error {
	pvc.Status.Phase = phase
	if _, err := c.client.PersistentVolumeClaims(pvc.Namespace).UpdateStatus(ctx, pvc, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("claim status: %w", err)
	}
	return nil
}

func setAnnotation(m *metav1.ObjectMeta, k, v string) {
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	m.Annotations[k] = v
}
