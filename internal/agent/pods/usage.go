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

// Usage reads the CPU and memory of every running container (app and
// init), ordered by pod and container, as the kubelet's resource metrics
// report them.
func (m *Manager) Usage() []ContainerUsage {
	type running struct {
		ns, pod, name, id string
		started           time.Time
	}
	var list []running
	m.mu.Lock()
	for _, st := range m.running {
		for _, c := range st.all() {
			if c.running {
				list = append(list, running{st.namespace, st.name, c.name, c.id, c.startedAt})
			}
		}
	}
	m.mu.Unlock()
	sort.Slice(list, func(i, j int) bool {
		if list[i].ns+"/"+list[i].pod != list[j].ns+"/"+list[j].pod {
			return list[i].ns+"/"+list[i].pod < list[j].ns+"/"+list[j].pod
		}
		return list[i].name < list[j].name
	})
	out := make([]ContainerUsage, 0, len(list))
	for _, c := range list {
		// The cgroup is read outside the lock: it is a few small files
		// per container, and a container may stop meanwhile (then it
		// is left out).
		if s, ok := usage.Container(c.id); ok {
			out = append(out, ContainerUsage{Namespace: c.ns, Pod: c.pod, Container: c.name, ID: c.id, Started: c.started, Sample: s})
		}
	}
	return out
}
