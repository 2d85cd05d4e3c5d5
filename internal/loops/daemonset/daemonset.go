// Package daemonset runs one pod of each DaemonSet on every node it fits
// (node selector, required node affinity, taints against the pod's
// tolerations plus the ones Kubernetes gives daemon pods), as Kubernetes'
// DaemonSet controller does: pods are pinned to their node by node
// affinity and placed by the scheduler, removed from nodes that stop
// fitting, and replaced node by node within maxUnavailable on a rolling
// update (OnDelete replaces them only when deleted).
package daemonset

import (
	"context"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/loops/controller"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/flowcontrol"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// Controller is the DaemonSet loop.
type Controller struct {
	client    *kube.Client
	sets      appslisters.DaemonSetLister
	nodes     corelisters.NodeLister
	pods      corelisters.PodLister
	revisions appslisters.ControllerRevisionLister
	synced    []toolscache.InformerSynced
	queue     *controller.Queue[string]
	expect    *controller.Expectations
	recorder  kube.EventRecorder
	log       *slog.Logger
	clock     clock.PassiveClock
	// failedBackoff spaces the deletions of a set's failed pods on one
	// node, as Kubernetes' does: a node that keeps rejecting the pod
	// (out of room, say) is not fought in a hot loop.
	failedBackoff *flowcontrol.Backoff
}

// New registers the controller on the factory's informers.
func New(client *kube.Client, factory *kube.Informers, recorder kube.EventRecorder, env controller.Env) (*Controller, error) {
	ds, nodes, pods, revisions := factory.DaemonSets(), factory.Nodes(), factory.Pods(), factory.ControllerRevisions()
	c := &Controller{
		client: client, sets: ds.Lister(), nodes: nodes.Lister(), pods: pods.Lister(), revisions: revisions.Lister(),
		recorder: recorder, log: env.Log.With("loop", "daemonset"), clock: env.Clock,
		synced:        []toolscache.InformerSynced{ds.Informer().HasSynced, nodes.Informer().HasSynced, pods.Informer().HasSynced, revisions.Informer().HasSynced},
		queue:         controller.NewQueue[string]("daemonset", env),
		expect:        controller.NewExpectations(env.Clock),
		failedBackoff: flowcontrol.NewBackOff(time.Second, 15*time.Minute),
	}
	c.failedBackoff.Clock = env.Clock
	enqueue := func(obj any) {
		if k, err := toolscache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			c.queue.Add(k)
		}
	}
	all := func(any) {
		list, _ := c.sets.List(labels.Everything())
		for _, d := range list {
			enqueue(d)
		}
	}
	if _, err := ds.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, obj any) { enqueue(obj) }, DeleteFunc: enqueue,
	}); err != nil {
		return nil, err
	}
	if _, err := nodes.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: all, UpdateFunc: func(_, obj any) { all(obj) }, DeleteFunc: all,
	}); err != nil {
		return nil, err
	}
	// podChanged requeues the pod's DaemonSet; seen says the informer has
	// caught up with a create or delete the DaemonSet issued.
	podChanged := func(obj any, seen func(key string, pod *corev1.Pod)) {
		if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if pod, ok := obj.(*corev1.Pod); ok {
			if ref := metav1.GetControllerOf(pod); ref != nil && ref.Kind == "DaemonSet" {
				k := pod.Namespace + "/" + ref.Name
				seen(k, pod)
				c.queue.Add(k)
			}
		}
	}
	created := func(k string, _ *corev1.Pod) { c.expect.Created(k) }
	deleted := func(k string, pod *corev1.Pod) { c.expect.Deleted(k, pod.UID) }
	if _, err := pods.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { podChanged(obj, created) },
		UpdateFunc: func(_, obj any) {
			podChanged(obj, func(k string, pod *corev1.Pod) {
				if pod.DeletionTimestamp != nil {
					deleted(k, pod)
				}
			})
		},
		DeleteFunc: func(obj any) { podChanged(obj, deleted) },
	}); err != nil {
		return nil, err
	}
	return c, nil
}

// Run syncs DaemonSets until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	c.queue.Run(ctx, workers, c.synced, c.sync)
}

// daemonTolerations are what Kubernetes adds to every daemon pod, so that
// it stays on a node through the node's troubles.
var daemonTolerations = []corev1.Toleration{
	{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
	{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
	{Key: corev1.TaintNodeDiskPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	{Key: corev1.TaintNodeMemoryPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	{Key: corev1.TaintNodePIDPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	{Key: corev1.TaintNodeUnschedulable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
}

func tolerationsOf(ds *appsv1.DaemonSet) []corev1.Toleration {
	out := append([]corev1.Toleration{}, ds.Spec.Template.Spec.Tolerations...)
	for _, t := range daemonTolerations {
		if !hasToleration(out, t) {
			out = append(out, t)
		}
	}
	if ds.Spec.Template.Spec.HostNetwork {
		t := corev1.Toleration{Key: corev1.TaintNodeNetworkUnavailable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}
		if !hasToleration(out, t) {
			out = append(out, t)
		}
	}
	return out
}

func hasToleration(list []corev1.Toleration, t corev1.Toleration) bool {
	for _, have := range list {
		if have.Key == t.Key && have.Effect == t.Effect && have.Operator == t.Operator {
			return true
		}
	}
	return false
}

// shouldRun reports whether the set's pod belongs on node.
func shouldRun(ds *appsv1.DaemonSet, node *corev1.Node) bool {
	probe := &corev1.Pod{Spec: ds.Spec.Template.Spec}
	if ok, err := nodeaffinity.GetRequiredNodeAffinity(probe).Match(node); err != nil || !ok {
		return false
	}
	_, untolerated := corev1helpers.FindMatchingUntoleratedTaint(klog.Background(), node.Spec.Taints, tolerationsOf(ds), func(t *corev1.Taint) bool {
		return t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute
	}, false)
	return !untolerated
}

// targetNode is the node a daemon pod is pinned to.
func targetNode(p *corev1.Pod) string {
	if p.Spec.NodeName != "" {
		return p.Spec.NodeName
	}
	if a := p.Spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
			for _, f := range term.MatchFields {
				if f.Key == "metadata.name" && len(f.Values) == 1 {
					return f.Values[0]
				}
			}
		}
	}
	return ""
}

func podReady(p *corev1.Pod) (bool, time.Time) {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue, c.LastTransitionTime.Time
		}
	}
	return false, time.Time{}
}

func (c *Controller) sync(ctx context.Context, k string) error {
	ns, name, _ := strings.Cut(k, "/")
	ds, err := c.sets.DaemonSets(ns).Get(name)
	if apierrors.IsNotFound(err) {
		c.expect.Forget(k)
		return nil
	}
	if err != nil || ds.DeletionTimestamp != nil {
		return err
	}
	// Until the informer has seen the pods this DaemonSet last created and
	// deleted, its cache would show a deleted pod still available and let
	// a rolling update take a second node down: wait for them (their
	// events requeue the key), as Kubernetes' controller does.
	if !c.expect.Satisfied(k) {
		return nil
	}
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		return err
	}
	all, err := c.pods.Pods(ns).List(labels.Everything())
	if err != nil {
		return err
	}
	byNode := map[string][]*corev1.Pod{}
	terminating := map[string]bool{}
	live := map[string]bool{} // the revision hashes the set's pods carry
	var owned []*corev1.Pod
	for _, p := range all {
		ref := metav1.GetControllerOf(p)
		if ref != nil && ref.UID == ds.UID {
			live[p.Labels[appsv1.DefaultDaemonSetUniqueLabelKey]] = true
			if p.DeletionTimestamp == nil {
				owned = append(owned, p)
			}
		}
		switch {
		case ref == nil || ref.UID != ds.UID || p.Status.Phase == corev1.PodSucceeded:
		case p.DeletionTimestamp != nil:
			terminating[targetNode(p)] = true
		case p.Status.Phase == corev1.PodFailed:
			// Deleted, then replaced once gone (as a terminating pod is).
			if err := c.deleteFailed(ctx, ds, p); err != nil {
				return err
			}
			terminating[targetNode(p)] = true
		default:
			byNode[targetNode(p)] = append(byNode[targetNode(p)], p)
		}
	}
	cur, history, err := c.history(ctx, ds, owned)
	if err != nil {
		return err
	}
	hash := cur.Labels[appsv1.DefaultDaemonSetUniqueLabelKey]
	now := c.clock.Now()
	var s appsv1.DaemonSetStatus
	var old []*corev1.Pod // outdated pods on nodes they belong on
	unavailable := 0
	for _, node := range nodes {
		pods := byNode[node.Name]
		sort.Slice(pods, func(i, j int) bool { return pods[i].CreationTimestamp.Before(&pods[j].CreationTimestamp) })
		if !shouldRun(ds, node) {
			if len(pods) > 0 {
				s.NumberMisscheduled++
			}
			for _, p := range pods {
				if err := c.deletePod(ctx, ds, p); err != nil {
					return err
				}
			}
			continue
		}
		s.DesiredNumberScheduled++
		if len(pods) == 0 {
			unavailable++
			// The replacement waits for the old pod to be gone: they would
			// share host ports and names of things on the node.
			if !terminating[node.Name] {
				if err := c.createPod(ctx, ds, node.Name, hash); err != nil {
					return err
				}
			}
			continue
		}
		for _, extra := range pods[1:] {
			if err := c.deletePod(ctx, ds, extra); err != nil {
				return err
			}
		}
		p := pods[0]
		s.CurrentNumberScheduled++
		ready, since := podReady(p)
		available := ready && !since.Add(time.Duration(ds.Spec.MinReadySeconds)*time.Second).After(now)
		if ready {
			s.NumberReady++
		}
		if available {
			s.NumberAvailable++
		} else {
			unavailable++
		}
		if p.Labels[appsv1.DefaultDaemonSetUniqueLabelKey] == hash {
			s.UpdatedNumberScheduled++
		} else {
			old = append(old, p)
		}
	}
	if ds.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType && len(old) > 0 {
		if err := c.rollOut(ctx, ds, old, unavailable, int(s.DesiredNumberScheduled)); err != nil {
			return err
		}
	}
	if err := c.cleanupHistory(ctx, ds, history, live); err != nil {
		return err
	}
	s.NumberUnavailable = max(0, s.DesiredNumberScheduled-s.NumberAvailable)
	s.ObservedGeneration = ds.Generation
	s.CollisionCount = ds.Status.CollisionCount
	s.Conditions = ds.Status.Conditions
	if s.NumberReady > s.NumberAvailable && ds.Spec.MinReadySeconds > 0 {
		c.queue.AddAfter(k, time.Duration(ds.Spec.MinReadySeconds)*time.Second)
	}
	if statusEqual(s, ds.Status) {
		return nil
	}
	updated := ds.DeepCopy()
	updated.Status = s
	if _, err := c.client.DaemonSets(ns).UpdateStatus(ctx, updated, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}

func statusEqual(a, b appsv1.DaemonSetStatus) bool {
	return a.DesiredNumberScheduled == b.DesiredNumberScheduled && a.CurrentNumberScheduled == b.CurrentNumberScheduled &&
		a.NumberMisscheduled == b.NumberMisscheduled && a.NumberReady == b.NumberReady && a.NumberAvailable == b.NumberAvailable &&
		a.NumberUnavailable == b.NumberUnavailable && a.UpdatedNumberScheduled == b.UpdatedNumberScheduled && a.ObservedGeneration == b.ObservedGeneration
}

// rollOut deletes outdated pods (their replacements come next sync) while
// no more than maxUnavailable nodes lack an available pod; outdated pods
// that are not available go first, as they cost nothing.
func (c *Controller) rollOut(ctx context.Context, ds *appsv1.DaemonSet, old []*corev1.Pod, unavailable, desired int) error {
	maxUnavailable := 1
	if ru := ds.Spec.UpdateStrategy.RollingUpdate; ru != nil && ru.MaxUnavailable != nil {
		v, err := intstr.GetScaledValueFromIntOrPercent(ru.MaxUnavailable, desired, true)
		if err == nil {
			maxUnavailable = max(v, 1)
		}
	}
	budget := maxUnavailable - unavailable
	for _, p := range old {
		if ready, _ := podReady(p); !ready {
			if err := c.deletePod(ctx, ds, p); err != nil {
				return err
			}
		}
	}
	for _, p := range old {
		if budget <= 0 {
			break
		}
		if ready, _ := podReady(p); ready {
			if err := c.deletePod(ctx, ds, p); err != nil {
				return err
			}
			budget--
		}
	}
	return nil
}

// createPod makes the set's pod for one node, pinned to it by node
// affinity on metadata.name so that the scheduler places it there.
func (c *Controller) createPod(ctx context.Context, ds *appsv1.DaemonSet, node, hash string) error {
	t := ds.Spec.Template.DeepCopy()
	podLabels := map[string]string{}
	for k, v := range t.Labels {
		podLabels[k] = v
	}
	podLabels[appsv1.DefaultDaemonSetUniqueLabelKey] = hash
	podLabels["pod-template-generation"] = strconv.FormatInt(ds.Generation, 10)
	spec := t.Spec
	spec.Tolerations = tolerationsOf(ds)
	pin := corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}
	if spec.Affinity == nil {
		spec.Affinity = &corev1.Affinity{}
	}
	if spec.Affinity.NodeAffinity == nil {
		spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{pin}}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: ds.Name + "-", Namespace: ds.Namespace, Labels: podLabels, Annotations: t.Annotations,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(ds, appsv1.SchemeGroupVersion.WithKind("DaemonSet"))},
		},
		Spec: spec,
	}
	key := ds.Namespace + "/" + ds.Name
	c.expect.Raise(key, "")
	_, err := c.client.Pods(ds.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		c.expect.Created(key) // no pod will come to be seen
	}
	if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
		return nil
	}
	if err != nil {
		c.recorder.Eventf(ds, nil, corev1.EventTypeWarning, "FailedCreate", "Create", "Error creating: %v", err)
		return err
	}
	c.recorder.Eventf(ds, nil, corev1.EventTypeNormal, "SuccessfulCreate", "Create", "Created pod for node %s", node)
	return nil
}

// deleteFailed deletes a failed daemon pod (its replacement follows),
// at most once per backoff period per node.
func (c *Controller) deleteFailed(ctx context.Context, ds *appsv1.DaemonSet, p *corev1.Pod) error {
	key := ds.Namespace + "/" + ds.Name + "/" + targetNode(p)
	now := c.clock.Now()
	c.failedBackoff.GC()
	if c.failedBackoff.IsInBackOffSinceUpdate(key, now) {
		c.queue.AddAfter(ds.Namespace+"/"+ds.Name, c.failedBackoff.Get(key))
		return nil
	}
	c.failedBackoff.Next(key, now)
	c.recorder.Eventf(ds, nil, corev1.EventTypeWarning, "FailedDaemonPod", "Delete", "Found failed daemon pod %s/%s on node %s, will try to kill it", p.Namespace, p.Name, targetNode(p))
	return c.deletePod(ctx, ds, p)
}

func (c *Controller) deletePod(ctx context.Context, ds *appsv1.DaemonSet, p *corev1.Pod) error {
	key := ds.Namespace + "/" + ds.Name
	c.expect.Raise(key, p.UID)
	err := c.client.Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}})
	if err != nil {
		c.expect.Deleted(key, p.UID) // nothing will come to be seen
	}
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	if err == nil {
		c.recorder.Eventf(ds, nil, corev1.EventTypeNormal, "SuccessfulDelete", "Delete", "Deleted pod: %s", p.Name)
	}
	return err
}
