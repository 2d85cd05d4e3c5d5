// Package statefulset runs StatefulSets as Kubernetes' controller does:
// pods <set>-0..N-1 (from spec.ordinals.start) with stable names,
// hostnames and subdomains (the governing Service), each with its own
// claims from the volumeClaimTemplates, which outlive the pods;
// OrderedReady creates them one at a time in order, each once the one
// before is Running and Ready, and removes them highest first, while
// Parallel does all at once; RollingUpdate replaces pods highest ordinal
// first down to the partition, within maxUnavailable, OnDelete only
// those deleted; templates are kept as ControllerRevisions (`kubectl
// rollout history` and `undo`); the claim retention policy deletes
// claims with the set or on scale-down when asked.
package statefulset

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/loops/controller"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

// Labels Kubernetes puts on a StatefulSet's pods.
const (
	podNameLabel  = appsv1.StatefulSetPodNameLabel
	podIndexLabel = appsv1.PodIndexLabel
)

// Controller is the StatefulSet loop.
type Controller struct {
	client    *kube.Client
	sets      appslisters.StatefulSetLister
	pods      corelisters.PodLister
	claims    corelisters.PersistentVolumeClaimLister
	revisions appslisters.ControllerRevisionLister
	synced    []toolscache.InformerSynced
	queue     *controller.Queue[string]
	recorder  kube.EventRecorder
	log       *slog.Logger
	clock     clock.PassiveClock
}

// New registers the loop on the factory's informers.
func New(client *kube.Client, factory *kube.Informers, recorder kube.EventRecorder, env controller.Env) (*Controller, error) {
	sets, pods, claims, revisions := factory.StatefulSets(), factory.Pods(), factory.PersistentVolumeClaims(), factory.ControllerRevisions()
	c := &Controller{
		client: client, sets: sets.Lister(), pods: pods.Lister(), claims: claims.Lister(), revisions: revisions.Lister(),
		synced: []toolscache.InformerSynced{sets.Informer().HasSynced, pods.Informer().HasSynced, claims.Informer().HasSynced, revisions.Informer().HasSynced},
		queue:  controller.NewQueue[string]("statefulset", env), recorder: recorder, log: env.Log.With("loop", "statefulset"), clock: env.Clock,
	}
	if err := c.queue.EnqueueObjects(sets.Informer(), controller.NamespacedKey); err != nil {
		return nil, err
	}
	if err := c.queue.EnqueueControllers(pods.Informer(), "StatefulSet", controller.NamespacedKey); err != nil {
		return nil, err
	}
	return c, nil
}

// Run syncs StatefulSets until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	c.queue.Run(ctx, workers, c.synced, c.sync)
}

var ordinalName = regexp.MustCompile(`^(.*)-([0-9]+)$`)

// ordinalOf is the pod's ordinal in set, -1 when its name is not one of
// the set's.
func ordinalOf(set *appsv1.StatefulSet, pod *corev1.Pod) int {
	m := ordinalName.FindStringSubmatch(pod.Name)
	if m == nil || m[1] != set.Name {
		return -1
	}
	n, err := strconv.Atoi(m[2])
	if err != nil {
		return -1
	}
	return n
}

func podName(set *appsv1.StatefulSet, ordinal int) string {
	return fmt.Sprintf("%s-%d", set.Name, ordinal)
}

func claimName(set *appsv1.StatefulSet, tmpl *corev1.PersistentVolumeClaim, ordinal int) string {
	return tmpl.Name + "-" + podName(set, ordinal)
}

func running(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil
}

func ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// available: ready for at least minReadySeconds.
func available(p *corev1.Pod, minReady int32, now time.Time) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return minReady == 0 || !c.LastTransitionTime.IsZero() && !c.LastTransitionTime.Add(time.Duration(minReady)*time.Second).After(now)
		}
	}
	return false
}

func finished(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

func (c *Controller) sync(ctx context.Context, key string) error {
	ns, name, _ := strings.Cut(key, "/")
	shared, err := c.sets.StatefulSets(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	set := shared.DeepCopy()
	if set.DeletionTimestamp != nil {
		return nil
	}
	selector, err := metav1.LabelSelectorAsSelector(set.Spec.Selector)
	if err != nil {
		return nil // refused by validation
	}
	all, err := c.pods.Pods(ns).List(labels.Everything())
	if err != nil {
		return err
	}
	var pods []*corev1.Pod
	for _, p := range all {
		if metav1.IsControlledBy(p, set) && selector.Matches(labels.Set(p.Labels)) {
			pods = append(pods, p)
		}
	}
	revs, err := c.revisions.ControllerRevisions(ns).List(labels.Everything())
	if err != nil {
		return err
	}
	var owned []*appsv1.ControllerRevision
	for _, r := range revs {
		if metav1.IsControlledBy(r, set) {
			owned = append(owned, r)
		}
	}
	current, update, history, err := c.currentAndUpdate(ctx, set, owned)
	if err != nil {
		return err
	}
	status, err := c.update(ctx, set, pods, current, update)
	if err != nil {
		return err
	}
	inUse := map[string]bool{}
	for _, p := range pods {
		inUse[p.Labels[appsv1.ControllerRevisionHashLabelKey]] = true
	}
	if err := c.writeStatus(ctx, set, status); err != nil {
		return err
	}
	set.Status = status
	return c.truncateHistory(ctx, set, history, inUse)
}

// update is one pass of Kubernetes' StatefulSet update: replace failed
// pods, create missing ones, delete condemned ones, roll the template;
// it returns the status that results.
func (c *Controller) update(ctx context.Context, set *appsv1.StatefulSet, pods []*corev1.Pod, current, update *appsv1.ControllerRevision) (appsv1.StatefulSetStatus, error) {
	now := c.clock.Now()
	start := 0
	if set.Spec.Ordinals != nil {
		start = int(set.Spec.Ordinals.Start)
	}
	replicas := int(ptr.Deref(set.Spec.Replicas, 1))
	end := start + replicas
	monotonic := set.Spec.PodManagementPolicy != appsv1.ParallelPodManagement
	status := appsv1.StatefulSetStatus{ObservedGeneration: set.Generation, CollisionCount: set.Status.CollisionCount,
		CurrentRevision: current.Name, UpdateRevision: update.Name}
	slot := make([]*corev1.Pod, replicas)
	var condemned []*corev1.Pod
	for _, p := range pods {
		switch o := ordinalOf(set, p); {
		case o >= start && o < end:
			slot[o-start] = p
		case o >= 0:
			condemned = append(condemned, p)
		}
	}
	for _, p := range pods {
		if ordinalOf(set, p) < 0 || finished(p) {
			continue
		}
		status.Replicas++
		if running(p) && ready(p) {
			status.ReadyReplicas++
			if available(p, set.Spec.MinReadySeconds, now) {
				status.AvailableReplicas++
			}
		}
		rev := p.Labels[appsv1.ControllerRevisionHashLabelKey]
		if rev == update.Name {
			status.UpdatedReplicas++
		}
		if rev == current.Name {
			status.CurrentReplicas++
		}
	}
	partition := 0
	if ru := set.Spec.UpdateStrategy.RollingUpdate; set.Spec.UpdateStrategy.Type == appsv1.RollingUpdateStatefulSetStrategyType && ru != nil {
		partition = int(ptr.Deref(ru.Partition, 0))
	}
	// Failed pods go, to be made again; then each missing pod is made, in
	// order, waiting (OrderedReady) for each to be Running and Ready.
	for i, p := range slot {
		ordinal := start + i
		if p != nil && finished(p) && p.DeletionTimestamp == nil {
			if err := c.deletePod(ctx, set, p); err != nil {
				return status, err
			}
			slot[i] = nil
			if monotonic {
				return status, nil
			}
			continue
		}
		if p == nil {
			rev := update
			if set.Spec.UpdateStrategy.Type == appsv1.RollingUpdateStatefulSetStrategyType && ordinal < start+partition {
				rev = current
			}
			if err := c.createPod(ctx, set, ordinal, rev); err != nil {
				return status, err
			}
			if monotonic {
				return status, nil
			}
			continue
		}
		if err := c.ensureClaims(ctx, set, ordinal); err != nil {
			return status, err
		}
		if monotonic && (p.DeletionTimestamp != nil || !running(p) || !ready(p) || !available(p, set.Spec.MinReadySeconds, now)) {
			if set.Spec.MinReadySeconds > 0 && running(p) && ready(p) {
				c.queue.AddAfter(set.Namespace+"/"+set.Name, time.Duration(set.Spec.MinReadySeconds)*time.Second)
			}
			return status, nil
		}
	}
	// Condemned pods go highest ordinal first; OrderedReady one at a time,
	// and not while a pod below is unhealthy: only the lowest unhealthy
	// pod itself may go (Kubernetes halts a scale-down so).
	slices.SortFunc(condemned, func(a, b *corev1.Pod) int { return ordinalOf(set, b) - ordinalOf(set, a) })
	var firstUnhealthy *corev1.Pod
	for _, p := range slices.Backward(condemned) {
		if !running(p) || !ready(p) {
			firstUnhealthy = p
			break
		}
	}
	for _, p := range condemned {
		if p.DeletionTimestamp != nil {
			if monotonic {
				return status, nil
			}
			continue
		}
		if monotonic && (!running(p) || !ready(p)) && p != firstUnhealthy {
			return status, nil
		}
		if err := c.deletePod(ctx, set, p); err != nil {
			return status, err
		}
		if monotonic {
			return status, nil
		}
	}
	if len(condemned) == 0 {
		if err := c.retireClaims(ctx, set, start, end); err != nil {
			return status, err
		}
	}
	if set.Spec.UpdateStrategy.Type != appsv1.RollingUpdateStatefulSetStrategyType {
		return complete(set, status), nil
	}
	// Rolling update: from the highest ordinal down to the partition, pods
	// of another revision are deleted (and made again at the update
	// revision above), no more unavailable at once than maxUnavailable.
	maxUnavailable := 1
	if ru := set.Spec.UpdateStrategy.RollingUpdate; ru != nil && ru.MaxUnavailable != nil {
		if n, err := intstr.GetScaledValueFromIntOrPercent(ru.MaxUnavailable, replicas, false); err == nil {
			maxUnavailable = max(n, 1)
		}
	}
	unavailable := 0
	for _, p := range slot {
		if p == nil || p.DeletionTimestamp != nil || !available(p, set.Spec.MinReadySeconds, now) {
			unavailable++
		}
	}
	for i := len(slot) - 1; i >= partition && i >= 0; i-- {
		p := slot[i]
		if p == nil || p.Labels[appsv1.ControllerRevisionHashLabelKey] == update.Name || p.DeletionTimestamp != nil {
			continue
		}
		if unavailable >= maxUnavailable {
			break
		}
		if err := c.deletePod(ctx, set, p); err != nil {
			return status, err
		}
		// An unavailable pod of the old revision is counted already.
		if available(p, set.Spec.MinReadySeconds, now) {
			unavailable++
		}
	}
	return complete(set, status), nil
}

// complete marks a finished rollout: every pod at the update revision
// and ready makes it the current one.
func complete(set *appsv1.StatefulSet, status appsv1.StatefulSetStatus) appsv1.StatefulSetStatus {
	replicas := ptr.Deref(set.Spec.Replicas, 1)
	if status.UpdatedReplicas == replicas && status.ReadyReplicas == replicas && status.Replicas == replicas {
		status.CurrentRevision, status.CurrentReplicas = status.UpdateRevision, status.UpdatedReplicas
	}
	return status
}

// templateOf is the pod template a revision holds.
func templateOf(rev *appsv1.ControllerRevision) (*corev1.PodTemplateSpec, error) {
	var patch struct {
		Spec struct {
			Template map[string]any `json:"template"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(rev.Data.Raw, &patch); err != nil {
		return nil, fmt.Errorf("revision %s: %w", rev.Name, err)
	}
	delete(patch.Spec.Template, "$patch")
	raw, err := json.Marshal(patch.Spec.Template)
	if err != nil {
		return nil, err
	}
	var t corev1.PodTemplateSpec
	if err := json.Unmarshal(raw, &t); err != nil {
		return nil, fmt.Errorf("revision %s: %w", rev.Name, err)
	}
	return &t, nil
}

// createPod makes the pod of an ordinal at a revision, its claims first.
func (c *Controller) createPod(ctx context.Context, set *appsv1.StatefulSet, ordinal int, rev *appsv1.ControllerRevision) error {
	if err := c.ensureClaims(ctx, set, ordinal); err != nil {
		return err
	}
	tmpl, err := templateOf(rev)
	if err != nil {
		return err
	}
	name := podName(set, ordinal)
	lbls := map[string]string{}
	for k, v := range tmpl.Labels {
		lbls[k] = v
	}
	lbls[podNameLabel], lbls[podIndexLabel], lbls[appsv1.ControllerRevisionHashLabelKey] = name, strconv.Itoa(ordinal), rev.Name
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: set.Namespace, Labels: lbls, Annotations: tmpl.Annotations,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(set, appsv1.SchemeGroupVersion.WithKind("StatefulSet"))}},
		Spec: tmpl.Spec,
	}
	pod.Spec.Hostname, pod.Spec.Subdomain = name, set.Spec.ServiceName
	for i := range set.Spec.VolumeClaimTemplates {
		t := &set.Spec.VolumeClaimTemplates[i]
		v := corev1.Volume{Name: t.Name, VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claimName(set, t, ordinal)}}}
		if j := slices.IndexFunc(pod.Spec.Volumes, func(have corev1.Volume) bool { return have.Name == t.Name }); j >= 0 {
			pod.Spec.Volumes[j] = v
		} else {
			pod.Spec.Volumes = append(pod.Spec.Volumes, v)
		}
	}
	_, err = c.client.Pods(set.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	if err != nil {
		if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
			return nil
		}
		c.recorder.Eventf(set, nil, corev1.EventTypeWarning, "FailedCreate", "Create", "create Pod %s in StatefulSet %s failed error: %v", name, set.Name, err)
		return err
	}
	c.recorder.Eventf(set, nil, corev1.EventTypeNormal, "SuccessfulCreate", "Create", "create Pod %s in StatefulSet %s successful", name, set.Name)
	return nil
}

// ensureClaims makes the ordinal's claims that do not exist; a set whose
// claims go with it (whenDeleted: Delete) owns them.
func (c *Controller) ensureClaims(ctx context.Context, set *appsv1.StatefulSet, ordinal int) error {
	for i := range set.Spec.VolumeClaimTemplates {
		t := &set.Spec.VolumeClaimTemplates[i]
		name := claimName(set, t, ordinal)
		if _, err := c.claims.PersistentVolumeClaims(set.Namespace).Get(name); err == nil {
			continue
		} else if !apierrors.IsNotFound(err) {
			return err
		}
		lbls := map[string]string{}
		for k, v := range t.Labels {
			lbls[k] = v
		}
		for k, v := range set.Spec.Selector.MatchLabels {
			lbls[k] = v
		}
		claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: set.Namespace, Labels: lbls, Annotations: t.Annotations},
			Spec: *t.Spec.DeepCopy()}
		if p := set.Spec.PersistentVolumeClaimRetentionPolicy; p != nil && p.WhenDeleted == appsv1.DeletePersistentVolumeClaimRetentionPolicyType {
			claim.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: set.Name, UID: set.UID, BlockOwnerDeletion: ptr.To(true)}}
		}
		_, err := c.client.PersistentVolumeClaims(set.Namespace).Create(ctx, claim, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			continue
		}
		if err != nil {
			c.recorder.Eventf(set, nil, corev1.EventTypeWarning, "FailedCreate", "Create", "create Claim %s for Pod %s in StatefulSet %s failed error: %v", name, podName(set, ordinal), set.Name, err)
			return err
		}
		c.recorder.Eventf(set, nil, corev1.EventTypeNormal, "SuccessfulCreate", "Create", "create Claim %s Pod %s in StatefulSet %s success", name, podName(set, ordinal), set.Name)
	}
	return nil
}

// retireClaims deletes, when the set says so (whenScaled: Delete), the
// claims of ordinals above the set's range once their pods are gone.
func (c *Controller) retireClaims(ctx context.Context, set *appsv1.StatefulSet, start, end int) error {
	p := set.Spec.PersistentVolumeClaimRetentionPolicy
	if p == nil || p.WhenScaled != appsv1.DeletePersistentVolumeClaimRetentionPolicyType || len(set.Spec.VolumeClaimTemplates) == 0 {
		return nil
	}
	claims, err := c.claims.PersistentVolumeClaims(set.Namespace).List(labels.Everything())
	if err != nil {
		return err
	}
	for _, claim := range claims {
		for i := range set.Spec.VolumeClaimTemplates {
			prefix := set.Spec.VolumeClaimTemplates[i].Name + "-" + set.Name + "-"
			n, err := strconv.Atoi(strings.TrimPrefix(claim.Name, prefix))
			if !strings.HasPrefix(claim.Name, prefix) || err != nil || n >= start && n < end || claim.DeletionTimestamp != nil {
				continue
			}
			if err := c.client.PersistentVolumeClaims(set.Namespace).Delete(ctx, claim.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &claim.UID}}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return fmt.Errorf("delete claim %s: %w", claim.Name, err)
			}
			c.recorder.Eventf(set, nil, corev1.EventTypeNormal, "SuccessfulDelete", "Delete", "delete Claim %s in StatefulSet %s successful", claim.Name, set.Name)
		}
	}
	return nil
}

func (c *Controller) deletePod(ctx context.Context, set *appsv1.StatefulSet, p *corev1.Pod) error {
	err := c.client.Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	if err != nil {
		c.recorder.Eventf(set, nil, corev1.EventTypeWarning, "FailedDelete", "Delete", "delete Pod %s in StatefulSet %s failed error: %v", p.Name, set.Name, err)
		return err
	}
	c.recorder.Eventf(set, nil, corev1.EventTypeNormal, "SuccessfulDelete", "Delete", "delete Pod %s in StatefulSet %s successful", p.Name, set.Name)
	return nil
}

func (c *Controller) writeStatus(ctx context.Context, set *appsv1.StatefulSet, status appsv1.StatefulSetStatus) error {
	status.Conditions = set.Status.Conditions // not the loop's to change
	if equality.Semantic.DeepEqual(set.Status, status) {
		return nil
	}
	set = set.DeepCopy()
	set.Status = status
	if _, err := c.client.StatefulSets(set.Namespace).UpdateStatus(ctx, set, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("statefulset status: %w", err)
	}
	return nil
}
