package pods

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"github.com/orch-dev/orch/internal/agent/logs"
	"github.com/orch-dev/orch/internal/agent/podnet"
	"github.com/orch-dev/orch/internal/agent/volumes"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// podState is what the manager set up for one pod. Its fields, and its
// containers', are guarded by Manager.mu.
type podState struct {
	uid       types.UID
	namespace string
	name      string
	ip        string
	// hostNetwork pods have no network namespace of their own.
	hostNetwork bool
	ports       []podnet.PortMapping
	// grace is how long the pod's processes get after SIGTERM, from the
	// pod as last seen: it is what applies when the pod is force-deleted.
	grace   time.Duration
	started time.Time
	// initialized is set once every init container has succeeded.
	initialized bool
	init, app   []*containerState
	// ephemeral are the ephemeral containers added to the pod so far
	// (kubectl debug), each run once.
	ephemeral []*containerState
	// pod is the pod as last seen, for its hooks when it is gone.
	pod *corev1.Pod
	// images are the images its start resolved, for each container's
	// first run.
	images map[string]containerd.Image
	// volumes are the pod's volumes on the node, set up at volumesAt.
	volumes   volumes.Paths
	volumesAt time.Time
	// evicted is set once the node chose to evict the pod, and eviction
	// says why.
	evicted  bool
	eviction *evictionNotice
	// resize is why the pod's last resize is not done, nil once it is.
	resize *resizeStatus
}

// containerState is one container of a pod, as the manager ran it.
type containerState struct {
	name string
	id   string // containerd container id, <pod uid>-<name>
	init bool
	// ephemeral marks an ephemeral container: never restarted, no part
	// of the pod's phase or readiness; target is the container whose
	// process namespace it joins, if any.
	ephemeral bool
	target    string
	// applied are the cpu and memory resources its cgroup has (from its
	// spec at creation, then from in-place resizes); resizeRestart is
	// set while it is restarted to take a resize.
	applied       *corev1.ResourceRequirements
	resizeRestart bool
	// created is set once the containerd container exists; spec, image
	// and imageID are what it was created from.
	created        bool
	spec           *corev1.Container
	image, imageID string
	// waiting is why the container could not be created (a missing
	// ConfigMap, a bad volume): reported until it clears.
	waiting *configError
	// exit is the last exit, nil while running or before the first start.
	exit      *exit
	running   bool
	startedAt time.Time
	restarts  int32
	lastState corev1.ContainerState
	// ready and started are the probes' verdicts (true without probes).
	ready, startupDone bool
	// stopProbes ends the probes of the current run.
	stopProbes func()
	// stopping is set once a sidecar is being stopped because the pod's
	// containers have ended.
	stopping bool
	// io and logs carry the current run's output to its log file.
	io   cio.IO
	logs *logs.Writer
}

// exit is how a container's process ended.
type exit struct {
	code      int32
	at        time.Time
	oomKilled bool
	message   string // from its termination log
	// reason, when set, is the kubelet's for an exit that was not the
	// process's own: StartError for a container whose process never ran.
	reason string
}

func newPodState(pod *corev1.Pod) *podState {
	st := &podState{uid: pod.UID, namespace: pod.Namespace, name: pod.Name, started: time.Now(), grace: graceOf(pod), pod: pod,
		hostNetwork: pod.Spec.HostNetwork, ports: podnet.HostPorts(pod)}
	for _, c := range pod.Spec.InitContainers {
		st.init = append(st.init, &containerState{name: c.Name, id: containerID(pod, c.Name), init: true})
	}
	for _, c := range pod.Spec.Containers {
		st.app = append(st.app, &containerState{name: c.Name, id: containerID(pod, c.Name)})
	}
	for _, c := range pod.Spec.EphemeralContainers {
		st.ephemeralState(pod, &c)
	}
	st.initialized = len(st.init) == 0
	return st
}

// ephemeralState is the state of ephemeral container c, made the first
// time it is asked for; the caller holds the manager's lock once the pod
// runs.
func (st *podState) ephemeralState(pod *corev1.Pod, c *corev1.EphemeralContainer) *containerState {
	for _, cs := range st.ephemeral {
		if cs.name == c.Name {
			return cs
		}
	}
	cs := &containerState{name: c.Name, id: containerID(pod, c.Name), ephemeral: true, target: c.TargetContainerName}
	st.ephemeral = append(st.ephemeral, cs)
	return cs
}

// all is the pod's containers, init ones first, ephemeral ones last.
func (st *podState) all() []*containerState {
	return append(append(append([]*containerState{}, st.init...), st.app...), st.ephemeral...)
}

// ephemeralSpec is an ephemeral container as the container it runs as.
func ephemeralSpec(c *corev1.EphemeralContainer) *corev1.Container {
	spec := corev1.Container(c.EphemeralContainerCommon)
	return &spec
}

// containerID names a pod's container in containerd: <pod uid>-<name>,
// or, where that passes containerd's 76 characters (a container name may
// have 63), the name cut short and told apart by a hash of it.
func containerID(pod *corev1.Pod, name string) string {
	id := string(pod.UID) + "-" + name
	if len(id) <= maxContainerID {
		return id
	}
	sum := sha256.Sum256([]byte(name))
	suffix := "-" + hex.EncodeToString(sum[:4])
	// containerd refuses two separators in a row: a cut just after one
	// drops it (only ids that were refused change).
	return strings.TrimRight(id[:maxContainerID-len(suffix)], "-._") + suffix
}

// maxContainerID is containerd's limit on an identifier's length.
const maxContainerID = 76

// key is the pod's work-queue key.
func (st *podState) key() string { return st.namespace + "/" + st.name }

// succeeded reports whether an init container is done.
func (c *containerState) succeeded() bool { return c.exit != nil && c.exit.code == 0 && !c.running }

// sidecar reports whether init container c is a sidecar (Kubernetes'
// native sidecars: restartPolicy Always): it starts in the init
// sequence, lets the next one start once it has started, and runs, and
// is restarted, alongside the pod's containers.
func sidecar(c *corev1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
}

// initDone reports whether init container c lets the init sequence go on:
// it succeeded, or it is a sidecar that runs and passed its startup probe.
func (c *containerState) initDone(spec *corev1.Container) bool {
	if sidecar(spec) {
		return c.running && c.startupDone
	}
	return c.succeeded()
}
