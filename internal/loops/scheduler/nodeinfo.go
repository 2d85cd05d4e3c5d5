package scheduler

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	resourcehelper "k8s.io/component-helpers/resource"
)

// Kubernetes scores a pod that requests nothing as if it asked for this
// much, so that empty pods still spread (filters use the real zero).
const (
	defaultScoreCPU    = 100               // millicores
	defaultScoreMemory = 200 * 1024 * 1024 // bytes
)

// requests is what a pod takes from a node, in the units filters compare.
type requests struct {
	milliCPU, memory, ephemeral int64
	// scalar are the other resources it requests (extended resources such
	// as nvidia.com/gpu, hugepages), in milli-units.
	scalar map[corev1.ResourceName]int64
	// scoreCPU and scoreMemory use the non-zero defaults.
	scoreCPU, scoreMemory int64
	hostPorts             []hostPort
}

type hostPort struct {
	ip       string
	protocol corev1.Protocol
	port     int32
}

// requestsOf is what a pod takes of its node: while a resize is not yet
// applied, the larger of what it asks and what its node gave it, as
// Kubernetes' scheduler counts it.
func requestsOf(pod *corev1.Pod) requests {
	list := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{UseStatusResources: true})
	r := requests{
		milliCPU:  list.Cpu().MilliValue(),
		memory:    list.Memory().Value(),
		ephemeral: list.StorageEphemeral().Value(),
	}
	for name, q := range list {
		if isScalar(name) {
			if r.scalar == nil {
				r.scalar = map[corev1.ResourceName]int64{}
			}
			r.scalar[name] = q.MilliValue()
		}
	}
	r.scoreCPU, r.scoreMemory = r.milliCPU, r.memory
	if _, ok := list[corev1.ResourceCPU]; !ok {
		r.scoreCPU = defaultScoreCPU
	}
	if _, ok := list[corev1.ResourceMemory]; !ok {
		r.scoreMemory = defaultScoreMemory
	}
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.HostPort > 0 {
				ip := p.HostIP
				if ip == "" {
					ip = "0.0.0.0"
				}
				r.hostPorts = append(r.hostPorts, hostPort{ip: ip, protocol: p.Protocol, port: p.HostPort})
			}
		}
	}
	return r
}

// isScalar: a resource counted by name, beyond CPU, memory, ephemeral
// storage and pods (kube-scheduler's ScalarResources).
func isScalar(name corev1.ResourceName) bool {
	switch name {
	case corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage, corev1.ResourcePods:
		return false
	}
	return true
}

// placed is a pod the scheduler counts on a node: bound, or assumed while
// its binding is in flight.
type placed struct {
	pod  *corev1.Pod
	req  requests
	node string
	anti []antiAffinityTerm
}

// nodeInfo is one node and what the pods placed on it take.
type nodeInfo struct {
	node *corev1.Node
	// allocatable
	milliCPU, memory, ephemeral, maxPods int64
	scalar                               map[corev1.ResourceName]int64
	// taken by placed pods
	usedCPU, usedMemory, usedEphemeral int64
	usedScalar                         map[corev1.ResourceName]int64
	scoreCPU, scoreMemory              int64
	podCount                           int64
	hostPorts                          map[hostPort]int
	pods                               map[types.UID]*corev1.Pod
	// owners counts the placed pods of each controller, for spreading.
	owners map[types.UID]int
}

func newNodeInfo(node *corev1.Node) *nodeInfo {
	ni := &nodeInfo{hostPorts: map[hostPort]int{}, pods: map[types.UID]*corev1.Pod{}, owners: map[types.UID]int{}, usedScalar: map[corev1.ResourceName]int64{}}
	ni.setNode(node)
	return ni
}

func (ni *nodeInfo) setNode(node *corev1.Node) {
	ni.node = node
	a := node.Status.Allocatable
	ni.milliCPU, ni.memory, ni.ephemeral, ni.maxPods = a.Cpu().MilliValue(), a.Memory().Value(), a.StorageEphemeral().Value(), a.Pods().Value()
	ni.scalar = map[corev1.ResourceName]int64{}
	for name, q := range a {
		if isScalar(name) {
			ni.scalar[name] = q.MilliValue()
		}
	}
}

func (ni *nodeInfo) add(p *placed, sign int64) {
	ni.usedCPU += sign * p.req.milliCPU
	ni.usedMemory += sign * p.req.memory
	ni.usedEphemeral += sign * p.req.ephemeral
	for name, v := range p.req.scalar {
		if ni.usedScalar[name] += sign * v; ni.usedScalar[name] == 0 {
			delete(ni.usedScalar, name)
		}
	}
	ni.scoreCPU += sign * p.req.scoreCPU
	ni.scoreMemory += sign * p.req.scoreMemory
	ni.podCount += sign
	for _, hp := range p.req.hostPorts {
		ni.hostPorts[hp] += int(sign)
		if ni.hostPorts[hp] <= 0 {
			delete(ni.hostPorts, hp)
		}
	}
	owner := controllerUID(p.pod)
	if sign > 0 {
		ni.pods[p.pod.UID] = p.pod
		if owner != "" {
			ni.owners[owner]++
		}
	} else {
		delete(ni.pods, p.pod.UID)
		if owner != "" {
			if ni.owners[owner]--; ni.owners[owner] <= 0 {
				delete(ni.owners, owner)
			}
		}
	}
}

func controllerUID(pod *corev1.Pod) types.UID {
	for _, ref := range pod.OwnerReferences {
		if ref.Controller != nil && *ref.Controller {
			return ref.UID
		}
	}
	return ""
}

// cache is the scheduler's view of the cluster: nodes and the pods placed
// on them, including pods it assumed onto a node before the binding was
// seen, so that a burst of pods never overcommits a node.
type cache struct {
	mu     sync.Mutex
	nodes  map[string]*nodeInfo
	order  []string // node names in a stable order, for round-robin
	placed map[types.UID]*placed
	// antiPods are the placed pods with required anti-affinity, which
	// every later pod is checked against.
	antiPods map[types.UID]*placed
	// nominated are pods that preempted others and wait for their node
	// (status.nominatedNodeName): the room is kept for them from pods of
	// lower priority.
	nominated map[types.UID]*placed
	// preemptFrom is where the next victim search starts in order.
	preemptFrom int
}

func newCache() *cache {
	return &cache{nodes: map[string]*nodeInfo{}, placed: map[types.UID]*placed{}, antiPods: map[types.UID]*placed{}, nominated: map[types.UID]*placed{}}
}

func (c *cache) setNode(node *corev1.Node) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ni := c.nodes[node.Name]; ni != nil {
		ni.setNode(node)
		return
	}
	ni := newNodeInfo(node)
	c.nodes[node.Name] = ni
	c.order = append(c.order, node.Name)
	// Pods seen before their node count as soon as it appears.
	for _, p := range c.placed {
		if p.node == node.Name {
			ni.add(p, 1)
		}
	}
}

func (c *cache) removeNode(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.nodes[name]; !ok {
		return
	}
	delete(c.nodes, name)
	for i, n := range c.order {
		if n == name {
			c.order = append(c.order[:i], c.order[i+1:]...)
			break
		}
	}
}

// place counts pod on node, replacing wherever it was counted before.
func (c *cache) place(pod *corev1.Pod, node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.placeLocked(pod, node)
}

func (c *cache) placeLocked(pod *corev1.Pod, node string) {
	c.forgetLocked(pod.UID)
	delete(c.nominated, pod.UID)
	p := &placed{pod: pod, req: requestsOf(pod), node: node}
	p.anti, _ = antiAffinityTerms(pod) // an invalid selector selects nothing
	c.placed[pod.UID] = p
	if len(p.anti) > 0 {
		c.antiPods[pod.UID] = p
	}
	if ni := c.nodes[node]; ni != nil {
		ni.add(p, 1)
	}
}

// forget stops counting pod (deleted, finished, or a binding that failed).
func (c *cache) forget(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgetLocked(uid)
}

func (c *cache) forgetLocked(uid types.UID) {
	p := c.placed[uid]
	if p == nil {
		return
	}
	delete(c.placed, uid)
	delete(c.antiPods, uid)
	if ni := c.nodes[p.node]; ni != nil {
		ni.add(p, -1)
	}
}

// nominate keeps room on node for pod, until it is placed or forgotten.
func (c *cache) nominate(pod *corev1.Pod, node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.placed[pod.UID] == nil {
		c.nominated[pod.UID] = &placed{pod: pod, req: requestsOf(pod), node: node}
	}
}

// unnominate forgets a nomination (the pod deleted, or bound).
func (c *cache) unnominate(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.nominated, uid)
}

// filterNominated is filter with the room nominated to ni for pods of at
// least pc's priority taken, as kube-scheduler adds nominated pods before
// filtering.
func (c *cache) filterNominated(pc *podContext, ni *nodeInfo, reasons []string) []string {
	var added []*placed
	prio := priorityOf(pc.pod)
	for uid, p := range c.nominated {
		if p.node == ni.node.Name && uid != pc.pod.UID && priorityOf(p.pod) >= prio {
			ni.add(p, 1)
			added = append(added, p)
		}
	}
	reasons = c.filter(pc, ni, reasons)
	for _, p := range added {
		ni.add(p, -1)
	}
	return reasons
}

func (c *cache) isPlaced(uid types.UID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.placed[uid] != nil
}

// nodeCount is how many nodes the cache holds.
func (c *cache) nodeCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.order)
}
