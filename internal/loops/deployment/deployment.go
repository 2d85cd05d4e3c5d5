// Package deployment rolls Deployments out through ReplicaSets, as
// Kubernetes' Deployment controller does: one ReplicaSet per pod template
// (named by the template's hash, annotated with its revision), rolling
// updates bounded by maxSurge and maxUnavailable, Recreate, pause and
// resume, the revision history `kubectl rollout undo` reads, and the
// Progressing and Available conditions `kubectl rollout status` waits on.
package deployment

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sort"
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
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	appslisters "k8s.io/client-go/listers/apps/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

// Annotations and reasons Kubernetes uses, which kubectl reads.
const (
	RevisionAnnotation        = "deployment.kubernetes.io/revision"
	desiredReplicasAnnotation = "deployment.kubernetes.io/desired-replicas"
	maxReplicasAnnotation     = "deployment.kubernetes.io/max-replicas"

	reasonNewRSCreated      = "NewReplicaSetCreated"
	reasonFoundNewRS        = "FoundNewReplicaSet"
	reasonRSUpdated         = "ReplicaSetUpdated"
	reasonNewRSAvailable    = "NewReplicaSetAvailable"
	reasonTimedOut          = "ProgressDeadlineExceeded"
	reasonPaused            = "DeploymentPaused"
	reasonResumed           = "DeploymentResumed"
	reasonMinAvailable      = "MinimumReplicasAvailable"
	reasonMinUnavailable    = "MinimumReplicasUnavailable"
	reasonFailedRSCreate    = "ReplicaSetCreateError"
	reasonScalingReplicaSet = "ScalingReplicaSet"
)

// Controller is the Deployment loop.
type Controller struct {
	client      *kube.Client
	deployments appslisters.DeploymentLister
	sets        appslisters.ReplicaSetLister
	synced      []toolscache.InformerSynced
	queue       *controller.Queue[string]
	recorder    kube.EventRecorder
	log         *slog.Logger
	clock       clock.PassiveClock
}

// New registers the controller's handlers on the factory's informers.
func New(client *kube.Client, factory *kube.Informers, recorder kube.EventRecorder, env controller.Env) (*Controller, error) {
	d, rs := factory.Deployments(), factory.ReplicaSets()
	c := &Controller{
		client: client, deployments: d.Lister(), sets: rs.Lister(), recorder: recorder, log: env.Log.With("loop", "deployment"), clock: env.Clock,
		synced: []toolscache.InformerSynced{d.Informer().HasSynced, rs.Informer().HasSynced},
		queue:  controller.NewQueue[string]("deployment", env),
	}
	if err := c.queue.EnqueueObjects(d.Informer(), controller.NamespacedKey); err != nil {
		return nil, err
	}
	setChanged := func(obj any) {
		if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		set, ok := obj.(*appsv1.ReplicaSet)
		if !ok {
			return
		}
		if ref := metav1.GetControllerOf(set); ref != nil && ref.Kind == "Deployment" {
			c.queue.Add(set.Namespace + "/" + ref.Name)
			return
		}
		// An orphan: whichever deployment selects it may adopt it.
		list, _ := c.deployments.Deployments(set.Namespace).List(labels.Everything())
		for _, d := range list {
			if sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector); err == nil && !sel.Empty() && sel.Matches(labels.Set(set.Labels)) {
				c.queue.Add(controller.NamespacedKey(d.Namespace, d.Name))
			}
		}
	}
	if _, err := rs.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: setChanged, UpdateFunc: func(_, obj any) { setChanged(obj) }, DeleteFunc: setChanged,
	}); err != nil {
		return nil, err
	}
	return c, nil
}

// Run syncs Deployments with workers goroutines until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	c.queue.Run(ctx, workers, c.synced, c.sync)
}

func (c *Controller) sync(ctx context.Context, k string) error {
	ns, name, _ := strings.Cut(k, "/")
	shared, err := c.deployments.Deployments(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	d := shared.DeepCopy()
	selector, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil || selector.Empty() || d.DeletionTimestamp != nil {
		return nil
	}
	sets, err := c.claim(ctx, d, selector)
	if err != nil {
		return err
	}
	newRS, old := splitSets(d, sets)
	// A paused deployment rolls nothing out but follows a change of its
	// scale; so does one whose scale changed mid-rollout, its ReplicaSets
	// scaled in proportion, as Kubernetes' controller does.
	if d.Spec.Paused || scalingEvent(d, newRS, old) {
		if err := c.scale(ctx, d, newRS, old); err != nil {
			return err
		}
		return c.updateStatus(ctx, d, newRS, old, nil)
	}
	if newRS == nil {
		if newRS, err = c.createNewSet(ctx, d, old); err != nil {
			return c.updateStatus(ctx, d, nil, old, err)
		}
	} else if err := c.ensureRevision(ctx, d, newRS, old); err != nil {
		return err
	}
	switch d.Spec.Strategy.Type {
	case appsv1.RecreateDeploymentStrategyType:
		err = c.recreate(ctx, d, newRS, old)
	default:
		err = c.rollingUpdate(ctx, d, newRS, old)
	}
	if err != nil {
		return err
	}
	if err := c.cleanupHistory(ctx, d, old); err != nil {
		return err
	}
	return c.updateStatus(ctx, d, newRS, old, nil)
}

// claim adopts orphan ReplicaSets the selector matches, releases owned
// ones it no longer matches, and returns those the deployment owns.
func (c *Controller) claim(ctx context.Context, d *appsv1.Deployment, selector labels.Selector) ([]*appsv1.ReplicaSet, error) {
	all, err := c.sets.ReplicaSets(d.Namespace).List(labels.Everything())
	if err != nil {
		return nil, err
	}
	var owned []*appsv1.ReplicaSet
	mayAdopt := controller.MayAdopt(ctx, c.client, d, appsv1.SchemeGroupVersion.WithKind("Deployment"))
	for _, rs := range all {
		ref := metav1.GetControllerOf(rs)
		matches := selector.Matches(labels.Set(rs.Labels))
		switch {
		case ref != nil && ref.UID == d.UID && matches:
			// A copy: the sync changes what it holds, the cache is shared.
			owned = append(owned, rs.DeepCopy())
		case ref != nil && ref.UID == d.UID:
			patch := fmt.Sprintf(`{"metadata":{"ownerReferences":[{"$patch":"delete","uid":%q}],"uid":%q}}`, d.UID, rs.UID)
			if _, err := c.client.ReplicaSets(rs.Namespace).Patch(ctx, rs.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return nil, err
			}
		case ref == nil && matches && rs.DeletionTimestamp == nil:
			if ok, err := mayAdopt(); err != nil {
				return nil, err
			} else if !ok {
				continue
			}
			patch := fmt.Sprintf(`{"metadata":{"ownerReferences":[{"apiVersion":"apps/v1","kind":"Deployment","name":%q,"uid":%q,"controller":true,"blockOwnerDeletion":true}],"uid":%q}}`,
				d.Name, d.UID, rs.UID)
			adopted, err := c.client.ReplicaSets(rs.Namespace).Patch(ctx, rs.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
			if err != nil {
				if apierrors.IsNotFound(err) || apierrors.IsInvalid(err) {
					continue
				}
				return nil, err
			}
			owned = append(owned, adopted)
		}
	}
	return owned, nil
}

// splitSets finds the ReplicaSet running the deployment's current template
// (the oldest, should there be several) and the others.
func splitSets(d *appsv1.Deployment, sets []*appsv1.ReplicaSet) (newRS *appsv1.ReplicaSet, old []*appsv1.ReplicaSet) {
	sort.Slice(sets, func(i, j int) bool {
		if sets[i].CreationTimestamp.Equal(&sets[j].CreationTimestamp) {
			return sets[i].Name < sets[j].Name
		}
		return sets[i].CreationTimestamp.Before(&sets[j].CreationTimestamp)
	})
	for _, rs := range sets {
		if newRS == nil && equalIgnoreHash(&rs.Spec.Template, &d.Spec.Template) {
			newRS = rs
			continue
		}
		old = append(old, rs)
	}
	return newRS, old
}

// equalIgnoreHash compares templates apart from the pod-template-hash label.
func equalIgnoreHash(a, b *corev1.PodTemplateSpec) bool {
	a, b = a.DeepCopy(), b.DeepCopy()
	delete(a.Labels, appsv1.DefaultDeploymentUniqueLabelKey)
	delete(b.Labels, appsv1.DefaultDeploymentUniqueLabelKey)
	return equality.Semantic.DeepEqual(a, b)
}

func revisionOf(obj metav1.Object) int64 {
	v, _ := strconv.ParseInt(obj.GetAnnotations()[RevisionAnnotation], 10, 64)
	return v
}

func maxRevision(sets []*appsv1.ReplicaSet) int64 {
	var m int64
	for _, rs := range sets {
		m = max(m, revisionOf(rs))
	}
	return m
}

func (c *Controller) createNewSet(ctx context.Context, d *appsv1.Deployment, old []*appsv1.ReplicaSet) (*appsv1.ReplicaSet, error) {
	template := d.Spec.Template.DeepCopy()
	hash := controller.TemplateHash(template, d.Status.CollisionCount)
	if template.Labels == nil {
		template.Labels = map[string]string{}
	}
	template.Labels[appsv1.DefaultDeploymentUniqueLabelKey] = hash
	selector := d.Spec.Selector.DeepCopy()
	if selector.MatchLabels == nil {
		selector.MatchLabels = map[string]string{}
	}
	selector.MatchLabels[appsv1.DefaultDeploymentUniqueLabelKey] = hash
	replicas := int32(0)
	if d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType || sumReplicas(activeOf(old)) == 0 {
		replicas = newSetReplicas(d, old, 0)
	}
	revision := maxRevision(old) + 1
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{
			Name: d.Name + "-" + hash, Namespace: d.Namespace, Labels: template.Labels,
			Annotations:     setAnnotations(d, map[string]string{RevisionAnnotation: fmt.Sprint(revision)}),
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(d, appsv1.SchemeGroupVersion.WithKind("Deployment"))},
		},
		Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To(replicas), MinReadySeconds: d.Spec.MinReadySeconds, Selector: selector, Template: *template},
	}
	created, err := c.client.ReplicaSets(d.Namespace).Create(ctx, rs, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		// A ReplicaSet of another template has the name: move the hash.
		d.Status.CollisionCount = ptr.To(ptr.Deref(d.Status.CollisionCount, 0) + 1)
		if _, err := c.client.Deployments(d.Namespace).UpdateStatus(ctx, d, metav1.UpdateOptions{}); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("replicaset %s exists with another template; collision count raised", rs.Name)
	}
	if err != nil {
		c.recorder.Eventf(d, nil, corev1.EventTypeWarning, reasonFailedRSCreate, "Create", "Failed to create new replica set %q: %v", rs.Name, err)
		return nil, err
	}
	if replicas > 0 {
		c.recorder.Eventf(d, created, corev1.EventTypeNormal, reasonScalingReplicaSet, "Scale", "Scaled up replica set %s from 0 to %d", created.Name, replicas)
	}
	if err := c.setDeploymentRevision(ctx, d, revision); err != nil {
		return nil, err
	}
	return created, nil
}

// setAnnotations adds the annotations Kubernetes keeps on a deployment's
// ReplicaSets to extra.
func setAnnotations(d *appsv1.Deployment, extra map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range d.Annotations {
		if k != RevisionAnnotation && k != corev1.LastAppliedConfigAnnotation {
			out[k] = v
		}
	}
	out[desiredReplicasAnnotation] = fmt.Sprint(ptr.Deref(d.Spec.Replicas, 1))
	out[maxReplicasAnnotation] = fmt.Sprint(ptr.Deref(d.Spec.Replicas, 1) + maxSurge(d))
	for k, v := range extra {
		out[k] = v
	}
	return out
}

// ensureRevision gives a reused ReplicaSet (a rollback) the newest revision.
func (c *Controller) ensureRevision(ctx context.Context, d *appsv1.Deployment, newRS *appsv1.ReplicaSet, old []*appsv1.ReplicaSet) error {
	revision := revisionOf(newRS)
	if top := maxRevision(old); top >= revision {
		revision = top + 1
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, RevisionAnnotation, fmt.Sprint(revision))
		if _, err := c.client.ReplicaSets(newRS.Namespace).Patch(ctx, newRS.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			return err
		}
		newRS.Annotations[RevisionAnnotation] = fmt.Sprint(revision)
	}
	return c.setDeploymentRevision(ctx, d, revision)
}

func (c *Controller) setDeploymentRevision(ctx context.Context, d *appsv1.Deployment, revision int64) error {
	if revisionOf(d) == revision {
		return nil
	}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, RevisionAnnotation, fmt.Sprint(revision))
	updated, err := c.client.Deployments(d.Namespace).Patch(ctx, d.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
	if err != nil {
		return err
	}
	d.Annotations, d.ResourceVersion = updated.Annotations, updated.ResourceVersion
	return nil
}

func maxSurge(d *appsv1.Deployment) int32 {
	if d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType || d.Spec.Strategy.RollingUpdate == nil {
		return 0
	}
	surge, _ := resolve(d.Spec.Strategy.RollingUpdate.MaxSurge, d.Spec.Strategy.RollingUpdate.MaxUnavailable, ptr.Deref(d.Spec.Replicas, 1))
	return surge
}

// resolve turns maxSurge and maxUnavailable into counts as Kubernetes
// does: surge rounds up, unavailable down, and both zero means one may be
// unavailable.
func resolve(surge, unavailable *intstr.IntOrString, replicas int32) (int32, int32) {
	s, _ := intstr.GetScaledValueFromIntOrPercent(intstr.ValueOrDefault(surge, intstr.FromString("25%")), int(replicas), true)
	u, _ := intstr.GetScaledValueFromIntOrPercent(intstr.ValueOrDefault(unavailable, intstr.FromString("25%")), int(replicas), false)
	if s == 0 && u == 0 {
		u = 1
	}
	return int32(s), int32(u)
}

func activeOf(sets []*appsv1.ReplicaSet) []*appsv1.ReplicaSet {
	var out []*appsv1.ReplicaSet
	for _, rs := range sets {
		if ptr.Deref(rs.Spec.Replicas, 0) > 0 {
			out = append(out, rs)
		}
	}
	return out
}

func sumReplicas(sets []*appsv1.ReplicaSet) int32 {
	var n int32
	for _, rs := range sets {
		n += ptr.Deref(rs.Spec.Replicas, 0)
	}
	return n
}

func sumAvailable(sets []*appsv1.ReplicaSet) int32 {
	var n int32
	for _, rs := range sets {
		n += rs.Status.AvailableReplicas
	}
	return n
}

// newSetReplicas is how far the new ReplicaSet may grow now: to the full
// count when nothing old runs, else up to replicas+maxSurge in total.
func newSetReplicas(d *appsv1.Deployment, old []*appsv1.ReplicaSet, current int32) int32 {
	want := ptr.Deref(d.Spec.Replicas, 1)
	if d.Spec.Strategy.Type == appsv1.RecreateDeploymentStrategyType {
		return want
	}
	surge, _ := resolve(d.Spec.Strategy.RollingUpdate.MaxSurge, d.Spec.Strategy.RollingUpdate.MaxUnavailable, want)
	total := sumReplicas(old) + current
	room := want + surge - total
	if room <= 0 {
		return min(current, want)
	}
	return min(current+room, want)
}

func (c *Controller) scaleSet(ctx context.Context, d *appsv1.Deployment, rs *appsv1.ReplicaSet, to int32) error {
	to = max(to, 0)
	from := ptr.Deref(rs.Spec.Replicas, 0)
	annotations := setAnnotations(d, map[string]string{RevisionAnnotation: rs.Annotations[RevisionAnnotation]})
	if from == to && rs.Annotations[desiredReplicasAnnotation] == annotations[desiredReplicasAnnotation] {
		return nil
	}
	updated := rs.DeepCopy()
	updated.Spec.Replicas = ptr.To(to)
	for k, v := range annotations {
		if updated.Annotations == nil {
			updated.Annotations = map[string]string{}
		}
		updated.Annotations[k] = v
	}
	if _, err := c.client.ReplicaSets(rs.Namespace).Update(ctx, updated, metav1.UpdateOptions{}); err != nil {
		return err
	}
	if from != to {
		verb := "up"
		if to < from {
			verb = "down"
		}
		c.recorder.Eventf(d, rs, corev1.EventTypeNormal, reasonScalingReplicaSet, "Scale", "Scaled %s replica set %s from %d to %d", verb, rs.Name, from, to)
	}
	rs.Spec.Replicas = ptr.To(to)
	return nil
}

// scalingEvent reports whether the deployment's scale changed since its
// active ReplicaSets were last scaled (their desired-replicas annotation).
func scalingEvent(d *appsv1.Deployment, newRS *appsv1.ReplicaSet, old []*appsv1.ReplicaSet) bool {
	want := fmt.Sprint(ptr.Deref(d.Spec.Replicas, 1))
	all := old
	if newRS != nil {
		all = append(slices.Clip(old), newRS)
	}
	for _, rs := range activeOf(all) {
		if desired, ok := rs.Annotations[desiredReplicasAnnotation]; ok && desired != want {
			return true
		}
	}
	return false
}

// scale follows a change of the deployment's scale: the one active
// ReplicaSet (or the newest, when none is) takes the whole count; old
// ones go to zero once the new one is saturated; mid-rollout, every
// active ReplicaSet grows or shrinks in proportion to its share of the
// deployment's replicas+maxSurge before the change (the max-replicas
// annotation), the rounding's leftover to the largest.
func (c *Controller) scale(ctx context.Context, d *appsv1.Deployment, newRS *appsv1.ReplicaSet, old []*appsv1.ReplicaSet) error {
	want := ptr.Deref(d.Spec.Replicas, 1)
	all := old
	if newRS != nil {
		all = append(slices.Clip(old), newRS)
	}
	active := activeOf(all)
	switch {
	case len(all) == 0:
		return nil
	case len(active) <= 1:
		target := newRS
		switch {
		case len(active) == 1:
			target = active[0]
		case target == nil:
			target = slices.MaxFunc(old, func(a, b *appsv1.ReplicaSet) int { return a.CreationTimestamp.Compare(b.CreationTimestamp.Time) })
		}
		return c.scaleSet(ctx, d, target, want)
	case newRS != nil && ptr.Deref(newRS.Spec.Replicas, 0) == want && newRS.Annotations[desiredReplicasAnnotation] == fmt.Sprint(want) &&
		newRS.Status.AvailableReplicas == want:
		for _, rs := range activeOf(old) {
			if err := c.scaleSet(ctx, d, rs, 0); err != nil {
				return err
			}
		}
		return nil
	case d.Spec.Strategy.Type == appsv1.RecreateDeploymentStrategyType:
		return nil
	}
	allowed := int32(0)
	if want > 0 {
		allowed = want + maxSurge(d)
	}
	toAdd := allowed - sumReplicas(active)
	// The larger first; of equal sizes the newer first when growing, the
	// older when shrinking.
	slices.SortStableFunc(active, func(a, b *appsv1.ReplicaSet) int {
		if c := cmp.Compare(ptr.Deref(b.Spec.Replicas, 0), ptr.Deref(a.Spec.Replicas, 0)); c != 0 {
			return c
		}
		if toAdd > 0 {
			return b.CreationTimestamp.Compare(a.CreationTimestamp.Time)
		}
		return a.CreationTimestamp.Compare(b.CreationTimestamp.Time)
	})
	sizes := make([]int32, len(active))
	added := int32(0)
	for i, rs := range active {
		sizes[i] = ptr.Deref(rs.Spec.Replicas, 0)
		if toAdd != 0 {
			p := proportion(d, rs, toAdd, added)
			sizes[i] += p
			added += p
		}
	}
	if toAdd != 0 {
		sizes[0] = max(sizes[0]+toAdd-added, 0)
	}
	for i, rs := range active {
		if err := c.scaleSet(ctx, d, rs, sizes[i]); err != nil {
			return err
		}
	}
	return nil
}

// proportion is how many replicas of toAdd (less those already added) a
// ReplicaSet takes: its size scaled from the deployment's replicas +
// maxSurge before the change (the max-replicas annotation, else the
// deployment's replicas now) to after it, rounded.
func proportion(d *appsv1.Deployment, rs *appsv1.ReplicaSet, toAdd, added int32) int32 {
	size := ptr.Deref(rs.Spec.Replicas, 0)
	if size == 0 || toAdd == added {
		return 0
	}
	var fraction int32
	if want := ptr.Deref(d.Spec.Replicas, 1); want == 0 {
		fraction = -size
	} else {
		before, err := strconv.Atoi(rs.Annotations[maxReplicasAnnotation])
		if err != nil || before == 0 {
			before = int(d.Status.Replicas)
		}
		if before == 0 {
			return 0
		}
		fraction = int32(math.Round(float64(size)*float64(want+maxSurge(d))/float64(before))) - size
	}
	allowed := toAdd - added
	if toAdd > 0 {
		return min(fraction, allowed)
	}
	return max(fraction, allowed)
}

// rollingUpdate grows the new ReplicaSet within maxSurge and shrinks the
// old ones as far as maxUnavailable allows.
func (c *Controller) rollingUpdate(ctx context.Context, d *appsv1.Deployment, newRS *appsv1.ReplicaSet, old []*appsv1.ReplicaSet) error {
	want := ptr.Deref(d.Spec.Replicas, 1)
	if err := c.scaleSet(ctx, d, newRS, newSetReplicas(d, old, ptr.Deref(newRS.Spec.Replicas, 0))); err != nil {
		return err
	}
	oldActive := activeOf(old)
	if len(oldActive) == 0 {
		return nil
	}
	_, unavailable := resolve(d.Spec.Strategy.RollingUpdate.MaxSurge, d.Spec.Strategy.RollingUpdate.MaxUnavailable, want)
	minAvailable := want - unavailable
	newUnavailable := ptr.Deref(newRS.Spec.Replicas, 0) - newRS.Status.AvailableReplicas
	all := sumReplicas(oldActive) + ptr.Deref(newRS.Spec.Replicas, 0)
	budget := all - minAvailable - newUnavailable
	if budget <= 0 {
		return nil
	}
	// Unhealthy old pods go first: removing them costs no availability.
	sort.Slice(oldActive, func(i, j int) bool { return oldActive[i].CreationTimestamp.Before(&oldActive[j].CreationTimestamp) })
	for _, rs := range oldActive {
		if budget <= 0 {
			break
		}
		replicas := ptr.Deref(rs.Spec.Replicas, 0)
		unhealthy := replicas - rs.Status.AvailableReplicas
		if unhealthy <= 0 {
			continue
		}
		cut := min(unhealthy, budget)
		if err := c.scaleSet(ctx, d, rs, replicas-cut); err != nil {
			return err
		}
		budget -= cut
	}
	// Then healthy ones, oldest first, keeping minAvailable.
	available := sumAvailable(oldActive) + newRS.Status.AvailableReplicas
	budget = min(budget, available-minAvailable)
	for _, rs := range oldActive {
		if budget <= 0 {
			break
		}
		replicas := ptr.Deref(rs.Spec.Replicas, 0)
		if replicas == 0 {
			continue
		}
		cut := min(replicas, budget)
		if err := c.scaleSet(ctx, d, rs, replicas-cut); err != nil {
			return err
		}
		budget -= cut
	}
	return nil
}

// recreate removes every old pod before the new ReplicaSet grows.
func (c *Controller) recreate(ctx context.Context, d *appsv1.Deployment, newRS *appsv1.ReplicaSet, old []*appsv1.ReplicaSet) error {
	for _, rs := range activeOf(old) {
		if err := c.scaleSet(ctx, d, rs, 0); err != nil {
			return err
		}
	}
	for _, rs := range old {
		if rs.Status.Replicas > 0 {
			return nil // old pods still terminating: the ReplicaSet update brings us back
		}
	}
	return c.scaleSet(ctx, d, newRS, ptr.Deref(d.Spec.Replicas, 1))
}

// cleanupHistory deletes the oldest scaled-down ReplicaSets beyond
// revisionHistoryLimit.
func (c *Controller) cleanupHistory(ctx context.Context, d *appsv1.Deployment, old []*appsv1.ReplicaSet) error {
	limit := int(ptr.Deref(d.Spec.RevisionHistoryLimit, 10))
	var idle []*appsv1.ReplicaSet
	for _, rs := range old {
		if ptr.Deref(rs.Spec.Replicas, 0) == 0 && rs.Status.Replicas == 0 && rs.DeletionTimestamp == nil {
			idle = append(idle, rs)
		}
	}
	if len(idle) <= limit {
		return nil
	}
	sort.Slice(idle, func(i, j int) bool { return revisionOf(idle[i]) < revisionOf(idle[j]) })
	for _, rs := range idle[:len(idle)-limit] {
		if err := c.client.ReplicaSets(rs.Namespace).Delete(ctx, rs.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &rs.UID}}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// updateStatus reports the rollout as Kubernetes does.
func (c *Controller) updateStatus(ctx context.Context, d *appsv1.Deployment, newRS *appsv1.ReplicaSet, old []*appsv1.ReplicaSet, createErr error) error {
	all := append([]*appsv1.ReplicaSet{}, old...)
	if newRS != nil {
		all = append(all, newRS)
	}
	want := ptr.Deref(d.Spec.Replicas, 1)
	s := appsv1.DeploymentStatus{ObservedGeneration: d.Generation, CollisionCount: d.Status.CollisionCount, Conditions: d.Status.Conditions}
	for _, rs := range all {
		s.Replicas += rs.Status.Replicas
		s.ReadyReplicas += rs.Status.ReadyReplicas
		s.AvailableReplicas += rs.Status.AvailableReplicas
	}
	if newRS != nil {
		s.UpdatedReplicas = newRS.Status.Replicas
	}
	s.UnavailableReplicas = max(0, sumReplicas(all)-s.AvailableReplicas)
	if d.Spec.Strategy.Type == appsv1.RecreateDeploymentStrategyType {
		s.UnavailableReplicas = max(0, want-s.AvailableReplicas)
	}
	var unavailable int32
	if d.Spec.Strategy.RollingUpdate != nil {
		_, unavailable = resolve(d.Spec.Strategy.RollingUpdate.MaxSurge, d.Spec.Strategy.RollingUpdate.MaxUnavailable, want)
	}
	now := metav1.Now()
	if s.AvailableReplicas >= want-unavailable {
		s.Conditions = setCondition(s.Conditions, appsv1.DeploymentAvailable, corev1.ConditionTrue, reasonMinAvailable, "Deployment has minimum availability.", now)
	} else {
		s.Conditions = setCondition(s.Conditions, appsv1.DeploymentAvailable, corev1.ConditionFalse, reasonMinUnavailable, "Deployment does not have minimum availability.", now)
	}
	s.Conditions = c.progressing(d, s, newRS, createErr, now)
	if equality.Semantic.DeepEqual(d.Status, s) {
		return nil
	}
	updated := d.DeepCopy()
	updated.Status = s
	if _, err := c.client.Deployments(d.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}

// progressing computes the Progressing condition, and schedules a look
// at the progress deadline while a rollout runs.
func (c *Controller) progressing(d *appsv1.Deployment, s appsv1.DeploymentStatus, newRS *appsv1.ReplicaSet, createErr error, now metav1.Time) []appsv1.DeploymentCondition {
	conds := s.Conditions
	want := ptr.Deref(d.Spec.Replicas, 1)
	current := getCondition(conds, appsv1.DeploymentProgressing)
	switch {
	case createErr != nil:
		return setCondition(conds, appsv1.DeploymentProgressing, corev1.ConditionFalse, reasonFailedRSCreate, createErr.Error(), now)
	case d.Spec.Paused:
		return setCondition(conds, appsv1.DeploymentProgressing, corev1.ConditionUnknown, reasonPaused, "Deployment is paused", now)
	case current != nil && current.Reason == reasonPaused:
		return setCondition(conds, appsv1.DeploymentProgressing, corev1.ConditionUnknown, reasonResumed, "Deployment is resumed", now)
	case newRS == nil:
		return conds
	case s.UpdatedReplicas == want && s.Replicas == want && s.AvailableReplicas >= want:
		return setCondition(conds, appsv1.DeploymentProgressing, corev1.ConditionTrue, reasonNewRSAvailable,
			fmt.Sprintf("ReplicaSet %q has successfully progressed.", newRS.Name), now)
	}
	// A rollout in progress: progress is any change in the counts.
	progressed := d.Status.UpdatedReplicas != s.UpdatedReplicas || d.Status.AvailableReplicas != s.AvailableReplicas ||
		d.Status.Replicas != s.Replicas || d.Status.ReadyReplicas != s.ReadyReplicas
	if current == nil || current.Reason == reasonNewRSAvailable && d.Status.ObservedGeneration != d.Generation {
		reason := reasonNewRSCreated
		if current != nil {
			reason = reasonFoundNewRS
		}
		conds = setCondition(conds, appsv1.DeploymentProgressing, corev1.ConditionTrue, reason, fmt.Sprintf("Created new replica set %q", newRS.Name), now)
	} else if progressed || current.Reason != reasonTimedOut && current.Reason != reasonRSUpdated {
		conds = setCondition(conds, appsv1.DeploymentProgressing, corev1.ConditionTrue, reasonRSUpdated,
			fmt.Sprintf("ReplicaSet %q is progressing.", newRS.Name), now)
		updateTime(conds, now)
	}
	if deadline := d.Spec.ProgressDeadlineSeconds; deadline != nil && *deadline != int32(^uint32(0)>>1) {
		cond := getCondition(conds, appsv1.DeploymentProgressing)
		left := cond.LastUpdateTime.Add(time.Duration(*deadline) * time.Second).Sub(c.clock.Now())
		if left <= 0 && cond.Reason != reasonTimedOut {
			conds = setCondition(conds, appsv1.DeploymentProgressing, corev1.ConditionFalse, reasonTimedOut,
				fmt.Sprintf("ReplicaSet %q has timed out progressing.", newRS.Name), now)
		} else if left > 0 {
			c.queue.AddAfter(d.Namespace+"/"+d.Name, left+time.Second)
		}
	}
	return conds
}

func getCondition(conds []appsv1.DeploymentCondition, t appsv1.DeploymentConditionType) *appsv1.DeploymentCondition {
	for i := range conds {
		if conds[i].Type == t {
			return &conds[i]
		}
	}
	return nil
}

// setCondition sets a condition, keeping its times when nothing changed.
func setCondition(conds []appsv1.DeploymentCondition, t appsv1.DeploymentConditionType, status corev1.ConditionStatus, reason, message string, now metav1.Time) []appsv1.DeploymentCondition {
	out := append([]appsv1.DeploymentCondition{}, conds...)
	for i := range out {
		if out[i].Type != t {
			continue
		}
		if out[i].Status == status && out[i].Reason == reason && out[i].Message == message {
			return out
		}
		if out[i].Status != status {
			out[i].LastTransitionTime = now
		}
		out[i].Status, out[i].Reason, out[i].Message, out[i].LastUpdateTime = status, reason, message, now
		return out
	}
	return append(out, appsv1.DeploymentCondition{Type: t, Status: status, Reason: reason, Message: message, LastUpdateTime: now, LastTransitionTime: now})
}

func updateTime(conds []appsv1.DeploymentCondition, now metav1.Time) {
	for i := range conds {
		if conds[i].Type == appsv1.DeploymentProgressing {
			conds[i].LastUpdateTime = now
		}
	}
}
