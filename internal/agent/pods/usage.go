package pods

import (
	"sort"
	"time"

	"github.com/orch-dev/orch/internal/agent/usage"
)

// ContainerUsage is what one running container uses of CPU and memory.
type ContainerUsage struct {
	Namespace, Pod, Container string
	// ID is the containerd container's, which names its cgroup.
	ID string
	// Started is when the container's current run began.
	Started time.Time
	usage.Sample
}

// runningContainers are the running containers (app and init), ordered
// by pod and container, from the manager's state alone.
func (m *Manager) runningContainers() []ContainerUsage {
	var list []ContainerUsage
	m.mu.Lock()
	for _, st := range m.running {
		for _, c := range st.all() {
			if c.running {
				list = append(list, ContainerUsage{Namespace: st.namespace, Pod: st.name, Container: c.name, ID: c.id, Started: c.startedAt})
			}
		}
	}
	m.mu.Unlock()
	// sort.Slice rather than slices.SortFunc: its generic instantiation
	// for this type costs the binary budget some 20 KB.
	sort.Slice(list, func(i, j int) bool {
		a, b := list[i], list[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		if a.Pod != b.Pod {
			return a.Pod < b.Pod
		}
		return a.Container < b.Container
	})
	return list
}

// Running counts the pods with a running container, and those
// containers, as the kubelet's kubelet_running_pods and
// kubelet_running_containers.
func (m *Manager) Running() (pods, containers int) {
	list := m.runningContainers()
	for i, c := range list {
		if i == 0 || list[i-1].Namespace != c.Namespace || list[i-1].Pod != c.Pod {
			pods++
		}
	}
	return pods, len(list)
}

// Usage reads the CPU and memory of every running container (app and
// init), ordered by pod and container, as the kubelet's resource metrics
// report them.
func (m *Manager) Usage() []ContainerUsage {
	list := m.runningContainers()
	out := list[:0]
	for _, c := range list {
		// The cgroup is read outside the lock: it is a few small files
		// per container, and a container may stop meanwhile (then it
		// is left out).
		if s, ok := usage.Container(c.ID); ok {
			c.Sample = s
			out = append(out, c)
		}
	}
	return out
}
