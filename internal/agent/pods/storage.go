package pods

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/containerd/containerd/errdefs"
	"github.com/orch-dev/orch/internal/agent/eviction"
	corev1 "k8s.io/api/core/v1"
)

// podStorage measures the pod's local ephemeral storage. It walks the
// directories, so it runs only for pods with storage limits, or for all
// pods when the node is short of disk.
func (m *Manager) podStorage(ctx context.Context, st *podState) (eviction.Storage, error) {
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
	u := eviction.Storage{Pod: pod, Containers: map[string]eviction.Use{}, EmptyDirs: map[string]eviction.Use{}}
	cctx := m.ctx(ctx)
	for _, c := range containers {
		use, err := m.writableLayer(cctx, c.id)
		if err != nil {
			return u, err
		}
		logs, err := eviction.DiskUse(ctx, filepath.Dir(m.logPath(string(pod.UID), c.name, 0)))
		if err != nil {
			return u, err
		}
		use.Add(logs)
		u.Containers[c.name] = use
		u.Total.Add(use)
	}
	for _, v := range pod.Spec.Volumes {
		if v.EmptyDir == nil || v.EmptyDir.Medium == corev1.StorageMediumMemory {
			continue
		}
		use, err := eviction.DiskUse(ctx, filepath.Join(m.volumesDir(string(pod.UID)), v.Name))
		if err != nil {
			return u, err
		}
		u.EmptyDirs[v.Name] = use
		u.Total.Add(use)
	}
	return u, nil
}

// writableLayer is what a container wrote to its root filesystem: its
// snapshot's usage, which containerd's snapshotter measures.
func (m *Manager) writableLayer(ctx context.Context, id string) (eviction.Use, error) {
	u, err := m.ctr.SnapshotUsage(ctx, id)
	if errdefs.IsNotFound(err) {
		return eviction.Use{}, nil // being replaced or removed
	} else if err != nil {
		return eviction.Use{}, fmt.Errorf("writable layer of %s: %w", id, err)
	}
	return eviction.Use{Bytes: u.Size, Inodes: u.Inodes}, nil
}

// evictOverStorageLimits evicts every pod over one of its storage limits
// and says whether it evicted any.
func (m *Manager) evictOverStorageLimits(ctx context.Context) bool {
	var limited []*podState
	m.mu.Lock()
	for _, st := range m.running {
		if st.pod != nil && !st.evicted && eviction.HasStorageLimits(st.pod) {
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
		if message := eviction.StorageLimitExceeded(u.Pod, u); message != "" {
			m.evict(st, message, false)
			evicted = true
		}
	}
	return evicted
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
	var pods []*podState
	var candidates []eviction.Candidate
	for _, st := range all {
		u, err := m.podStorage(ctx, st)
		if err != nil {
			m.log.Debug("measuring a pod's storage", "pod", st.key(), "err", err)
			continue
		}
		pods = append(pods, st)
		candidates = append(candidates, eviction.DiskCandidate(u, res))
	}
	if i := eviction.First(candidates); i >= 0 {
		m.evict(pods[i], eviction.DiskMessage(candidates[i], res, threshold, available), true)
	}
	return nil
}
