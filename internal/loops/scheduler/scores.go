package scheduler

import (
	corev1 "k8s.io/api/core/v1"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"
)

// Weights of the scores, as kube-scheduler's default profile weighs its
// plugins: NodeResourcesFit 1, NodeResourcesBalancedAllocation 1,
// NodeAffinity 2, TaintToleration 3, PodTopologySpread 2.
const (
	weightLeastAllocated = 1
	weightBalanced       = 1
	weightNodeAffinity   = 2
	weightTaints         = 3
	weightSpread         = 2
	maxScore             = 100
)

// score rates each feasible node for the pod; higher is better.
func score(pc *podContext, feasible []*nodeInfo) []int64 {
	n := len(feasible)
	out := make([]int64, n)
	affinity := make([]int64, n)
	untolerated := make([]int64, n)
	sameOwner := make([]int64, n)
	var maxAffinity, maxUntolerated, maxOwner int64
	for i, ni := range feasible {
		cpu := fraction(ni.scoreCPU+pc.req.scoreCPU, ni.milliCPU)
		mem := fraction(ni.scoreMemory+pc.req.scoreMemory, ni.memory)
		least := int64((2 - cpu - mem) / 2 * maxScore)
		diff := cpu - mem
		if diff < 0 {
			diff = -diff
		}
		balanced := int64((1 - diff) * maxScore)
		out[i] = weightLeastAllocated*least + weightBalanced*balanced

		if pc.preferred != nil {
			affinity[i] = pc.preferred.Score(ni.node)
			maxAffinity = max(maxAffinity, affinity[i])
		}
		for _, t := range ni.node.Spec.Taints {
			if t.Effect == corev1.TaintEffectPreferNoSchedule &&
				!corev1helpers.TolerationsTolerateTaint(klog.Background(), pc.pod.Spec.Tolerations, &t, false) {
				untolerated[i]++
			}
		}
		maxUntolerated = max(maxUntolerated, untolerated[i])
		if pc.owner != "" {
			sameOwner[i] = int64(ni.owners[pc.owner])
			maxOwner = max(maxOwner, sameOwner[i])
		}
	}
	for i := range feasible {
		if maxAffinity > 0 {
			out[i] += weightNodeAffinity * affinity[i] * maxScore / maxAffinity
		}
		out[i] += weightTaints * reverse(untolerated[i], maxUntolerated)
		out[i] += weightSpread * reverse(sameOwner[i], maxOwner)
	}
	return out
}

// fraction of capacity used, capped at 1; a node with no capacity is full.
func fraction(used, capacity int64) float64 {
	if capacity <= 0 {
		return 1
	}
	f := float64(used) / float64(capacity)
	return min(f, 1)
}

// reverse maps a count where fewer is better onto 0..maxScore.
func reverse(count, highest int64) int64 {
	if highest == 0 {
		return maxScore
	}
	return (highest - count) * maxScore / highest
}
