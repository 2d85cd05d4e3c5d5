package scheduler

import (
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"
)

// Why a node does not fit, worded as kube-scheduler words it, because
// users read these in `kubectl describe pod`.
const (
	reasonUnschedulable = "node(s) were unschedulable"
	reasonNodeAffinity  = "node(s) didn't match Pod's node affinity/selector"
	reasonHostPorts     = "node(s) didn't have free ports for the requested pod ports"
	reasonAntiAffinity  = "node(s) didn't match pod anti-affinity rules"
	reasonTooManyPods   = "Too many pods"
)

// podContext is what filtering and scoring need of the pod being placed,
// computed once per scheduling attempt.
type podContext struct {
	pod       *corev1.Pod
	req       requests
	required  nodeaffinity.RequiredNodeAffinity
	preferred *nodeaffinity.PreferredSchedulingTerms
	anti      []antiAffinityTerm
	owner     types.UID
	volumes   *podVolumes
}

// antiAffinityTerm is a required pod anti-affinity term, parsed.
type antiAffinityTerm struct {
	topologyKey string
	selector    labels.Selector
	namespaces  sets.Set[string]
}

func newPodContext(pod *corev1.Pod) (*podContext, error) {
	pc := &podContext{pod: pod, req: requestsOf(pod), required: nodeaffinity.GetRequiredNodeAffinity(pod), owner: controllerUID(pod)}
	if a := pod.Spec.Affinity; a != nil && a.NodeAffinity != nil {
		terms, err := nodeaffinity.NewPreferredSchedulingTerms(a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution)
		if err != nil {
			return nil, fmt.Errorf("preferred node affinity: %w", err)
		}
		pc.preferred = terms
	}
	anti, err := antiAffinityTerms(pod)
	if err != nil {
		return nil, err
	}
	pc.anti = anti
	return pc, nil
}

func antiAffinityTerms(pod *corev1.Pod) ([]antiAffinityTerm, error) {
	a := pod.Spec.Affinity
	if a == nil || a.PodAntiAffinity == nil {
		return nil, nil
	}
	var out []antiAffinityTerm
	for _, t := range a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
		sel, err := metav1.LabelSelectorAsSelector(t.LabelSelector)
		if err != nil {
			return nil, fmt.Errorf("pod anti-affinity selector: %w", err)
		}
		ns := sets.New(t.Namespaces...)
		if ns.Len() == 0 && t.NamespaceSelector == nil {
			ns.Insert(pod.Namespace)
		}
		out = append(out, antiAffinityTerm{topologyKey: t.TopologyKey, selector: sel, namespaces: ns})
	}
	return out, nil
}

// matches reports whether the term selects pod.
func (t antiAffinityTerm) matches(pod *corev1.Pod) bool {
	return (t.namespaces.Len() == 0 || t.namespaces.Has(pod.Namespace)) && t.selector.Matches(labels.Set(pod.Labels))
}

// conditionTaints are the taints Kubernetes puts on a node for its
// conditions (TaintNodesByCondition); the scheduler treats a node with the
// condition as carrying the taint even before a controller adds it.
var conditionTaints = []struct {
	condition corev1.NodeConditionType
	bad       corev1.ConditionStatus
	taint     corev1.Taint
}{
	{corev1.NodeMemoryPressure, corev1.ConditionTrue, corev1.Taint{Key: corev1.TaintNodeMemoryPressure, Effect: corev1.TaintEffectNoSchedule}},
	{corev1.NodeDiskPressure, corev1.ConditionTrue, corev1.Taint{Key: corev1.TaintNodeDiskPressure, Effect: corev1.TaintEffectNoSchedule}},
	{corev1.NodePIDPressure, corev1.ConditionTrue, corev1.Taint{Key: corev1.TaintNodePIDPressure, Effect: corev1.TaintEffectNoSchedule}},
	{corev1.NodeNetworkUnavailable, corev1.ConditionTrue, corev1.Taint{Key: corev1.TaintNodeNetworkUnavailable, Effect: corev1.TaintEffectNoSchedule}},
}

// effectiveTaints are the node's taints plus those its conditions imply.
func effectiveTaints(node *corev1.Node) []corev1.Taint {
	taints := node.Spec.Taints
	has := func(key string) bool {
		for _, t := range taints {
			if t.Key == key {
				return true
			}
		}
		return false
	}
	var extra []corev1.Taint
	ready := false
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			ready = c.Status == corev1.ConditionTrue
		}
		for _, ct := range conditionTaints {
			if c.Type == ct.condition && c.Status == ct.bad && !has(ct.taint.Key) {
				extra = append(extra, ct.taint)
			}
		}
	}
	if !ready && !has(corev1.TaintNodeNotReady) && !has(corev1.TaintNodeUnreachable) {
		extra = append(extra, corev1.Taint{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoSchedule})
	}
	if len(extra) == 0 {
		return taints
	}
	return append(append([]corev1.Taint{}, taints...), extra...)
}

func isScheduleTaint(t *corev1.Taint) bool {
	return t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute
}

var unschedulableTaint = corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule}

// filter appends to reasons why ni cannot take the pod; none means it fits.
// The checks run in the order of kube-scheduler's filter plugins, and, as
// there, the first that fails decides the node's reason (all resource
// shortfalls are reported together).
func (c *cache) filter(pc *podContext, ni *nodeInfo, reasons []string) []string {
	node, pod := ni.node, pc.pod
	if node.Spec.Unschedulable && !corev1helpers.TolerationsTolerateTaint(klog.Background(), pod.Spec.Tolerations, &unschedulableTaint, false) {
		return append(reasons, reasonUnschedulable)
	}
	if taint, found := corev1helpers.FindMatchingUntoleratedTaint(klog.Background(), effectiveTaints(node), pod.Spec.Tolerations, isScheduleTaint, false); found {
		return append(reasons, fmt.Sprintf("node(s) had untolerated taint {%s: %s}", taint.Key, taint.Value))
	}
	if ok, err := pc.required.Match(node); err != nil || !ok {
		return append(reasons, reasonNodeAffinity)
	}
	for _, want := range pc.req.hostPorts {
		for used := range ni.hostPorts {
			if used.port == want.port && used.protocol == want.protocol &&
				(used.ip == want.ip || used.ip == "0.0.0.0" || want.ip == "0.0.0.0") {
				return append(reasons, reasonHostPorts)
			}
		}
	}
	before := len(reasons)
	if ni.podCount+1 > ni.maxPods {
		reasons = append(reasons, reasonTooManyPods)
	}
	if r := pc.req.milliCPU; r > 0 && r > ni.milliCPU-ni.usedCPU {
		reasons = append(reasons, "Insufficient cpu")
	}
	if r := pc.req.memory; r > 0 && r > ni.memory-ni.usedMemory {
		reasons = append(reasons, "Insufficient memory")
	}
	if r := pc.req.ephemeral; r > 0 && r > ni.ephemeral-ni.usedEphemeral {
		reasons = append(reasons, "Insufficient ephemeral-storage")
	}
	if len(pc.req.scalar) > 0 {
		var short []string
		for name, r := range pc.req.scalar {
			if r > 0 && r > ni.scalar[name]-ni.usedScalar[name] {
				short = append(short, "Insufficient "+string(name))
			}
		}
		sort.Strings(short)
		reasons = append(reasons, short...)
	}
	if len(reasons) > before {
		return reasons
	}
	if r := pc.volumes.volumeReason(node); r != "" {
		return append(reasons, r)
	}
	if c.violatesAntiAffinity(pc, ni) {
		return append(reasons, reasonAntiAffinity)
	}
	return reasons
}

// violatesAntiAffinity checks required pod anti-affinity both ways: the
// pod's own terms against the pods in the node's topology domain, and the
// terms of pods already placed against the pod.
func (c *cache) violatesAntiAffinity(pc *podContext, ni *nodeInfo) bool {
	for _, t := range pc.anti {
		value, ok := ni.node.Labels[t.topologyKey]
		if !ok {
			continue
		}
		for _, other := range c.nodes {
			if other.node.Labels[t.topologyKey] != value {
				continue
			}
			for _, p := range other.pods {
				if p.UID != pc.pod.UID && t.matches(p) {
					return true
				}
			}
		}
	}
	for _, p := range c.antiPods {
		other := c.nodes[p.node]
		if other == nil {
			continue
		}
		for _, t := range p.anti {
			value, ok := other.node.Labels[t.topologyKey]
			if ok && ni.node.Labels[t.topologyKey] == value && t.matches(pc.pod) {
				return true
			}
		}
	}
	return false
}
