package scheduler

import (
	"context"
	"fmt"
	"math"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
)

// Preemption, as kube-scheduler's DefaultPreemption: a pod that fits
// nowhere may have pods of lower priority evicted from one node to make
// room. On each node, every lower-priority pod is taken away and the pod
// must then fit; the most important of them are given back one by one
// while it still fits (those a disruption budget protects first). Of the
// nodes where that works, the one chosen breaks the fewest budgets, then
// evicts the lowest highest priority, the lowest sum of priorities, the
// fewest pods, the most recently started. The pod is nominated to that
// node, whose room is kept for it while the victims end gracefully.

func priorityOf(pod *corev1.Pod) int32 {
	if pod.Spec.Priority != nil {
		return *pod.Spec.Priority
	}
	return 0
}

// candidate is a node where preemption lets the pod fit.
type candidate struct {
	node       string
	victims    []*placed
	violations int
}

// budget is a disruption budget with its selector parsed.
type budget struct {
	*policyv1.PodDisruptionBudget
	selector labels.Selector
}

func parseBudgets(list []*policyv1.PodDisruptionBudget) []budget {
	out := make([]budget, 0, len(list))
	for _, p := range list {
		// An invalid selector selects nothing.
		if sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector); err == nil {
			out = append(out, budget{p, sel})
		}
	}
	return out
}

// budgetsLeft counts, for the disruption budgets in force, how many more
// disruptions each allows.
type budgetsLeft struct {
	budgets []budget
	left    []int32
}

func newBudgetsLeft(budgets []budget) *budgetsLeft {
	b := &budgetsLeft{budgets: budgets, left: make([]int32, len(budgets))}
	for i, p := range budgets {
		b.left[i] = p.Status.DisruptionsAllowed
	}
	return b
}

// take counts pod's eviction against its budgets and reports whether one
// of them did not allow it; pods the budget already counts as disrupted
// are free.
func (b *budgetsLeft) take(pod *corev1.Pod) bool {
	violates := false
	for i, p := range b.budgets {
		if p.Namespace != pod.Namespace || !p.selector.Matches(labels.Set(pod.Labels)) {
			continue
		}
		if _, counted := p.Status.DisruptedPods[pod.Name]; counted {
			continue
		}
		b.left[i]--
		if b.left[i] < 0 {
			violates = true
		}
	}
	return violates
}

// candidatesWanted is how many nodes where preemption works are enough to
// choose from, as kube-scheduler's (10% of the nodes, at least 100).
func candidatesWanted(nodes int) int { return max(nodes/10, 100) }

// moreImportant orders victims: higher priority first, then the one
// running longer.
func moreImportant(a, b *corev1.Pod) bool {
	pa, pb := priorityOf(a), priorityOf(b)
	if pa != pb {
		return pa > pb
	}
	return startTime(a).Before(startTime(b))
}

func startTime(p *corev1.Pod) time.Time {
	if p.Status.StartTime != nil {
		return p.Status.StartTime.Time
	}
	return p.CreationTimestamp.Time
}

// findVictims looks for the node and pods to preempt for pc; ok is false
// when no preemption helps. The caller holds no lock.
func (c *cache) findVictims(pc *podContext, list []*policyv1.PodDisruptionBudget) (best candidate, ok bool) {
	budgets := parseBudgets(list)
	c.mu.Lock()
	defer c.mu.Unlock()
	prio := priorityOf(pc.pod)
	var candidates []candidate
	var scratch []string
	n := len(c.order)
	// The search starts where the last one stopped, as kube-scheduler
	// starts at a random node: the same nodes are not always preempted.
	start := c.preemptFrom % max(n, 1)
	for i := 0; i < n && len(candidates) < candidatesWanted(n); i++ {
		name := c.order[(start+i)%n]
		c.preemptFrom = start + i + 1
		ni := c.nodes[name]
		var lower []*placed
		for uid := range ni.pods {
			if p := c.placed[uid]; p != nil && p.pod.UID != pc.pod.UID && priorityOf(p.pod) < prio {
				lower = append(lower, p)
			}
		}
		if len(lower) == 0 {
			continue
		}
		for _, p := range lower {
			c.unplaceLocked(p)
		}
		if scratch = c.filter(pc, ni, scratch[:0]); len(scratch) > 0 {
			for _, p := range lower {
				c.replaceLocked(p)
			}
			continue
		}
		sort.Slice(lower, func(i, j int) bool { return moreImportant(lower[i].pod, lower[j].pod) })
		left := newBudgetsLeft(budgets)
		var protected, free []*placed
		for _, p := range lower {
			if left.take(p.pod) {
				protected = append(protected, p)
			} else {
				free = append(free, p)
			}
		}
		cand := candidate{node: name}
		reprieve := func(p *placed) bool {
			c.replaceLocked(p)
			if scratch = c.filter(pc, ni, scratch[:0]); len(scratch) == 0 {
				return true
			}
			c.unplaceLocked(p)
			cand.victims = append(cand.victims, p)
			return false
		}
		for _, p := range protected {
			if !reprieve(p) {
				cand.violations++
			}
		}
		for _, p := range free {
			reprieve(p)
		}
		for _, p := range cand.victims {
			c.replaceLocked(p)
		}
		candidates = append(candidates, cand)
	}
	if len(candidates) == 0 {
		return candidate{}, false
	}
	return pickCandidate(candidates), true
}

// unplaceLocked and replaceLocked take a placed pod off its node and put
// it back, for a simulation under the cache's lock.
func (c *cache) unplaceLocked(p *placed) {
	if ni := c.nodes[p.node]; ni != nil {
		ni.add(p, -1)
	}
	delete(c.antiPods, p.pod.UID)
}

func (c *cache) replaceLocked(p *placed) {
	if ni := c.nodes[p.node]; ni != nil {
		ni.add(p, 1)
	}
	if len(p.anti) > 0 {
		c.antiPods[p.pod.UID] = p
	}
}

// pickCandidate is kube-scheduler's pickOneNodeForPreemption.
func pickCandidate(cands []candidate) candidate {
	type key struct {
		violations int
		highest    int32
		sum        int64
		count      int
		latest     time.Time
	}
	keyOf := func(c candidate) key {
		k := key{violations: c.violations, highest: math.MinInt32, count: len(c.victims)}
		for _, v := range c.victims {
			p := priorityOf(v.pod)
			// Shifted so that negative priorities still add up in order.
			k.sum += int64(p) + math.MaxInt32 + 1
			k.highest = max(k.highest, p)
		}
		for _, v := range c.victims {
			if priorityOf(v.pod) == k.highest && startTime(v.pod).After(k.latest) {
				k.latest = startTime(v.pod)
			}
		}
		return k
	}
	best, bk := cands[0], keyOf(cands[0])
	for _, c := range cands[1:] {
		k := keyOf(c)
		switch {
		case k.violations != bk.violations:
			if k.violations > bk.violations {
				continue
			}
		case k.highest != bk.highest:
			if k.highest > bk.highest {
				continue
			}
		case k.sum != bk.sum:
			if k.sum > bk.sum {
				continue
			}
		case k.count != bk.count:
			if k.count > bk.count {
				continue
			}
		case !k.latest.After(bk.latest):
			continue
		}
		best, bk = c, k
	}
	return best
}

// waitingForVictims: the pod is already nominated to a node where pods of
// lower priority are on their way out; it waits for them rather than
// preempting more (kube-scheduler's PodEligibleToPreemptOthers).
func (c *cache) waitingForVictims(pod *corev1.Pod) bool {
	node := pod.Status.NominatedNodeName
	if node == "" {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ni := c.nodes[node]
	if ni == nil {
		return false
	}
	for _, p := range ni.pods {
		if p.DeletionTimestamp != nil && priorityOf(p) < priorityOf(pod) {
			return true
		}
	}
	return false
}

// preempt evicts the victims chosen for pod and nominates it to their
// node; it reports whether it did (or waits for victims it chose before).
func (s *Scheduler) preempt(ctx context.Context, pc *podContext) bool {
	pod := pc.pod
	if pod.Spec.PreemptionPolicy != nil && *pod.Spec.PreemptionPolicy == corev1.PreemptNever {
		return false
	}
	if s.cache.waitingForVictims(pod) {
		return true
	}
	var budgets []*policyv1.PodDisruptionBudget
	if s.budgets != nil {
		budgets, _ = s.budgets.List(labels.Everything())
	}
	cand, ok := s.cache.findVictims(pc, budgets)
	if !ok {
		return false
	}
	for _, v := range cand.victims {
		victim := v.pod
		mark := fmt.Sprintf(`{"status":{"conditions":[{"type":%q,"status":"True","reason":"PreemptionByScheduler","message":"%s: preempting to accommodate a higher priority pod","lastTransitionTime":%q}]}}`,
			corev1.DisruptionTarget, Name, metav1.Now().UTC().Format(time.RFC3339))
		if _, err := s.client.Pods(victim.Namespace).Patch(ctx, victim.Name, types.StrategicMergePatchType, []byte(mark), metav1.PatchOptions{}, "status"); err != nil && !apierrors.IsNotFound(err) {
			s.log.Warn("marking a preempted pod", "pod", key(victim), "err", err)
			return false
		}
		err := s.client.Pods(victim.Namespace).Delete(ctx, victim.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &victim.UID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			s.log.Warn("preempting a pod", "pod", key(victim), "err", err)
			return false
		}
		s.recorder.Eventf(victim, pod, corev1.EventTypeNormal, "Preempted", "Preempting", "Preempted by pod %v on node %v", pod.UID, cand.node)
	}
	patch := fmt.Sprintf(`{"status":{"nominatedNodeName":%q}}`, cand.node)
	if _, err := s.client.Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil && !apierrors.IsNotFound(err) {
		s.log.Warn("nominating a preempting pod", "pod", key(pod), "err", err)
	}
	s.cache.nominate(pod, cand.node)
	s.log.Info("preempted", "pod", key(pod), "node", cand.node, "victims", len(cand.victims))
	return true
}
