// Package disruption is the loop that keeps each PodDisruptionBudget's
// status, as Kubernetes' disruption controller: how many of the pods it
// selects are healthy (ready, and not on their way out), how many must
// be, how many are expected (from their controllers' scale), and so how
// many may be disrupted now. The eviction API decides on that status and
// takes from it; this loop gives back what an eviction took when the pod
// did not go within two minutes, and clears a pod's DisruptionTarget
// condition when it was never deleted.
package disruption

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/loops/controller"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	policylisters "k8s.io/client-go/listers/policy/v1"
	toolscache "k8s.io/client-go/tools/cache"
	pdbhelper "k8s.io/component-helpers/apps/poddisruptionbudget"
)

const (
	// DeletionTimeout is how long an eviction's claim on a budget lasts:
	// a pod the eviction API let go that still runs after it counts as
	// healthy again (Kubernetes' DeletionTimeout).
	DeletionTimeout = 2 * time.Minute
	// staleDisruptionTimeout is how long a pod may carry a DisruptionTarget
	// condition without being deleted before the condition is withdrawn.
	staleDisruptionTimeout = 2 * time.Minute
)

// Controller is the disruption loop.
type Controller struct {
	client   *kube.Client
	scales   *kube.Scales
	recorder kube.EventRecorder
	env      controller.Env

	budgets     policylisters.PodDisruptionBudgetLister
	pods        corelisters.PodLister
	rcs         corelisters.ReplicationControllerLister
	replicaSets appslisters.ReplicaSetLister
	deployments appslisters.DeploymentLister
	statefuls   appslisters.StatefulSetLister
	synced      []toolscache.InformerSynced

	queue *controller.Queue[string]
	// stale holds pods whose DisruptionTarget condition may be stale.
	stale *controller.Queue[string]
}

// New registers the loop with the informers.
func New(client *kube.Client, factory *kube.Informers, scales *kube.Scales, recorder kube.EventRecorder, env controller.Env) (*Controller, error) {
	env = env.WithDefaults()
	budgets, pods, rcs := factory.PodDisruptionBudgets(), factory.Pods(), factory.ReplicationControllers()
	sets, deployments, statefuls := factory.ReplicaSets(), factory.Deployments(), factory.StatefulSets()
	c := &Controller{client: client, scales: scales, recorder: recorder, env: env,
		budgets: budgets.Lister(), pods: pods.Lister(), rcs: rcs.Lister(), replicaSets: sets.Lister(),
		deployments: deployments.Lister(), statefuls: statefuls.Lister(),
		queue: controller.NewQueue[string]("disruption", env), stale: controller.NewQueue[string]("disruption-stale-pods", env)}
	for _, inf := range []toolscache.SharedIndexInformer{budgets.Informer(), pods.Informer(), rcs.Informer(), sets.Informer(), deployments.Informer(), statefuls.Informer()} {
		c.synced = append(c.synced, inf.HasSynced)
	}
	if err := c.queue.EnqueueObjects(budgets.Informer(), controller.NamespacedKey); err != nil {
		return nil, err
	}
	onPod := func(old, obj any) {
		pod, ok := podOf(obj)
		if !ok {
			return
		}
		c.enqueueBudgetsOf(pod)
		if was, ok := podOf(old); ok && !apiequality.Semantic.DeepEqual(was.Labels, pod.Labels) {
			c.enqueueBudgetsOf(was)
		}
		c.watchStale(pod)
	}
	if _, err := pods.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { onPod(nil, obj) }, UpdateFunc: onPod, DeleteFunc: func(obj any) { onPod(nil, obj) },
	}); err != nil {
		return nil, err
	}
	// A workload's scale is a budget's expected count.
	onScale := func(obj any) {
		if m, ok := metaOf(obj); ok {
			c.enqueueNamespace(m.GetNamespace())
		}
	}
	for _, inf := range []toolscache.SharedIndexInformer{rcs.Informer(), sets.Informer(), deployments.Informer(), statefuls.Informer()} {
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc: onScale, UpdateFunc: func(old, obj any) {
				if scaleChanged(old, obj) {
					onScale(obj)
				}
			}, DeleteFunc: onScale,
		}); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Run syncs budgets with the given number of workers until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.stale.Run(ctx, 1, c.synced, c.syncStalePod)
	}()
	c.queue.Run(ctx, workers, c.synced, c.sync)
	<-done
}

func podOf(obj any) (*corev1.Pod, bool) {
	if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	p, ok := obj.(*corev1.Pod)
	return p, ok
}

func metaOf(obj any) (metav1.Object, bool) {
	if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	m, err := apimeta.Accessor(obj)
	return m, err == nil
}

// scaleChanged: a workload's update that may change what its budgets
// expect (its replicas; anything but a status write).
func scaleChanged(old, obj any) bool {
	o, ok1 := metaOf(old)
	n, ok2 := metaOf(obj)
	return !ok1 || !ok2 || o.GetGeneration() != n.GetGeneration()
}

func (c *Controller) enqueueBudgetsOf(pod *corev1.Pod) {
	budgets, err := c.budgets.PodDisruptionBudgets(pod.Namespace).List(labels.Everything())
	if err != nil {
		return
	}
	for _, b := range budgets {
		if sel, err := metav1.LabelSelectorAsSelector(b.Spec.Selector); err == nil && sel.Matches(labels.Set(pod.Labels)) {
			c.queue.Add(controller.NamespacedKey(b.Namespace, b.Name))
		}
	}
}

func (c *Controller) enqueueNamespace(ns string) {
	budgets, err := c.budgets.PodDisruptionBudgets(ns).List(labels.Everything())
	if err != nil {
		return
	}
	for _, b := range budgets {
		c.queue.Add(controller.NamespacedKey(b.Namespace, b.Name))
	}
}

func (c *Controller) sync(ctx context.Context, key string) error {
	ns, name, err := toolscache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pdb, err := c.budgets.PodDisruptionBudgets(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	err = c.trySync(ctx, pdb)
	if err == nil || apierrors.IsConflict(err) {
		return err
	}
	// Whatever went wrong, the budget must not allow what it cannot vouch for.
	c.env.Log.Warn("disruption budget sync failed", "budget", key, "err", err)
	return c.failSafe(ctx, pdb, err)
}

func (c *Controller) trySync(ctx context.Context, pdb *policyv1.PodDisruptionBudget) error {
	pods, err := c.podsOf(pdb)
	if err != nil {
		return err
	}
	if len(pods) == 0 {
		c.recorder.Eventf(pdb, nil, corev1.EventTypeNormal, "NoPods", "Sync", "No matching pods found")
	}
	expected, desired, unmanaged, err := c.expectedCount(ctx, pdb, pods)
	if len(unmanaged) > 0 {
		c.recorder.Eventf(pdb, nil, corev1.EventTypeWarning, "UnmanagedPods", "Sync",
			"Pods selected by this PodDisruptionBudget (selector: %v) were found to be unmanaged. As a result, the status of the PDB cannot be calculated correctly, which may result in undefined behavior. To account for these pods please set \".spec.minAvailable\" field of the PDB to an integer value.",
			pdb.Spec.Selector)
	}
	if err != nil {
		c.recorder.Eventf(pdb, nil, corev1.EventTypeWarning, "CalculateExpectedPodCountFailed", "Sync", "Failed to calculate the number of expected pods: %v", err)
		return err
	}
	now := c.env.Clock.Now()
	disrupted, recheck := c.disruptedPods(pdb, pods, now)
	healthy := countHealthy(pods, disrupted, now)
	if err := c.updateStatus(ctx, pdb, healthy, desired, expected, disrupted); err != nil {
		return err
	}
	if recheck != nil {
		c.queue.AddAfter(controller.NamespacedKey(pdb.Namespace, pdb.Name), recheck.Sub(now))
	}
	return nil
}

// podsOf lists the pods the budget selects: none without a selector,
// every pod of the namespace with an empty one (policy/v1).
func (c *Controller) podsOf(pdb *policyv1.PodDisruptionBudget) ([]*corev1.Pod, error) {
	sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil {
		return nil, err
	}
	return c.pods.Pods(pdb.Namespace).List(sel)
}

// expectedCount is Kubernetes' arithmetic: an absolute minAvailable
// expects the pods there are; a percentage, or maxUnavailable, expects
// the sum of the scales of the pods' controllers, pods without a
// controller left out (and reported).
func (c *Controller) expectedCount(ctx context.Context, pdb *policyv1.PodDisruptionBudget, pods []*corev1.Pod) (expected, desired int32, unmanaged []string, err error) {
	switch {
	case pdb.Spec.MaxUnavailable != nil:
		if expected, unmanaged, err = c.expectedScale(ctx, pods); err != nil {
			return 0, 0, unmanaged, err
		}
		maxUnavailable, err := intstr.GetScaledValueFromIntOrPercent(pdb.Spec.MaxUnavailable, int(expected), true)
		if err != nil {
			return 0, 0, unmanaged, err
		}
		desired = max(expected-int32(maxUnavailable), 0)
	case pdb.Spec.MinAvailable != nil && pdb.Spec.MinAvailable.Type == intstr.Int:
		desired, expected = pdb.Spec.MinAvailable.IntVal, int32(len(pods))
	case pdb.Spec.MinAvailable != nil:
		if expected, unmanaged, err = c.expectedScale(ctx, pods); err != nil {
			return 0, 0, unmanaged, err
		}
		minAvailable, err := intstr.GetScaledValueFromIntOrPercent(pdb.Spec.MinAvailable, int(expected), true)
		if err != nil {
			return 0, 0, unmanaged, err
		}
		desired = int32(minAvailable)
	}
	return expected, desired, unmanaged, nil
}

// expectedScale sums the scale of every controller of the pods, each
// counted once.
func (c *Controller) expectedScale(ctx context.Context, pods []*corev1.Pod) (int32, []string, error) {
	scales := map[types.UID]int32{}
	var unmanaged []string
	for _, pod := range pods {
		ref := metav1.GetControllerOf(pod)
		if ref == nil {
			unmanaged = append(unmanaged, pod.Name)
			continue
		}
		if _, seen := scales[ref.UID]; seen {
			continue
		}
		uid, scale, found, err := c.scaleOf(ctx, ref, pod.Namespace)
		if err != nil {
			return 0, unmanaged, err
		}
		if !found {
			return 0, unmanaged, fmt.Errorf("found no controllers for pod %q", pod.Name)
		}
		scales[uid] = scale
	}
	var sum int32
	for _, n := range scales {
		sum += n
	}
	return sum, unmanaged, nil
}

// scaleOf finds the workload a pod's controller reference names and its
// desired replicas: a ReplicaSet's are its Deployment's when one controls
// it; a kind orch does not know is asked through its scale subresource.
func (c *Controller) scaleOf(ctx context.Context, ref *metav1.OwnerReference, ns string) (types.UID, int32, bool, error) {
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	if err != nil {
		return "", 0, false, nil
	}
	replicas := func(n *int32) int32 {
		if n == nil {
			return 1
		}
		return *n
	}
	switch {
	case gv.Group == "" && ref.Kind == "ReplicationController":
		rc, err := c.rcs.ReplicationControllers(ns).Get(ref.Name)
		if err != nil || rc.UID != ref.UID {
			return "", 0, false, ignoreNotFound(err)
		}
		return rc.UID, replicas(rc.Spec.Replicas), true, nil
	case gv.Group == appsv1.GroupName && ref.Kind == "ReplicaSet":
		rs, err := c.replicaSets.ReplicaSets(ns).Get(ref.Name)
		if err != nil || rs.UID != ref.UID {
			return "", 0, false, ignoreNotFound(err)
		}
		if dref := metav1.GetControllerOf(rs); dref != nil && dref.Kind == "Deployment" {
			d, err := c.deployments.Deployments(ns).Get(dref.Name)
			if err != nil || d.UID != dref.UID {
				return "", 0, false, ignoreNotFound(err)
			}
			return d.UID, replicas(d.Spec.Replicas), true, nil
		}
		return rs.UID, replicas(rs.Spec.Replicas), true, nil
	case gv.Group == appsv1.GroupName && ref.Kind == "StatefulSet":
		ss, err := c.statefuls.StatefulSets(ns).Get(ref.Name)
		if err != nil || ss.UID != ref.UID {
			return "", 0, false, ignoreNotFound(err)
		}
		return ss.UID, replicas(ss.Spec.Replicas), true, nil
	}
	scale, err := c.scales.Get(ctx, gv.WithKind(ref.Kind), ns, ref.Name)
	if err != nil || scale.UID != ref.UID {
		return "", 0, false, ignoreNotFound(err)
	}
	return scale.UID, scale.Spec.Replicas, true, nil
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// disruptedPods keeps of the budget's disrupted pods those the eviction
// API let go less than DeletionTimeout ago and that are not yet being
// deleted, and says when the oldest of them expires.
func (c *Controller) disruptedPods(pdb *policyv1.PodDisruptionBudget, pods []*corev1.Pod, now time.Time) (map[string]metav1.Time, *time.Time) {
	out := map[string]metav1.Time{}
	var recheck *time.Time
	if pdb.Status.DisruptedPods == nil {
		return out, nil
	}
	for _, pod := range pods {
		if pod.DeletionTimestamp != nil {
			continue
		}
		at, found := pdb.Status.DisruptedPods[pod.Name]
		if !found {
			continue
		}
		expires := at.Add(DeletionTimeout)
		if expires.Before(now) {
			c.recorder.Eventf(pod, pdb, corev1.EventTypeWarning, "NotDeleted", "Sync", "Pod was expected by PDB %s/%s to be deleted but it wasn't", pdb.Namespace, pdb.Name)
			continue
		}
		if recheck == nil || expires.Before(*recheck) {
			recheck = &expires
		}
		out[pod.Name] = at
	}
	return out, recheck
}

// countHealthy counts the ready pods that are neither being deleted nor
// promised to an eviction.
func countHealthy(pods []*corev1.Pod, disrupted map[string]metav1.Time, now time.Time) int32 {
	var n int32
	for _, pod := range pods {
		if pod.DeletionTimestamp != nil {
			continue
		}
		if at, found := disrupted[pod.Name]; found && at.Add(DeletionTimeout).After(now) {
			continue
		}
		if podReady(pod) {
			n++
		}
	}
	return n
}

func (c *Controller) updateStatus(ctx context.Context, pdb *policyv1.PodDisruptionBudget, healthy, desired, expected int32, disrupted map[string]metav1.Time) error {
	// A budget whose pods are not yet counted allows nothing: its first
	// pods may appear before this loop sees them.
	allowed := healthy - desired
	if expected <= 0 || allowed <= 0 {
		allowed = 0
	}
	st := &pdb.Status
	if st.CurrentHealthy == healthy && st.DesiredHealthy == desired && st.ExpectedPods == expected && st.DisruptionsAllowed == allowed &&
		apiequality.Semantic.DeepEqual(st.DisruptedPods, disrupted) && st.ObservedGeneration == pdb.Generation && pdbhelper.ConditionsAreUpToDate(pdb) {
		return nil
	}
	next := pdb.DeepCopy()
	next.Status = policyv1.PodDisruptionBudgetStatus{CurrentHealthy: healthy, DesiredHealthy: desired, ExpectedPods: expected,
		DisruptionsAllowed: allowed, DisruptedPods: disrupted, ObservedGeneration: pdb.Generation, Conditions: next.Status.Conditions}
	pdbhelper.UpdateDisruptionAllowedCondition(next)
	_, err := c.client.PodDisruptionBudgets(next.Namespace).UpdateStatus(ctx, next, metav1.UpdateOptions{})
	return err
}

// failSafe leaves a budget it could not compute allowing no disruption,
// with the reason in its DisruptionAllowed condition.
func (c *Controller) failSafe(ctx context.Context, pdb *policyv1.PodDisruptionBudget, cause error) error {
	next := pdb.DeepCopy()
	next.Status.DisruptionsAllowed = 0
	if next.Status.Conditions == nil {
		next.Status.Conditions = []metav1.Condition{}
	}
	apimeta.SetStatusCondition(&next.Status.Conditions, metav1.Condition{Type: policyv1.DisruptionAllowedCondition, Status: metav1.ConditionFalse,
		Reason: policyv1.SyncFailedReason, Message: cause.Error(), ObservedGeneration: next.Status.ObservedGeneration})
	if _, err := c.client.PodDisruptionBudgets(next.Namespace).UpdateStatus(ctx, next, metav1.UpdateOptions{}); err != nil {
		return errors.Join(cause, err)
	}
	// Tried again later: what failed (a workload not yet cached) may heal.
	return cause
}

// watchStale queues a pod that carries a DisruptionTarget condition but is
// not being deleted, for when the condition would have grown stale.
func (c *Controller) watchStale(pod *corev1.Pod) {
	if pod.DeletionTimestamp != nil {
		return
	}
	if cond := disruptionTarget(pod); cond != nil && cond.Status == corev1.ConditionTrue {
		wait := cond.LastTransitionTime.Add(staleDisruptionTimeout).Sub(c.env.Clock.Now())
		c.stale.AddAfter(controller.NamespacedKey(pod.Namespace, pod.Name), max(wait, 0))
	}
}

// syncStalePod withdraws the DisruptionTarget condition of a pod that
// was to be disrupted two minutes ago and still is not being deleted.
func (c *Controller) syncStalePod(ctx context.Context, key string) error {
	ns, name, err := toolscache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pod, err := c.pods.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	cond := disruptionTarget(pod)
	if pod.DeletionTimestamp != nil || cond == nil || cond.Status != corev1.ConditionTrue {
		return nil
	}
	if wait := cond.LastTransitionTime.Add(staleDisruptionTimeout).Sub(c.env.Clock.Now()); wait > 0 {
		c.stale.AddAfter(key, wait)
		return nil
	}
	next := pod.DeepCopy()
	for i := range next.Status.Conditions {
		if cd := &next.Status.Conditions[i]; cd.Type == corev1.DisruptionTarget {
			cd.Status, cd.Reason, cd.Message = corev1.ConditionFalse, "", ""
			cd.LastTransitionTime = metav1.NewTime(c.env.Clock.Now())
		}
	}
	_, err = c.client.Pods(ns).UpdateStatus(ctx, next, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func disruptionTarget(pod *corev1.Pod) *corev1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == corev1.DisruptionTarget {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
