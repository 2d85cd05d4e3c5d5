// Package replicaset keeps each ReplicaSet's pods at its replica count, as
// Kubernetes' ReplicaSet controller does: it adopts orphan pods its
// selector matches and releases owned pods that no longer match, creates
// missing pods in slow-start batches, deletes surplus pods starting with
// the least useful (unscheduled, pending, not ready, newest), and reports
// replicas, ready and available counts in status. A second instance keeps
// ReplicationControllers, seen as the ReplicaSets they convert to, as
// Kubernetes' ReplicationController manager does.
package replicaset

import (
	"context"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/loops/controller"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

// burstReplicas caps the pods created or deleted in one sync, as
// Kubernetes' --replicaset-controller burst does.
const burstReplicas = 500

// kind is what one instance of the loop keeps, each object seen as a
// ReplicaSet.
type kind struct {
	gvk  schema.GroupVersionKind
	get  func(namespace, name string) (*appsv1.ReplicaSet, error)
	list func(namespace string) ([]*appsv1.ReplicaSet, error)
	// writeStatus writes a set's status back to its own kind.
	writeStatus func(ctx context.Context, set *appsv1.ReplicaSet) error
	// original is the object events are about.
	original func(set *appsv1.ReplicaSet) runtime.Object
}

// Controller is the ReplicaSet loop.
type Controller struct {
	client   *kube.Client
	kind     kind
	pods     corelisters.PodLister
	synced   []toolscache.InformerSynced
	queue    *controller.Queue[string]
	recorder kube.EventRecorder
	log      *slog.Logger
	clock    clock.PassiveClock
	expect   *controller.Expectations
}

// New registers the ReplicaSet loop's handlers on the factory's informers.
func New(client *kube.Client, factory *kube.Informers, recorder kube.EventRecorder, env controller.Env) (*Controller, error) {
	rs := factory.ReplicaSets()
	sets := rs.Lister()
	return newController(client, factory, recorder, env, "replicaset", rs.Informer(), kind{
		gvk: appsv1.SchemeGroupVersion.WithKind("ReplicaSet"),
		get: func(ns, name string) (*appsv1.ReplicaSet, error) { return sets.ReplicaSets(ns).Get(name) },
		list: func(ns string) ([]*appsv1.ReplicaSet, error) {
			return sets.ReplicaSets(ns).List(labels.Everything())
		},
		writeStatus: func(ctx context.Context, set *appsv1.ReplicaSet) error {
			_, err := client.ReplicaSets(set.Namespace).UpdateStatus(ctx, set, metav1.UpdateOptions{})
			return err
		},
		original: func(set *appsv1.ReplicaSet) runtime.Object { return set },
	})
}

func newController(client *kube.Client, factory *kube.Informers, recorder kube.EventRecorder, env controller.Env, name string, sets toolscache.SharedIndexInformer, k kind) (*Controller, error) {
	pods := factory.Pods()
	c := &Controller{
		client: client, kind: k, pods: pods.Lister(), recorder: recorder, log: env.Log.With("loop", name), clock: env.Clock,
		synced: []toolscache.InformerSynced{sets.HasSynced, pods.Informer().HasSynced},
		queue:  controller.NewQueue[string](name, env),
		expect: controller.NewExpectations(env.Clock),
	}
	if _, err := sets.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueue,
		UpdateFunc: func(_, obj any) { c.enqueue(obj) },
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if set, err := meta.Accessor(obj); err == nil {
				c.expect.Forget(set.GetNamespace() + "/" + set.GetName())
				c.enqueue(obj)
			}
		},
	}); err != nil {
		return nil, err
	}
	if _, err := pods.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			pod := obj.(*corev1.Pod)
			if k := c.ownerKey(pod); k != "" {
				c.expect.Created(k)
			}
			c.podChanged(pod)
		},
		UpdateFunc: func(old, obj any) {
			oldPod, pod := old.(*corev1.Pod), obj.(*corev1.Pod)
			if ok := c.ownerKey(oldPod); ok != "" && ok != c.ownerKey(pod) {
				c.queue.Add(ok) // released
			}
			if k := c.ownerKey(pod); k != "" && pod.DeletionTimestamp != nil {
				c.expect.Deleted(k, pod.UID)
			}
			c.podChanged(pod)
		},
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if pod, ok := obj.(*corev1.Pod); ok {
				if k := c.ownerKey(pod); k != "" {
					c.expect.Deleted(k, pod.UID)
					c.queue.Add(k)
				}
			}
		},
	}); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Controller) enqueue(obj any) {
	if k, err := toolscache.MetaNamespaceKeyFunc(obj); err == nil {
		c.queue.Add(k)
	}
}

// ownerKey is the key of the ReplicaSet controlling pod, if any.
func (c *Controller) ownerKey(pod *corev1.Pod) string {
	ref := metav1.GetControllerOf(pod)
	if ref == nil || ref.Kind != c.kind.gvk.Kind {
		return ""
	}
	if gv, err := schema.ParseGroupVersion(ref.APIVersion); err != nil || gv.Group != c.kind.gvk.Group {
		return ""
	}
	return pod.Namespace + "/" + ref.Name
}

// podChanged syncs the pod's owner, or every set that could adopt it.
func (c *Controller) podChanged(pod *corev1.Pod) {
	if k := c.ownerKey(pod); k != "" {
		c.queue.Add(k)
		return
	}
	if pod.DeletionTimestamp != nil {
		return
	}
	sets, err := c.kind.list(pod.Namespace)
	if err != nil {
		return
	}
	for _, set := range sets {
		if sel, err := metav1.LabelSelectorAsSelector(set.Spec.Selector); err == nil && !sel.Empty() && sel.Matches(labels.Set(pod.Labels)) {
			c.enqueue(set)
		}
	}
}

// Run syncs ReplicaSets with workers goroutines until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	c.queue.Run(ctx, workers, c.synced, c.sync)
}

func (c *Controller) sync(ctx context.Context, k string) error {
	ns, name, _ := strings.Cut(k, "/")
	set, err := c.kind.get(ns, name)
	if apierrors.IsNotFound(err) {
		c.expect.Forget(k)
		return nil
	}
	if err != nil {
		return err
	}
	selector, err := metav1.LabelSelectorAsSelector(set.Spec.Selector)
	if err != nil || selector.Empty() {
		return nil // validation forbids it; nothing sensible to do
	}
	all, err := c.pods.Pods(ns).List(labels.Everything())
	if err != nil {
		return err
	}
	owned, _, err := controller.ClaimPods(ctx, c.client, set, c.kind.gvk, selector, all)
	if err != nil {
		return err
	}
	var active []*corev1.Pod
	for _, p := range owned {
		if p.DeletionTimestamp == nil && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			active = append(active, p)
		}
	}
	var manageErr error
	if c.expect.Satisfied(k) && set.DeletionTimestamp == nil {
		manageErr = c.manage(ctx, set, active)
	}
	if err := c.updateStatus(ctx, set, active, manageErr); err != nil {
		return err
	}
	return manageErr
}

// manage creates or deletes pods to reach the replica count.
func (c *Controller) manage(ctx context.Context, set *appsv1.ReplicaSet, active []*corev1.Pod) error {
	want := int(ptr.Deref(set.Spec.Replicas, 1))
	k := set.Namespace + "/" + set.Name
	diff := len(active) - want
	switch {
	case diff < 0:
		n := min(-diff, burstReplicas)
		c.expect.Expect(k, n, nil)
		created, err := slowStart(n, func() error {
			_, err := c.client.Pods(set.Namespace).Create(ctx, podFor(set, c.kind.gvk), metav1.CreateOptions{})
			return err
		})
		// Creates that never happened will never be observed.
		for range n - created {
			c.expect.Created(k)
		}
		if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
			return nil // the namespace is going, and the set with it
		}
		if err != nil {
			c.recorder.Eventf(c.kind.original(set), nil, corev1.EventTypeWarning, "FailedCreate", "Create", "Error creating: %v", err)
			return err
		}
		c.recorder.Eventf(c.kind.original(set), nil, corev1.EventTypeNormal, "SuccessfulCreate", "Create", "Created %d pod(s)", created)
	case diff > 0:
		n := min(diff, burstReplicas)
		victims := deletionOrder(active)[:n]
		uids := make([]types.UID, n)
		for i, p := range victims {
			uids[i] = p.UID
		}
		c.expect.Expect(k, 0, uids)
		var firstErr error
		for _, p := range victims {
			err := c.client.Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}})
			if err != nil {
				c.expect.Deleted(k, p.UID)
				if !apierrors.IsNotFound(err) && firstErr == nil {
					firstErr = err
				}
				continue
			}
			c.recorder.Eventf(c.kind.original(set), nil, corev1.EventTypeNormal, "SuccessfulDelete", "Delete", "Deleted pod: %s", p.Name)
		}
		return firstErr
	}
	return nil
}

// slowStart runs fn n times in batches of 1, 2, 4, ... in parallel, and
// stops at the first batch with an error, as Kubernetes does so that a
// quota or admission error fails one request rather than hundreds.
func slowStart(n int, fn func() error) (int, error) {
	done := 0
	for batch := 1; done < n; batch *= 2 {
		size := min(batch, n-done)
		errs := make(chan error, size)
		var wg sync.WaitGroup
		for range size {
			wg.Go(func() { errs <- fn() })
		}
		wg.Wait()
		close(errs)
		ok := 0
		var first error
		for err := range errs {
			if err == nil {
				ok++
			} else if first == nil {
				first = err
			}
		}
		done += ok
		if first != nil {
			return done, first
		}
	}
	return done, nil
}

// podFor makes a pod from the set's template.
func podFor(set *appsv1.ReplicaSet, gvk schema.GroupVersionKind) *corev1.Pod {
	t := set.Spec.Template.DeepCopy()
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: set.Name + "-", Namespace: set.Namespace, Labels: t.Labels, Annotations: t.Annotations, Finalizers: t.Finalizers,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(set, gvk)},
		},
		Spec: t.Spec,
	}
}

// deletionOrder ranks pods from the first to delete to the last, as
// Kubernetes does: unscheduled before scheduled, pending before unknown
// before running, not ready before ready, recently ready before long
// ready, more restarts before fewer, newer before older.
func deletionOrder(pods []*corev1.Pod) []*corev1.Pod {
	out := append([]*corev1.Pod{}, pods...)
	phaseRank := map[corev1.PodPhase]int{corev1.PodPending: 0, corev1.PodUnknown: 1, corev1.PodRunning: 2}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if (a.Spec.NodeName == "") != (b.Spec.NodeName == "") {
			return a.Spec.NodeName == ""
		}
		if phaseRank[a.Status.Phase] != phaseRank[b.Status.Phase] {
			return phaseRank[a.Status.Phase] < phaseRank[b.Status.Phase]
		}
		ra, rb := readySince(a), readySince(b)
		if (ra == nil) != (rb == nil) {
			return ra == nil
		}
		if ra != nil && !ra.Equal(rb) {
			return rb.Before(ra)
		}
		if restarts(a) != restarts(b) {
			return restarts(a) > restarts(b)
		}
		return b.CreationTimestamp.Before(&a.CreationTimestamp)
	})
	return out
}

// readySince is when the pod became ready, nil when it is not.
func readySince(p *corev1.Pod) *metav1.Time {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			t := c.LastTransitionTime
			return &t
		}
	}
	return nil
}

func restarts(p *corev1.Pod) int32 {
	var n int32
	for _, s := range p.Status.ContainerStatuses {
		n += s.RestartCount
	}
	return n
}

// updateStatus writes the counts Kubernetes reports, when they changed.
func (c *Controller) updateStatus(ctx context.Context, set *appsv1.ReplicaSet, active []*corev1.Pod, manageErr error) error {
	status := appsv1.ReplicaSetStatus{Replicas: int32(len(active)), ObservedGeneration: set.Generation}
	templateLabels := labels.SelectorFromSet(set.Spec.Template.Labels)
	now := c.clock.Now()
	for _, p := range active {
		if templateLabels.Matches(labels.Set(p.Labels)) {
			status.FullyLabeledReplicas++
		}
		if since := readySince(p); since != nil {
			status.ReadyReplicas++
			if since.Add(time.Duration(set.Spec.MinReadySeconds) * time.Second).Before(now.Add(time.Millisecond)) {
				status.AvailableReplicas++
			}
		}
	}
	status.Conditions = set.Status.Conditions
	if manageErr != nil {
		status.Conditions = setCondition(status.Conditions, appsv1.ReplicaSetCondition{
			Type: appsv1.ReplicaSetReplicaFailure, Status: corev1.ConditionTrue, Reason: "FailedCreate", Message: manageErr.Error(), LastTransitionTime: metav1.Now(),
		})
	} else {
		status.Conditions = removeCondition(status.Conditions, appsv1.ReplicaSetReplicaFailure)
	}
	if equalStatus(set.Status, status) {
		if status.ReadyReplicas > status.AvailableReplicas && set.Spec.MinReadySeconds > 0 {
			// Look again when the ready pods have been ready long enough.
			c.queue.AddAfter(set.Namespace+"/"+set.Name, time.Duration(set.Spec.MinReadySeconds)*time.Second)
		}
		return nil
	}
	updated := set.DeepCopy()
	updated.Status = status
	err := c.kind.writeStatus(ctx, updated)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err == nil && status.ReadyReplicas > status.AvailableReplicas && set.Spec.MinReadySeconds > 0 {
		c.queue.AddAfter(set.Namespace+"/"+set.Name, time.Duration(set.Spec.MinReadySeconds)*time.Second)
	}
	return err
}

func equalStatus(a, b appsv1.ReplicaSetStatus) bool {
	if a.Replicas != b.Replicas || a.FullyLabeledReplicas != b.FullyLabeledReplicas || a.ReadyReplicas != b.ReadyReplicas ||
		a.AvailableReplicas != b.AvailableReplicas || a.ObservedGeneration != b.ObservedGeneration || len(a.Conditions) != len(b.Conditions) {
		return false
	}
	for i := range a.Conditions {
		if a.Conditions[i].Type != b.Conditions[i].Type || a.Conditions[i].Status != b.Conditions[i].Status || a.Conditions[i].Message != b.Conditions[i].Message {
			return false
		}
	}
	return true
}

func setCondition(conds []appsv1.ReplicaSetCondition, c appsv1.ReplicaSetCondition) []appsv1.ReplicaSetCondition {
	for i := range conds {
		if conds[i].Type == c.Type {
			if conds[i].Status == c.Status {
				c.LastTransitionTime = conds[i].LastTransitionTime
			}
			out := append([]appsv1.ReplicaSetCondition{}, conds...)
			out[i] = c
			return out
		}
	}
	return append(append([]appsv1.ReplicaSetCondition{}, conds...), c)
}

func removeCondition(conds []appsv1.ReplicaSetCondition, t appsv1.ReplicaSetConditionType) []appsv1.ReplicaSetCondition {
	var out []appsv1.ReplicaSetCondition
	for _, c := range conds {
		if c.Type != t {
			out = append(out, c)
		}
	}
	return out
}
