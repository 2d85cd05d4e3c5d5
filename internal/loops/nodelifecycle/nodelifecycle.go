// Package nodelifecycle watches node health and acts on it, as Kubernetes'
// node lifecycle controller does: a node whose Lease (or status) has not
// been renewed for the grace period is marked Ready=Unknown; unreachable
// and not-ready nodes get the node.kubernetes.io/unreachable or not-ready
// taints, NoSchedule and NoExecute, removed again when the node is back;
// pods on an unreachable node stop being Ready; and pods on a node with a
// NoExecute taint they do not tolerate are evicted, at once or when their
// tolerationSeconds (300 s by default admission) run out.
package nodelifecycle

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/orch-dev/orch/internal/kube"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	coordinationlisters "k8s.io/client-go/listers/coordination/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// Options tune the controller; zero values are Kubernetes' defaults.
type Options struct {
	// GracePeriod without a renewal before a node is Unknown
	// (--node-monitor-grace-period, 40 s).
	GracePeriod time.Duration
	// CheckEvery is how often nodes are checked (5 s).
	CheckEvery time.Duration
	Logger     *slog.Logger
	// Clock is what the checks and tolerations run on (default real).
	Clock clock.WithTicker
}

// Controller is the node lifecycle loop.
type Controller struct {
	client   *kube.Client
	nodes    corelisters.NodeLister
	leases   coordinationlisters.LeaseLister
	pods     corelisters.PodLister
	synced   []toolscache.InformerSynced
	recorder kube.EventRecorder
	opts     Options
	log      *slog.Logger
	// started is when the controller began watching: no node is judged
	// on silence from before it, when the control plane itself was down.
	started time.Time
}

// New registers the controller's informers.
func New(client *kube.Client, factory *kube.Informers, recorder kube.EventRecorder, opts Options) *Controller {
	if opts.GracePeriod <= 0 {
		opts.GracePeriod = 40 * time.Second
	}
	if opts.CheckEvery <= 0 {
		opts.CheckEvery = 5 * time.Second
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	nodes, leases, pods := factory.Nodes(), factory.Leases(), factory.Pods()
	return &Controller{
		client: client, nodes: nodes.Lister(), leases: leases.Lister(), pods: pods.Lister(), recorder: recorder, opts: opts,
		log:    opts.Logger.With("loop", "nodelifecycle"),
		synced: []toolscache.InformerSynced{nodes.Informer().HasSynced, leases.Informer().HasSynced, pods.Informer().HasSynced},
	}
}

// Run checks the nodes every CheckEvery until ctx ends.
func (c *Controller) Run(ctx context.Context) {
	if !toolscache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return
	}
	c.started = c.opts.Clock.Now()
	t := c.opts.Clock.NewTicker(c.opts.CheckEvery)
	defer t.Stop()
	for {
		if err := c.check(ctx, c.opts.Clock.Now()); err != nil && ctx.Err() == nil {
			c.log.Warn("node check", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
	}
}

var (
	unreachableTaints = []corev1.Taint{
		{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoSchedule},
		{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute},
	}
	notReadyTaints = []corev1.Taint{
		{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoSchedule},
		{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoExecute},
	}
)

func (c *Controller) check(ctx context.Context, now time.Time) error {
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		return err
	}
	pods, err := c.pods.List(labels.Everything())
	if err != nil {
		return err
	}
	byNode := map[string][]*corev1.Pod{}
	for _, p := range pods {
		if p.Spec.NodeName != "" && p.DeletionTimestamp == nil {
			byNode[p.Spec.NodeName] = append(byNode[p.Spec.NodeName], p)
		}
	}
	var firstErr error
	keep := func(err error) {
		if err != nil && firstErr == nil && !apierrors.IsNotFound(err) {
			firstErr = err
		}
	}
	for _, node := range nodes {
		node, err := c.monitor(ctx, node, now)
		keep(err)
		if node == nil {
			continue
		}
		ready := readyStatus(node)
		if ready == corev1.ConditionUnknown {
			for _, p := range byNode[node.Name] {
				keep(c.markNotReady(ctx, p))
			}
		}
		for _, p := range byNode[node.Name] {
			keep(c.evictIfUntolerated(ctx, node, p, now))
		}
	}
	return firstErr
}

// lastSeen is when the node last showed life: its Lease renewal, or its
// Ready heartbeat, or its creation; and at the earliest when the
// controller started. As in Kubernetes, whose controller times nodes from
// when it first observed them: after the server was down for a minute,
// every node gets a whole grace period to renew its lease again instead
// of being marked Unknown (and its pods NotReady) at the first check.
func (c *Controller) lastSeen(node *corev1.Node) time.Time {
	seen := c.started
	if node.CreationTimestamp.After(seen) {
		seen = node.CreationTimestamp.Time
	}
	if lease, err := c.leases.Leases(corev1.NamespaceNodeLease).Get(node.Name); err == nil {
		seen = laterLease(seen, lease)
	}
	for _, cond := range node.Status.Conditions {
		if cond.Type == corev1.NodeReady && cond.LastHeartbeatTime.After(seen) {
			seen = cond.LastHeartbeatTime.Time
		}
	}
	return seen
}

func laterLease(t time.Time, lease *coordinationv1.Lease) time.Time {
	if r := lease.Spec.RenewTime; r != nil && r.After(t) {
		return r.Time
	}
	return t
}

func readyStatus(node *corev1.Node) corev1.ConditionStatus {
	for _, cond := range node.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status
		}
	}
	return corev1.ConditionUnknown
}

// monitor marks a silent node Unknown and sets the taints its Ready
// condition calls for; it returns the node as it now is.
func (c *Controller) monitor(ctx context.Context, node *corev1.Node, now time.Time) (*corev1.Node, error) {
	if now.Sub(c.lastSeen(node)) > c.opts.GracePeriod && readyStatus(node) != corev1.ConditionUnknown {
		updated := node.DeepCopy()
		found := false
		for i := range updated.Status.Conditions {
			cond := &updated.Status.Conditions[i]
			switch cond.Type {
			case corev1.NodeReady, corev1.NodeMemoryPressure, corev1.NodeDiskPressure, corev1.NodePIDPressure:
				if cond.Type == corev1.NodeReady {
					found = true
				}
				cond.Status, cond.Reason, cond.Message = corev1.ConditionUnknown, "NodeStatusUnknown", "Kubelet stopped posting node status."
				cond.LastTransitionTime = metav1.NewTime(now)
			}
		}
		if !found {
			updated.Status.Conditions = append(updated.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionUnknown,
				Reason: "NodeStatusNeverUpdated", Message: "Kubelet never posted node status.", LastTransitionTime: metav1.NewTime(now)})
		}
		var err error
		if node, err = c.client.Nodes().UpdateStatus(ctx, updated, metav1.UpdateOptions{}); err != nil {
			return nil, fmt.Errorf("mark node %s unknown: %w", updated.Name, err)
		}
		c.recorder.Eventf(node, nil, corev1.EventTypeNormal, "NodeNotReady", "NodeNotReady", "Node %s status is now: NodeNotReady", node.Name)
		c.log.Info("node stopped renewing its lease", "node", node.Name)
	}
	var want []corev1.Taint
	switch readyStatus(node) {
	case corev1.ConditionUnknown:
		want = unreachableTaints
	case corev1.ConditionFalse:
		want = notReadyTaints
	}
	return c.setTaints(ctx, node, want, now)
}

// setTaints makes the node's health taints exactly want, keeping others.
func (c *Controller) setTaints(ctx context.Context, node *corev1.Node, want []corev1.Taint, now time.Time) (*corev1.Node, error) {
	isHealth := func(t corev1.Taint) bool {
		return t.Key == corev1.TaintNodeUnreachable || t.Key == corev1.TaintNodeNotReady
	}
	var kept, have []corev1.Taint
	for _, t := range node.Spec.Taints {
		if isHealth(t) {
			have = append(have, t)
		} else {
			kept = append(kept, t)
		}
	}
	same := len(have) == len(want)
	for i := 0; same && i < len(want); i++ {
		same = have[i].Key == want[i].Key && have[i].Effect == want[i].Effect
	}
	if same {
		return node, nil
	}
	updated := node.DeepCopy()
	updated.Spec.Taints = kept
	for _, t := range want {
		t.TimeAdded = &metav1.Time{Time: now}
		updated.Spec.Taints = append(updated.Spec.Taints, t)
	}
	return c.client.Nodes().Update(ctx, updated, metav1.UpdateOptions{})
}

// markNotReady takes a pod on an unreachable node out of service.
func (c *Controller) markNotReady(ctx context.Context, p *corev1.Pod) error {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionFalse {
			return nil
		}
	}
	patch := fmt.Sprintf(`{"status":{"conditions":[{"type":"Ready","status":"False","reason":"NodeNotReady","lastTransitionTime":%q}]}}`,
		c.opts.Clock.Now().UTC().Format(time.RFC3339))
	_, err := c.client.Pods(p.Namespace).Patch(ctx, p.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status")
	return err
}

// evictIfUntolerated deletes a pod whose tolerations of the node's
// NoExecute taints are missing or have run out.
func (c *Controller) evictIfUntolerated(ctx context.Context, node *corev1.Node, p *corev1.Pod, now time.Time) error {
	for i := range node.Spec.Taints {
		taint := &node.Spec.Taints[i]
		if taint.Effect != corev1.TaintEffectNoExecute {
			continue
		}
		deadline, tolerated := tolerationDeadline(p.Spec.Tolerations, taint, now)
		if tolerated && (deadline == nil || now.Before(*deadline)) {
			continue
		}
		// Marked first as Kubernetes' taint manager marks it, so that its
		// controller (a Job's pod failure policy) knows why it went.
		mark := fmt.Sprintf(`{"status":{"conditions":[{"type":%q,"status":"True","reason":"DeletionByTaintManager","message":"Taint manager: deleting due to NoExecute taint","lastTransitionTime":%q}]}}`,
			corev1.DisruptionTarget, now.UTC().Format(time.RFC3339))
		if _, err := c.client.Pods(p.Namespace).Patch(ctx, p.Name, types.StrategicMergePatchType, []byte(mark), metav1.PatchOptions{}, "status"); err != nil {
			if apierrors.IsNotFound(err) {
				return nil
			}
			return err
		}
		err := c.client.Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}})
		if err == nil {
			c.recorder.Eventf(p, nil, corev1.EventTypeNormal, "TaintManagerEviction", "Evict", "Marking for deletion Pod %s/%s", p.Namespace, p.Name)
			c.log.Info("evicted pod", "pod", p.Namespace+"/"+p.Name, "node", node.Name, "taint", taint.Key)
		}
		if apierrors.IsConflict(err) {
			return nil
		}
		return err
	}
	return nil
}

// tolerationDeadline is when the pod stops tolerating taint: never (nil)
// when a toleration has no tolerationSeconds, else the shortest.
func tolerationDeadline(tolerations []corev1.Toleration, taint *corev1.Taint, now time.Time) (*time.Time, bool) {
	added := now
	if taint.TimeAdded != nil {
		added = taint.TimeAdded.Time
	}
	var deadline *time.Time
	tolerated := false
	for i := range tolerations {
		t := &tolerations[i]
		if !corev1helpers.TolerationsTolerateTaint(klog.Background(), []corev1.Toleration{*t}, taint, false) {
			continue
		}
		tolerated = true
		if t.TolerationSeconds == nil {
			return nil, true
		}
		d := added.Add(time.Duration(max(*t.TolerationSeconds, 0)) * time.Second)
		if deadline == nil || d.Before(*deadline) {
			deadline = &d
		}
	}
	return deadline, tolerated
}
