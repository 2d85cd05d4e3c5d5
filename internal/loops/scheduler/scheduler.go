// Package scheduler places pending pods on nodes the way kube-scheduler's
// default profile does: it filters the nodes that can run a pod (taints,
// node affinity and selectors, resources, host ports, pod anti-affinity,
// unschedulable and not-ready nodes, the nodes its volumes reach), scores the feasible ones (least
// allocated, balanced allocation, preferred affinity, PreferNoSchedule
// taints, spreading a controller's pods), and binds the pod to the best
// through pods/binding. Equal nodes take turns.
//
// A pod is counted on its node from the moment the scheduler chooses it,
// before the binding lands, so a burst never overcommits a node. A pod
// that fits nowhere gets PodScheduled=False/Unschedulable with Kubernetes'
// "0/3 nodes are available: ..." message and an event, and is tried again
// when the cluster changes.
package scheduler

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/orch-dev/orch/internal/kube"
	"github.com/prometheus/client_golang/prometheus"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	policylisters "k8s.io/client-go/listers/policy/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

// Name is the schedulerName this scheduler serves.
const Name = corev1.DefaultSchedulerName

// Options tune the scheduler; the zero value is Kubernetes' behaviour.
type Options struct {
	Logger *slog.Logger
	// Clock is what retries run on (default real).
	Clock clock.WithTicker
	// BindWorkers bounds the bindings in flight (default 32).
	BindWorkers int
	// RetryEvery retries unschedulable pods even when nothing seems to
	// have changed (default one minute).
	RetryEvery time.Duration
	// Metrics, when set, is where the scheduler's metrics and its queue's
	// are registered.
	Metrics prometheus.Registerer
	// Workqueues measures the scheduler's queue (nil: not measured).
	Workqueues workqueue.MetricsProvider
}

// Scheduler is the scheduling loop.
type Scheduler struct {
	client   *kube.Client
	pods     corelisters.PodLister
	budgets  policylisters.PodDisruptionBudgetLister
	volumes  volumeListers
	synced   []toolscache.InformerSynced
	cache    *cache
	queue    workqueue.TypedRateLimitingInterface[string]
	recorder kube.EventRecorder
	log      *slog.Logger
	opts     Options
	binds    chan struct{}
	next     int // where the next node search starts: equal nodes take turns
	metrics  *schedulerMetrics

	mu sync.Mutex
	// waiting are the pods that fit nowhere, until the cluster changes.
	waiting map[string]bool
}

// New registers the scheduler's handlers on the factory's pod and node
// informers.
func New(client *kube.Client, factory *kube.Informers, recorder kube.EventRecorder, opts Options) (*Scheduler, error) {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.BindWorkers <= 0 {
		opts.BindWorkers = 32
	}
	if opts.RetryEvery <= 0 {
		opts.RetryEvery = time.Minute
	}
	pods, nodes, pvcs, pvs, classes := factory.Pods(), factory.Nodes(), factory.PersistentVolumeClaims(), factory.PersistentVolumes(), factory.StorageClasses()
	budgets := factory.PodDisruptionBudgets()
	s := &Scheduler{
		client: client, pods: pods.Lister(), budgets: budgets.Lister(), cache: newCache(),
		volumes: volumeListers{pvcs: pvcs.Lister(), pvs: pvs.Lister(), classes: classes.Lister()}, recorder: recorder, log: opts.Logger.With("loop", "scheduler"),
		opts: opts, binds: make(chan struct{}, opts.BindWorkers), waiting: map[string]bool{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, time.Minute),
			workqueue.TypedRateLimitingQueueConfig[string]{DelayingQueue: workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[string]{
				Name: "scheduler", MetricsProvider: opts.Workqueues,
				Queue: workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[string]{Name: "scheduler", MetricsProvider: opts.Workqueues,
					Queue: &activeQueue{priority: podPriority(pods.Lister())}}),
			})}),
		metrics: newSchedulerMetrics(opts.Metrics),
		synced: []toolscache.InformerSynced{pods.Informer().HasSynced, nodes.Informer().HasSynced, budgets.Informer().HasSynced,
			pvcs.Informer().HasSynced, pvs.Informer().HasSynced, classes.Informer().HasSynced},
	}
	// A claim bound or made, a volume freed or a class added may let a
	// waiting pod go.
	for _, inf := range []toolscache.SharedIndexInformer{pvcs.Informer(), pvs.Informer(), classes.Informer()} {
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc: func(any) { s.wake() }, UpdateFunc: func(any, any) { s.wake() },
		}); err != nil {
			return nil, err
		}
	}
	if _, err := pods.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.podChanged(nil, obj.(*corev1.Pod)) },
		UpdateFunc: func(old, obj any) { s.podChanged(old.(*corev1.Pod), obj.(*corev1.Pod)) },
		DeleteFunc: s.podDeleted,
	}); err != nil {
		return nil, err
	}
	if _, err := nodes.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { s.cache.setNode(obj.(*corev1.Node)); s.wake() },
		UpdateFunc: func(old, obj any) {
			s.cache.setNode(obj.(*corev1.Node))
			if nodeSchedulingChanged(old.(*corev1.Node), obj.(*corev1.Node)) {
				s.wake()
			}
		},
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if node, ok := obj.(*corev1.Node); ok {
				s.cache.removeNode(node.Name)
			}
		},
	}); err != nil {
		return nil, err
	}
	return s, nil
}

// Run schedules until ctx ends.
func (s *Scheduler) Run(ctx context.Context) {
	defer s.queue.ShutDown()
	if !toolscache.WaitForCacheSync(ctx.Done(), s.synced...) {
		return
	}
	go func() {
		t := s.opts.Clock.NewTicker(s.opts.RetryEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C():
				s.wake()
			}
		}
	}()
	go func() { <-ctx.Done(); s.queue.ShutDown() }()
	for {
		key, quit := s.queue.Get()
		if quit {
			return
		}
		s.scheduleOne(ctx, key)
		s.queue.Done(key)
	}
}

func (s *Scheduler) podChanged(old, pod *corev1.Pod) {
	switch {
	case pod.Spec.NodeName != "":
		if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			// A finished pod's resources are free again.
			if s.cache.isPlaced(pod.UID) {
				s.cache.forget(pod.UID)
				s.wake()
			}
			return
		}
		s.cache.place(pod, pod.Spec.NodeName)
	case pod.DeletionTimestamp != nil || pod.Spec.SchedulerName != Name:
		s.cache.unnominate(pod.UID)
	case old == nil || !equality.Semantic.DeepEqual(old.Spec, pod.Spec) || !maps.Equal(old.Labels, pod.Labels):
		// New, or changed in a way that may change where it fits; our own
		// status updates change neither.
		s.nominated(pod)
		s.queue.Add(key(pod))
	default:
		s.nominated(pod)
	}
}

// nominated keeps the room of a pod nominated to a node (by this
// scheduler before a restart, or by another).
func (s *Scheduler) nominated(pod *corev1.Pod) {
	if node := pod.Status.NominatedNodeName; node != "" {
		s.cache.nominate(pod, node)
	} else {
		s.cache.unnominate(pod.UID)
	}
}

func (s *Scheduler) podDeleted(obj any) {
	if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	s.mu.Lock()
	delete(s.waiting, key(pod))
	s.mu.Unlock()
	s.cache.unnominate(pod.UID)
	if s.cache.isPlaced(pod.UID) {
		s.cache.forget(pod.UID)
		s.wake()
	}
}

// nodeSchedulingChanged reports whether a node update can change where
// pods fit; heartbeats alone do not.
func nodeSchedulingChanged(old, node *corev1.Node) bool {
	if !equality.Semantic.DeepEqual(old.Spec, node.Spec) || !maps.Equal(old.Labels, node.Labels) ||
		!equality.Semantic.DeepEqual(old.Status.Allocatable, node.Status.Allocatable) {
		return true
	}
	status := func(n *corev1.Node) map[corev1.NodeConditionType]corev1.ConditionStatus {
		m := map[corev1.NodeConditionType]corev1.ConditionStatus{}
		for _, c := range n.Status.Conditions {
			m[c.Type] = c.Status
		}
		return m
	}
	return !maps.Equal(status(old), status(node))
}

// wake retries every pod that was waiting for the cluster to change.
//
// They are queued highest priority first: the queue orders what it holds,
// but a worker waiting on it takes the first key added at once, and room
// freed for one pod must go to the most urgent of those waiting for it
// (kube-scheduler moves them into its queue in one step, under its lock).
func (s *Scheduler) wake() {
	s.mu.Lock()
	waiting := s.waiting
	s.waiting = map[string]bool{}
	s.mu.Unlock()
	priority := podPriority(s.pods)
	keys := make([]string, 0, len(waiting))
	priorities := make(map[string]int32, len(waiting))
	for k := range waiting {
		keys = append(keys, k)
		priorities[k] = priority(k)
	}
	slices.SortFunc(keys, func(a, b string) int { return cmp.Compare(priorities[b], priorities[a]) })
	for _, k := range keys {
		s.queue.Add(k)
	}
}

func key(pod *corev1.Pod) string { return pod.Namespace + "/" + pod.Name }

// podPriority is the priority of the pod of a key, for the queue's order.
func podPriority(pods corelisters.PodLister) func(string) int32 {
	return func(k string) int32 {
		ns, name, _ := strings.Cut(k, "/")
		pod, err := pods.Pods(ns).Get(name)
		if err != nil {
			return 0
		}
		return ptr.Deref(pod.Spec.Priority, 0)
	}
}

func (s *Scheduler) scheduleOne(ctx context.Context, k string) {
	ns, name, _ := strings.Cut(k, "/")
	pod, err := s.pods.Pods(ns).Get(name)
	if err != nil || pod.Spec.NodeName != "" || pod.DeletionTimestamp != nil || s.cache.isPlaced(pod.UID) {
		return
	}
	start := time.Now()
	pc, err := newPodContext(pod)
	if err != nil {
		s.metrics.attempt(resultUnschedulable, start)
		s.unschedulable(ctx, pod, err.Error())
		return
	}
	if len(pod.Spec.ResourceClaims) > 0 {
		// Kubernetes' scheduler waits until a claim's devices can be
		// allocated; orch runs no DRA driver and allocates none, so such a
		// pod waits too, saying why, rather than run without its devices.
		s.metrics.attempt(resultUnschedulable, start)
		s.unschedulable(ctx, pod, fmt.Sprintf("0/%d nodes are available: orch allocates no devices for resource claims (dynamic resource allocation).", s.cache.nodeCount()))
		return
	}
	volumes, why, err := s.volumes.volumesOf(pod)
	if err != nil {
		s.metrics.attempt(resultError, start)
		s.queue.AddRateLimited(k)
		return
	}
	if why != "" {
		s.metrics.attempt(resultUnschedulable, start)
		s.unschedulable(ctx, pod, fmt.Sprintf("0/%d nodes are available: %s.", s.cache.nodeCount(), why))
		return
	}
	pc.volumes = volumes
	node, message := s.pick(pc)
	if node == "" {
		s.metrics.attempt(resultUnschedulable, start)
		// Parked before any victim goes, so that their end wakes it.
		s.mu.Lock()
		s.waiting[k] = true
		s.mu.Unlock()
		s.preempt(ctx, pc)
		s.unschedulable(ctx, pod, message)
		return
	}
	s.mu.Lock()
	delete(s.waiting, k)
	s.mu.Unlock()
	select {
	case s.binds <- struct{}{}:
	case <-ctx.Done():
		s.cache.forget(pod.UID)
		return
	}
	go func() {
		defer func() { <-s.binds }()
		if err := s.selectNode(ctx, volumes, node); err != nil {
			s.metrics.attempt(resultError, start)
			s.cache.forget(pod.UID)
			s.log.Warn("telling the pod's claims their node", "pod", k, "node", node, "err", err)
			s.queue.AddRateLimited(k)
			return
		}
		if s.bind(ctx, pod, node) {
			s.metrics.attempt(resultScheduled, start)
		} else {
			s.metrics.attempt(resultError, start)
		}
	}()
}

// pick chooses the pod's node and counts the pod on it, or explains why
// no node fits.
func (s *Scheduler) pick(pc *podContext) (node, message string) {
	c := s.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(c.order)
	if n == 0 {
		return "", "no nodes available to schedule pods"
	}
	want := feasibleNodesToFind(n)
	start := s.next % n
	feasible := make([]*nodeInfo, 0, min(want, n))
	reasons := map[string]int{}
	var scratch []string
	examined := 0
	for ; examined < n && len(feasible) < want; examined++ {
		ni := c.nodes[c.order[(start+examined)%n]]
		if scratch = c.filterNominated(pc, ni, scratch[:0]); len(scratch) == 0 {
			feasible = append(feasible, ni)
			continue
		}
		for _, r := range scratch {
			reasons[r]++
		}
	}
	s.next = start + examined
	if len(feasible) == 0 {
		return "", fitMessage(n, reasons)
	}
	scores := score(pc, feasible)
	best := 0
	for i := range scores {
		if scores[i] > scores[best] {
			best = i
		}
	}
	chosen := feasible[best].node.Name
	c.placeLocked(pc.pod, chosen)
	return chosen, ""
}

// feasibleNodesToFind is how many fitting nodes are enough to choose from,
// as kube-scheduler's adaptive percentageOfNodesToScore: all of a small
// cluster, a shrinking share (at least 100 nodes) of a large one.
func feasibleNodesToFind(nodes int) int {
	if nodes < 100 {
		return nodes
	}
	percent := max(50-nodes/125, 5)
	return max(nodes*percent/100, 100)
}

// fitMessage words a failure as kube-scheduler does.
func fitMessage(nodes int, reasons map[string]int) string {
	var parts []string
	for r, n := range reasons {
		parts = append(parts, fmt.Sprintf("%d %s", n, r))
	}
	sort.Strings(parts)
	return fmt.Sprintf("0/%d nodes are available: %s.", nodes, strings.Join(parts, ", "))
}

func (s *Scheduler) bind(ctx context.Context, pod *corev1.Pod, node string) (bound bool) {
	binding := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}
	err := s.client.Bind(ctx, binding, metav1.CreateOptions{})
	switch {
	case err == nil:
		s.queue.Forget(key(pod))
		s.recorder.Eventf(pod, nil, corev1.EventTypeNormal, "Scheduled", "Binding", "Successfully assigned %s/%s to %s", pod.Namespace, pod.Name, node)
		return true
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		// Deleted, or bound by someone else: the informer tells the rest.
		s.cache.forget(pod.UID)
	default:
		s.cache.forget(pod.UID)
		s.log.Warn("binding failed", "pod", key(pod), "node", node, "err", err)
		s.queue.AddRateLimited(key(pod))
	}
	return false
}

// unschedulable records why the pod fits nowhere, on the pod and as an
// event, and parks it until the cluster changes.
func (s *Scheduler) unschedulable(ctx context.Context, pod *corev1.Pod, message string) {
	s.mu.Lock()
	s.waiting[key(pod)] = true
	s.mu.Unlock()
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Message == message {
			return // already said
		}
	}
	s.recorder.Eventf(pod, nil, corev1.EventTypeWarning, "FailedScheduling", "Scheduling", "%s", message)
	patch := fmt.Sprintf(`{"status":{"conditions":[{"type":%q,"status":%q,"reason":%q,"message":%q,"lastProbeTime":null,"lastTransitionTime":%q}]}}`,
		corev1.PodScheduled, corev1.ConditionFalse, corev1.PodReasonUnschedulable, message, metav1.Now().UTC().Format(time.RFC3339))
	if _, err := s.client.Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil && !apierrors.IsNotFound(err) {
		s.log.Warn("recording unschedulable pod", "pod", key(pod), "err", err)
	}
}
