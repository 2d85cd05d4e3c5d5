// Package eviction is the node's eviction policy, as the kubelet's
// eviction manager has it: the thresholds (memory.available,
// nodefs.available, nodefs.inodesFree) and when the node is under them,
// a pod's local ephemeral storage against its limits, and which pod goes
// first (over its requests, then lower priority, then further over),
// with the kubelet's messages. Measuring the pods and stopping the one
// chosen is the pod manager's.
package eviction

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/containerd/continuity/fs"
	"github.com/orch-dev/orch/internal/agent/usage"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

// Config is when the node gives up pods to keep itself alive, as the
// kubelet's hard eviction thresholds do (memory.available<100Mi,
// nodefs.available<10%, nodefs.inodesFree<5%): on a 512 MB board with an
// SD card the alternative is the kernel's OOM killer choosing, the agent
// thrashing, or a full disk failing every write on the node. Pods over
// their own ephemeral-storage limits are evicted whatever the node has
// left.
type Config struct {
	// MemoryAvailableMin is the memory threshold (100 MiB).
	MemoryAvailableMin int64
	// MemoryAvailable reads the node's available memory; nil evicts
	// nothing for memory.
	MemoryAvailable func() (int64, error)
	// NodeFSAvailableMin and NodeFSInodesFreeMin are the thresholds of
	// the filesystem holding the data dir, as fractions of its size and
	// inodes (0.10 and 0.05).
	NodeFSAvailableMin, NodeFSInodesFreeMin float64
	// NodeFS reads that filesystem; nil evicts nothing for disk.
	NodeFS func() (Filesystem, error)
	// Every is how often the node is checked (10 s, the kubelet's
	// housekeeping interval).
	Every time.Duration
}

// Filesystem is what a filesystem has and has left, in bytes and inodes.
type Filesystem struct {
	Size, Available, Inodes, InodesFree int64
}

// WithDefaults fills in the kubelet's thresholds for those unset.
func (e Config) WithDefaults() Config {
	if e.MemoryAvailableMin == 0 {
		e.MemoryAvailableMin = 100 << 20
	}
	if e.NodeFSAvailableMin == 0 {
		e.NodeFSAvailableMin = 0.10
	}
	if e.NodeFSInodesFreeMin == 0 {
		e.NodeFSInodesFreeMin = 0.05
	}
	if e.Every == 0 {
		e.Every = 10 * time.Second
	}
	return e
}

// Use is what something keeps on the node's disk.
type Use struct{ Bytes, Inodes int64 }

// Add adds v to u.
func (u *Use) Add(v Use) { u.Bytes, u.Inodes = u.Bytes+v.Bytes, u.Inodes+v.Inodes }

// Storage is a pod's local ephemeral storage, counted as the kubelet
// counts it: each container's writable layer and logs, and the pod's
// emptyDirs on disk (those in memory are held to their size by tmpfs).
type Storage struct {
	// Pod is the pod as it was measured.
	Pod        *corev1.Pod
	Containers map[string]Use
	EmptyDirs  map[string]Use
	Total      Use
}

// DiskUse is what dir holds, as du counts it; nothing when it is gone.
func DiskUse(ctx context.Context, dir string) (Use, error) {
	if _, err := os.Lstat(dir); os.IsNotExist(err) {
		return Use{}, nil
	}
	u, err := fs.DiskUsage(ctx, dir)
	if err != nil {
		return Use{}, fmt.Errorf("disk usage of %s: %w", dir, err)
	}
	return Use{u.Size, u.Inodes}, nil
}

// HasStorageLimits says whether the pod limits its local ephemeral
// storage anywhere.
func HasStorageLimits(pod *corev1.Pod) bool {
	if _, ok := PodStorageLimit(pod); ok {
		return true
	}
	for _, v := range pod.Spec.Volumes {
		if v.EmptyDir != nil && v.EmptyDir.Medium != corev1.StorageMediumMemory && v.EmptyDir.SizeLimit != nil && v.EmptyDir.SizeLimit.Sign() > 0 {
			return true
		}
	}
	return false
}

// PodStorageLimit is the pod's ephemeral-storage limit as Kubernetes
// sums it: its containers' limits, or an init container's when that is
// larger.
func PodStorageLimit(pod *corev1.Pod) (resource.Quantity, bool) {
	var sum resource.Quantity
	found := false
	for _, c := range pod.Spec.Containers {
		if l, ok := c.Resources.Limits[corev1.ResourceEphemeralStorage]; ok {
			sum.Add(l)
			found = true
		}
	}
	for _, c := range pod.Spec.InitContainers {
		if l, ok := c.Resources.Limits[corev1.ResourceEphemeralStorage]; ok {
			if l.Cmp(sum) > 0 {
				sum = l.DeepCopy()
			}
			found = true
		}
	}
	return sum, found
}

// StorageLimitExceeded is the kubelet's message when the pod is over one
// of its storage limits, checked in the kubelet's order: an emptyDir's
// sizeLimit, the pod's total, one container's limit (its writable layer
// and logs). It is empty when the pod is within them.
func StorageLimitExceeded(pod *corev1.Pod, u Storage) string {
	for _, v := range pod.Spec.Volumes {
		if v.EmptyDir == nil || v.EmptyDir.SizeLimit == nil || v.EmptyDir.SizeLimit.Sign() <= 0 {
			continue
		}
		if used, ok := u.EmptyDirs[v.Name]; ok && used.Bytes > v.EmptyDir.SizeLimit.Value() {
			return fmt.Sprintf("Usage of EmptyDir volume %q exceeds the limit %q. ", v.Name, v.EmptyDir.SizeLimit.String())
		}
	}
	if limit, ok := PodStorageLimit(pod); ok && u.Total.Bytes > limit.Value() {
		return fmt.Sprintf("Pod ephemeral local storage usage exceeds the total limit of containers %s. ", limit.String())
	}
	for _, c := range pod.Spec.Containers {
		limit, ok := c.Resources.Limits[corev1.ResourceEphemeralStorage]
		if !ok || limit.IsZero() {
			continue
		}
		if used, ok := u.Containers[c.Name]; ok && used.Bytes > limit.Value() {
			return fmt.Sprintf("Container %s exceeded its local ephemeral storage limit %q. ", c.Name, limit.String())
		}
	}
	return ""
}

// DiskPressure is the resource the node's filesystem is short of, if any:
// "ephemeral-storage" under nodefs.available, "inodes" under
// nodefs.inodesFree. threshold and available are in that resource's unit.
func (e Config) DiskPressure(f Filesystem) (res corev1.ResourceName, threshold, available int64) {
	if min := int64(e.NodeFSAvailableMin * float64(f.Size)); f.Size > 0 && f.Available < min {
		return corev1.ResourceEphemeralStorage, min, f.Available
	}
	if min := int64(e.NodeFSInodesFreeMin * float64(f.Inodes)); f.Inodes > 0 && f.InodesFree < min {
		return "inodes", min, f.InodesFree
	}
	return "", 0, 0
}

// Candidate is a pod as the ranking sees it: its use of the resource the
// node is short of, what it requested of that, its priority, and the
// container furthest over its requests (which the message names).
type Candidate struct {
	Use, Requests                   int64
	Priority                        int32
	Hungriest                       string
	HungriestUse, HungriestRequests int64
}

// First is the index of the candidate the kubelet evicts first; -1 for
// none.
func First(candidates []Candidate) int {
	best := -1
	for i := range candidates {
		if best < 0 || evictFirst(candidates[i], candidates[best]) < 0 {
			best = i
		}
	}
	return best
}

// evictFirst orders a before b when the kubelet evicts it first: one
// using more than it requested before one that is not, then the lower
// priority, then the one further over its requests.
func evictFirst(a, b Candidate) int {
	if aOver, bOver := a.Use > a.Requests, b.Use > b.Requests; aOver != bOver {
		if aOver {
			return -1
		}
		return 1
	}
	if a.Priority != b.Priority {
		return cmp.Compare(a.Priority, b.Priority)
	}
	return cmp.Compare(b.Use-b.Requests, a.Use-a.Requests)
}

// DiskCandidate is what the ranking reads of one pod's storage: for
// ephemeral-storage its bytes against its containers' requests (its
// emptyDirs count for the pod, not a container), for inodes its inodes
// (which nothing requests).
func DiskCandidate(u Storage, res corev1.ResourceName) Candidate {
	pick := func(s Use) int64 {
		if res == corev1.ResourceEphemeralStorage {
			return s.Bytes
		}
		return s.Inodes
	}
	c := Candidate{Use: pick(u.Total), Priority: ptr.Deref(u.Pod.Spec.Priority, 0)}
	for _, ctr := range u.Pod.Spec.Containers {
		var requested int64
		if res == corev1.ResourceEphemeralStorage {
			requested = ctr.Resources.Requests.StorageEphemeral().Value()
		}
		used := pick(u.Containers[ctr.Name])
		c.Requests += requested
		if c.Hungriest == "" || used-requested > c.HungriestUse-c.HungriestRequests {
			c.Hungriest, c.HungriestUse, c.HungriestRequests = ctr.Name, used, requested
		}
	}
	return c
}

// MemoryCandidate is what the ranking reads of one pod's memory:
// workingSet gives each container's.
func MemoryCandidate(pod *corev1.Pod, workingSet func(container string) int64) Candidate {
	c := Candidate{Priority: ptr.Deref(pod.Spec.Priority, 0)}
	for _, ctr := range pod.Spec.Containers {
		used := workingSet(ctr.Name)
		requested := ctr.Resources.Requests.Memory().Value()
		c.Use += used
		c.Requests += requested
		if c.Hungriest == "" || used-requested > c.HungriestUse-c.HungriestRequests {
			c.Hungriest, c.HungriestUse, c.HungriestRequests = ctr.Name, used, requested
		}
	}
	return c
}

// MemoryMessage is the kubelet's message for a pod evicted for the
// node's memory.
func MemoryMessage(c Candidate, threshold, available int64) string {
	return fmt.Sprintf("The node was low on resource: memory. Threshold quantity: %s, available: %dKi. Container %s was using %dKi, request is %s, has larger consumption of memory. ",
		resource.NewQuantity(threshold, resource.BinarySI), available>>10, c.Hungriest, c.HungriestUse>>10, resource.NewQuantity(c.HungriestRequests, resource.BinarySI))
}

// DiskMessage is the kubelet's message for a pod evicted for the node's
// disk space or inodes.
func DiskMessage(c Candidate, res corev1.ResourceName, threshold, available int64) string {
	if res == corev1.ResourceEphemeralStorage {
		return fmt.Sprintf("The node was low on resource: ephemeral-storage. Threshold quantity: %s, available: %dKi. Container %s was using %dKi, request is %s, has larger consumption of ephemeral-storage. ",
			resource.NewQuantity(threshold, resource.BinarySI), available>>10, c.Hungriest, c.HungriestUse>>10, resource.NewQuantity(c.HungriestRequests, resource.BinarySI))
	}
	return fmt.Sprintf("The node was low on resource: inodes. Threshold quantity: %d, available: %d. Container %s was using %d, request is 0, has larger consumption of inodes. ",
		threshold, available, c.Hungriest, c.HungriestUse)
}

// WorkingSet is a container's memory in use less the page cache the
// kernel can drop, as the kubelet measures it, from its cgroup.
func WorkingSet(id string) int64 {
	s, _ := usage.Container(id)
	return int64(s.WorkingSetBytes)
}
