package pods

import (
	"context"
	"path/filepath"
	"sort"
	"syscall"
	"time"

	"github.com/orch-dev/orch/internal/agent/eviction"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

// Summary is the storage part of the kubelet's Summary API
// (/stats/summary): the node's filesystem (which holds the images too),
// and for each pod its containers' writable layers and logs, its volumes
// on the node's disk (emptyDirs and the claims' volumes, with the pvcRef
// that ties a volume's use to its claim) and its ephemeral storage. CPU
// and memory are not measured here.
func (m *Manager) Summary(ctx context.Context, node string, started time.Time) (*statsapi.Summary, error) {
	now := metav1.Now()
	fs, err := fsStats(m.cfg.DataDir, now)
	if err != nil {
		return nil, err
	}
	out := &statsapi.Summary{Node: statsapi.NodeStats{NodeName: node, StartTime: metav1.NewTime(started), Fs: fs,
		Runtime: &statsapi.RuntimeStats{ImageFs: fs, ContainerFs: fs}}}
	m.mu.Lock()
	var states []*podState
	for _, st := range m.running {
		if st.pod != nil {
			states = append(states, st)
		}
	}
	m.mu.Unlock()
	sort.Slice(states, func(i, j int) bool { return states[i].key() < states[j].key() })
	for _, st := range states {
		ps, err := m.podStats(ctx, st, fs, now)
		if err != nil {
			m.log.Debug("pod stats", "pod", st.key(), "err", err)
			continue
		}
		out.Pods = append(out.Pods, ps)
	}
	return out, nil
}

func (m *Manager) podStats(ctx context.Context, st *podState, nodeFs *statsapi.FsStats, now metav1.Time) (statsapi.PodStats, error) {
	storage, err := m.podStorage(ctx, st)
	if err != nil {
		return statsapi.PodStats{}, err
	}
	m.mu.Lock()
	pod, started, paths := st.pod, st.started, st.volumes
	m.mu.Unlock()
	ps := statsapi.PodStats{PodRef: statsapi.PodReference{Name: pod.Name, Namespace: pod.Namespace, UID: string(pod.UID)}, StartTime: metav1.NewTime(started)}
	on := func(u eviction.Use) *statsapi.FsStats {
		f := *nodeFs
		used, inodes := uint64(u.Bytes), uint64(u.Inodes)
		f.UsedBytes, f.InodesUsed = &used, &inodes
		return &f
	}
	for _, c := range pod.Spec.Containers {
		if u, ok := storage.Containers[c.Name]; ok {
			ps.Containers = append(ps.Containers, statsapi.ContainerStats{Name: c.Name, StartTime: metav1.NewTime(started), Rootfs: on(u)})
		}
	}
	for _, v := range pod.Spec.Volumes {
		switch {
		case v.EmptyDir != nil && v.EmptyDir.Medium != corev1.StorageMediumMemory:
			ps.VolumeStats = append(ps.VolumeStats, statsapi.VolumeStats{Name: v.Name, FsStats: *on(storage.EmptyDirs[v.Name])})
		case v.PersistentVolumeClaim != nil:
			p, ok := paths[v.Name]
			if !ok {
				continue
			}
			use, err := eviction.DiskUse(ctx, p.Path)
			if err != nil {
				return ps, err
			}
			fs, err := fsStats(p.Path, now)
			if err != nil {
				return ps, err
			}
			used, inodes := uint64(use.Bytes), uint64(use.Inodes)
			fs.UsedBytes, fs.InodesUsed = &used, &inodes
			ps.VolumeStats = append(ps.VolumeStats, statsapi.VolumeStats{Name: v.Name, FsStats: *fs,
				PVCRef: &statsapi.PVCReference{Name: v.PersistentVolumeClaim.ClaimName, Namespace: pod.Namespace}})
		}
	}
	ps.EphemeralStorage = on(storage.Total)
	return ps, nil
}

// fsStats is the filesystem holding dir: capacity, what is available to
// unprivileged users and used, inodes, as the kubelet reports them.
func fsStats(dir string, now metav1.Time) (*statsapi.FsStats, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(filepath.Clean(dir), &st); err != nil {
		return nil, err
	}
	bsize := uint64(st.Bsize)
	capacity, available, used := st.Blocks*bsize, st.Bavail*bsize, (st.Blocks-st.Bfree)*bsize
	inodes, free, inodesUsed := st.Files, st.Ffree, st.Files-st.Ffree
	return &statsapi.FsStats{Time: now, CapacityBytes: &capacity, AvailableBytes: &available, UsedBytes: &used,
		Inodes: &inodes, InodesFree: &free, InodesUsed: &inodesUsed}, nil
}
