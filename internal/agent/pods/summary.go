package pods

import (
	"context"
	"path/filepath"
	"sort"
	"syscall"
	"time"

	"github.com/orch-dev/orch/internal/agent/eviction"
	"github.com/orch-dev/orch/internal/agent/usage"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

// Summary is the storage part of the kubelet's Summary API
// (/stats/summary): the node's filesystem (which holds the images too),
// and for each pod its containers' writable layers and logs, its volumes
// on the node's disk (emptyDirs and the claims' volumes, with the pvcRef
// that ties a volume's use to its claim) and its ephemeral storage; and
// the CPU and memory of the node, the pods and their containers.
func (m *Manager) Summary(ctx context.Context, node string, started time.Time) (*statsapi.Summary, error) {
	now := metav1.Now()
	fs, err := fsStats(m.cfg.DataDir, now)
	if err != nil {
		return nil, err
	}
	out := &statsapi.Summary{Node: statsapi.NodeStats{NodeName: node, StartTime: metav1.NewTime(started), Fs: fs,
		Runtime: &statsapi.RuntimeStats{ImageFs: fs, ContainerFs: fs}}}
	rates := m.newRates()
	if s, err := usage.Node(); err == nil {
		out.Node.CPU, out.Node.Memory = rates.cpu("", s), memoryStats(s)
	}
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
		ps, err := m.podStats(ctx, st, fs, now, rates)
		if err != nil {
			m.log.Debug("pod stats", "pod", st.key(), "err", err)
			continue
		}
		out.Pods = append(out.Pods, ps)
	}
	m.mu.Lock()
	m.lastUsage = rates.next
	m.mu.Unlock()
	return out, nil
}

func (m *Manager) podStats(ctx context.Context, st *podState, nodeFs *statsapi.FsStats, now metav1.Time, rates *rates) (statsapi.PodStats, error) {
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
	// A pod's CPU and memory are its containers' together (orch puts no
	// pod-level cgroup above them).
	var podUse usage.Sample
	var measured bool
	for _, c := range pod.Spec.Containers {
		u, ok := storage.Containers[c.Name]
		if !ok {
			continue
		}
		cs := statsapi.ContainerStats{Name: c.Name, StartTime: metav1.NewTime(started), Rootfs: on(u)}
		id := containerID(pod, c.Name)
		if s, ok := usage.Container(id); ok {
			cs.CPU, cs.Memory = rates.cpu(id, s), memoryStats(s)
			podUse.Time, measured = s.Time, true
			podUse.CPUNanos += s.CPUNanos
			podUse.MemoryBytes += s.MemoryBytes
			podUse.WorkingSetBytes += s.WorkingSetBytes
			podUse.RSSBytes += s.RSSBytes
		}
		ps.Containers = append(ps.Containers, cs)
	}
	if measured {
		ps.CPU, ps.Memory = rates.cpu(string(pod.UID), podUse), memoryStats(podUse)
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

// rates turns cumulative CPU readings into the rate since the previous
// Summary, as the kubelet's usageNanoCores.
type rates struct {
	prev, next map[string]usage.Sample
}

func (m *Manager) newRates() *rates {
	m.mu.Lock()
	defer m.mu.Unlock()
	return &rates{prev: m.lastUsage, next: map[string]usage.Sample{}}
}

func (r *rates) cpu(key string, s usage.Sample) *statsapi.CPUStats {
	r.next[key] = s
	out := &statsapi.CPUStats{Time: metav1.NewTime(s.Time), UsageCoreNanoSeconds: &s.CPUNanos}
	if prev, ok := r.prev[key]; ok {
		rate := usage.Rate(prev, s)
		out.UsageNanoCores = &rate
	}
	return out
}

func memoryStats(s usage.Sample) *statsapi.MemoryStats {
	return &statsapi.MemoryStats{Time: metav1.NewTime(s.Time), UsageBytes: &s.MemoryBytes, WorkingSetBytes: &s.WorkingSetBytes, RSSBytes: &s.RSSBytes}
}
