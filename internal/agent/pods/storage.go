package pods

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/continuity/fs"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

// storageUse is what something keeps on the node's disk.
type storageUse struct{ bytes, inodes int64 }

func (u *storageUse) add(v storageUse) { u.bytes, u.inodes = u.bytes+v.bytes, u.inodes+v.inodes }

// podStorage is a pod's local ephemeral storage, counted as the kubelet
// counts it: each container's writable layer and logs, and the pod's
// emptyDirs on disk (those in memory are held to their size by tmpfs).
type podStorage struct {
	// pod is the pod as it was measured.
	pod        *corev1.Pod
	containers map[string]storageUse
	emptyDirs  map[string]storageUse
	total      storageUse
}

// podStorage measures the pod's local ephemeral storage. It walks the
// directories, so it runs only for pods with storage limits, or for all
// pods when the node is short of disk.
func (m *Manager) podStorage(ctx context.Context, st *podState) (podStorage, error) {
	type container struct{ name, id string }
	var containers []container
	m.mu.Lock()
	pod := st.pod
	for _, cs := range st.all() {
		if cs.created {
			containers = append(containers, container{cs.name, cs.id})
		}
	}
	m.mu.Unlock()
	u := podStorage{pod: pod, containers: map[string]storageUse{}, emptyDirs: map[string]storageUse{}}
	cctx := m.ctx(ctx)
	for _, c := range containers {
		use, err := m.writableLayer(cctx, c.id)
		if err != nil {
			return u, err
		}
		logs, err := diskUse(ctx, filepath.Dir(m.logPath(string(pod.UID), c.name, 0)))
		if err != nil {
			return u, err
		}
		use.add(logs)
		u.containers[c.name] = use
		u.total.add(use)
	}
	for _, v := range pod.Spec.Volumes {
		if v.EmptyDir == nil || v.EmptyDir.Medium == corev1.StorageMediumMemory {
			continue
		}
		use, err := diskUse(ctx, filepath.Join(m.volumesDir(string(pod.UID)), v.Name))
		if err != nil {
			return u, err
		}
		u.emptyDirs[v.Name] = use
		u.total.add(use)
	}
	return u, nil
}

// writableLayer is what a container wrote to its root filesystem: its
// snapshot's usage, which containerd's snapshotter measures.
func (m *Manager) writableLayer(ctx context.Context, id string) (storageUse, error) {
	u, err := m.ctr.SnapshotUsage(ctx, id)
	if errdefs.IsNotFound(err) {
		return storageUse{}, nil // being replaced or removed
	} else if err != nil {
		return storageUse{}, fmt.Errorf("writable layer of %s: %w", id, err)
	}
	return storageUse{u.Size, u.Inodes}, nil
}

// diskUse is what dir holds, as du counts it; nothing when it is gone.
func diskUse(ctx context.Context, dir string) (storageUse, error) {
	if _, err := os.Lstat(dir); os.IsNotExist(err) {
		return storageUse{}, nil
	}
	u, err := fs.DiskUsage(ctx, dir)
	if err != nil {
		return storageUse{}, fmt.Errorf("disk usage of %s: %w", dir, err)
	}
	return storageUse{u.Size, u.Inodes}, nil
}

// hasStorageLimits says whether the pod limits its local ephemeral
// storage anywhere.
func hasStorageLimits(pod *corev1.Pod) bool {
	if _, ok := podStorageLimit(pod); ok {
		return true
	}
	for _, v := range pod.Spec.Volumes {
		if v.EmptyDir != nil && v.EmptyDir.Medium != corev1.StorageMediumMemory && v.EmptyDir.SizeLimit != nil && v.EmptyDir.SizeLimit.Sign() > 0 {
			return true
		}
	}
	return false
}

// podStorageLimit is the pod's ephemeral-storage limit as Kubernetes
// sums it: its containers' limits, or an init container's when that is
// larger.
func podStorageLimit(pod *corev1.Pod) (resource.Quantity, bool) {
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

// storageLimitExceeded is the kubelet's message when the pod is over one
// of its storage limits, checked in the kubelet's order: an emptyDir's
// sizeLimit, the pod's total, one container's limit (its writable layer
// and logs). It is empty when the pod is within them.
func storageLimitExceeded(pod *corev1.Pod, u podStorage) string {
	for _, v := range pod.Spec.Volumes {
		if v.EmptyDir == nil || v.EmptyDir.SizeLimit == nil || v.EmptyDir.SizeLimit.Sign() <= 0 {
			continue
		}
		if used, ok := u.emptyDirs[v.Name]; ok && used.bytes > v.EmptyDir.SizeLimit.Value() {
			return fmt.Sprintf("Usage of EmptyDir volume %q exceeds the limit %q. ", v.Name, v.EmptyDir.SizeLimit.String())
		}
	}
	if limit, ok := podStorageLimit(pod); ok && u.total.bytes > limit.Value() {
		return fmt.Sprintf("Pod ephemeral local storage usage exceeds the total limit of containers %s. ", limit.String())
	}
	for _, c := range pod.Spec.Containers {
		limit, ok := c.Resources.Limits[corev1.ResourceEphemeralStorage]
		if !ok || limit.IsZero() {
			continue
		}
		if used, ok := u.containers[c.Name]; ok && used.bytes > limit.Value() {
			return fmt.Sprintf("Container %s exceeded its local ephemeral storage limit %q. ", c.Name, limit.String())
		}
	}
	return ""
}

// evictOverStorageLimits evicts every pod over one of its storage limits
// and says whether it evicted any.
func (m *Manager) evictOverStorageLimits(ctx context.Context) bool {
	var limited []*podState
	m.mu.Lock()
	for _, st := range m.running {
		if st.pod != nil && !st.evicted && hasStorageLimits(st.pod) {
			limited = append(limited, st)
		}
	}
	m.mu.Unlock()
	evicted := false
	for _, st := range limited {
		u, err := m.podStorage(ctx, st)
		if err != nil {
			m.log.Debug("measuring a pod's storage", "pod", st.key(), "err", err)
			continue
		}
		if message := storageLimitExceeded(u.pod, u); message != "" {
			m.evict(st, message, false)
			evicted = true
		}
	}
	return evicted
}

// DiskPressure is the resource the node's filesystem is short of, if any:
// "ephemeral-storage" under nodefs.available, "inodes" under
// nodefs.inodesFree. threshold and available are in that resource's unit.
func (e Eviction) DiskPressure(f Filesystem) (res corev1.ResourceName, threshold, available int64) {
	if min := int64(e.NodeFSAvailableMin * float64(f.Size)); f.Size > 0 && f.Available < min {
		return corev1.ResourceEphemeralStorage, min, f.Available
	}
	if min := int64(e.NodeFSInodesFreeMin * float64(f.Inodes)); f.Inodes > 0 && f.InodesFree < min {
		return "inodes", min, f.InodesFree
	}
	return "", 0, 0
}

// diskCandidate is a pod's disk use against its requests.
type diskCandidate struct {
	st                              *podState
	use, requests                   int64
	priority                        int32
	hungriest                       string
	hungriestUse, hungriestRequests int64
}

// evictForDisk, under disk pressure, first removes every unused image;
// if the node is still short, it evicts the pod the kubelet would pick:
// one using more than it requested before one that does not, then the
// lower priority, then the one furthest over its requests.
func (m *Manager) evictForDisk(ctx context.Context) error {
	e := m.cfg.Eviction
	f, err := e.NodeFS()
	if err != nil {
		return err
	}
	res, _, _ := e.DiskPressure(f)
	if res == "" {
		return nil
	}
	m.reclaiming(res)
	removed, err := m.collectImages(ctx, true)
	if err != nil {
		m.log.Warn("reclaiming disk from unused images", "err", err)
	}
	if f, err = e.NodeFS(); err != nil {
		return err
	}
	res, threshold, available := e.DiskPressure(f)
	if res == "" {
		m.log.Info("disk pressure relieved without evicting pods", "imagesRemoved", len(removed))
		return nil
	}
	var all []*podState
	m.mu.Lock()
	for _, st := range m.running {
		if st.pod != nil && !st.evicted {
			all = append(all, st)
		}
	}
	m.mu.Unlock()
	var candidates []diskCandidate
	for _, st := range all {
		u, err := m.podStorage(ctx, st)
		if err != nil {
			m.log.Debug("measuring a pod's storage", "pod", st.key(), "err", err)
			continue
		}
		candidates = append(candidates, rankDisk(st, u, res))
	}
	if len(candidates) == 0 {
		return nil
	}
	slices.SortFunc(candidates, func(a, b diskCandidate) int {
		return evictFirst(rank{a.use, a.requests, a.priority}, rank{b.use, b.requests, b.priority})
	})
	c := candidates[0]
	var message string
	if res == corev1.ResourceEphemeralStorage {
		message = fmt.Sprintf("The node was low on resource: ephemeral-storage. Threshold quantity: %s, available: %dKi. Container %s was using %dKi, request is %s, has larger consumption of ephemeral-storage. ",
			resource.NewQuantity(threshold, resource.BinarySI), available>>10, c.hungriest, c.hungriestUse>>10, resource.NewQuantity(c.hungriestRequests, resource.BinarySI))
	} else {
		message = fmt.Sprintf("The node was low on resource: inodes. Threshold quantity: %d, available: %d. Container %s was using %d, request is 0, has larger consumption of inodes. ",
			threshold, available, c.hungriest, c.hungriestUse)
	}
	m.evict(c.st, message, true)
	return nil
}

// rankDisk is what the ranking reads of one pod: for ephemeral-storage
// its bytes against its containers' requests (its emptyDirs count for the
// pod, not a container), for inodes its inodes (which nothing requests).
func rankDisk(st *podState, u podStorage, res corev1.ResourceName) diskCandidate {
	pick := func(s storageUse) int64 {
		if res == corev1.ResourceEphemeralStorage {
			return s.bytes
		}
		return s.inodes
	}
	c := diskCandidate{st: st, use: pick(u.total), priority: ptr.Deref(u.pod.Spec.Priority, 0)}
	for _, ctr := range u.pod.Spec.Containers {
		var requested int64
		if res == corev1.ResourceEphemeralStorage {
			requested = ctr.Resources.Requests.StorageEphemeral().Value()
		}
		used := pick(u.containers[ctr.Name])
		c.requests += requested
		if c.hungriest == "" || used-requested > c.hungriestUse-c.hungriestRequests {
			c.hungriest, c.hungriestUse, c.hungriestRequests = ctr.Name, used, requested
		}
	}
	return c
}
