// Package pods runs the pods bound to this node in containerd, as the
// kubelet does: each pod gets a network namespace set up by CNI and one
// container per pod container from its image, and its status goes back to
// the API; a pod being deleted is stopped (SIGTERM, then SIGKILL after its
// grace period), cleaned up, and its deletion confirmed.
//
// Exited containers start again as the restart policy says, with the
// kubelet's back-off (CrashLoopBackOff), and the pod ends Succeeded or
// Failed when none will.
//
// Not yet here: pulling images (they come from DATA/agent/images), init
// containers, volumes, env from ConfigMaps and Secrets, probes, and the
// local checkpoint.
package pods

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/oci"
	"github.com/distribution/reference"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	orchctr "github.com/orch-dev/orch/internal/agent/containerd"
	"github.com/orch-dev/orch/internal/kube"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
)

// Manager runs this node's pods.
type Manager struct {
	api     *kube.Client
	ctr     *containerd.Client
	node    string
	nodeIP  string
	dataDir string
	net     *network
	log     *slog.Logger
	pods    toolscache.SharedIndexInformer
	queue   workqueue.TypedRateLimitingInterface[string]

	mu      sync.Mutex
	running map[types.UID]*podState
}

// podState is what the manager set up for one pod.
type podState struct {
	uid       types.UID
	namespace string
	name      string
	ip        string
	// grace is how long the pod's processes get after SIGTERM, from the
	// pod as last seen: it is what applies when the pod is force-deleted.
	grace      time.Duration
	started    time.Time
	containers []string // container ids, in the pod's container order
	// per container, guarded by Manager.mu
	exits       []*exit     // the last exit, nil while running
	restarts    []int32     // restarts so far
	nextRestart []time.Time // when a crashed container may start again
	lastState   []corev1.ContainerState
	startedAt   []time.Time
}

func newPodState(pod *corev1.Pod, ip string) *podState {
	n := len(pod.Spec.Containers)
	return &podState{uid: pod.UID, namespace: pod.Namespace, name: pod.Name, ip: ip, started: time.Now(), grace: graceOf(pod),
		exits: make([]*exit, n), restarts: make([]int32, n), nextRestart: make([]time.Time, n),
		lastState: make([]corev1.ContainerState, n), startedAt: make([]time.Time, n)}
}

// exit is how a container's process ended.
type exit struct {
	code int32
	at   time.Time
}

// New watches the pods bound to node. podCIDR is the node's pod network.
func New(api *kube.Client, ctr *containerd.Client, node, nodeIP, podCIDR, dataDir string, log *slog.Logger) (*Manager, error) {
	net, err := newNetwork(dataDir, podCIDR)
	if err != nil {
		return nil, err
	}
	pods := api.Pods("")
	selector := "spec.nodeName=" + node
	lw := &toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return pods.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return pods.Watch(ctx, o)
		},
	}
	m := &Manager{api: api, ctr: ctr, node: node, nodeIP: nodeIP, dataDir: dataDir, net: net, log: log.With("component", "pods"),
		pods:    toolscache.NewSharedIndexInformer(lw, &corev1.Pod{}, 0, toolscache.Indexers{}),
		queue:   workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		running: map[types.UID]*podState{}}
	enqueue := func(obj any) {
		if k, err := toolscache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			m.queue.Add(k)
		}
	}
	if _, err := m.pods.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, obj any) { enqueue(obj) }, DeleteFunc: enqueue,
	}); err != nil {
		return nil, err
	}
	return m, nil
}

// Run syncs pods until ctx ends.
func (m *Manager) Run(ctx context.Context) {
	defer m.queue.ShutDown()
	go m.pods.Run(ctx.Done())
	if !toolscache.WaitForCacheSync(ctx.Done(), m.pods.HasSynced) {
		return
	}
	for range 4 {
		go func() {
			for {
				k, quit := m.queue.Get()
				if quit {
					return
				}
				if err := m.sync(ctx, k); err != nil && ctx.Err() == nil {
					m.log.Warn("pod sync", "pod", k, "err", err)
					m.queue.AddRateLimited(k)
				} else {
					m.queue.Forget(k)
				}
				m.queue.Done(k)
			}
		}()
	}
	<-ctx.Done()
}

func (m *Manager) ctx(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, orchctr.Namespace)
}

func (m *Manager) sync(ctx context.Context, key string) error {
	obj, exists, err := m.pods.GetIndexer().GetByKey(key)
	if err != nil {
		return err
	}
	if !exists {
		return m.forgetByKey(ctx, key)
	}
	pod := obj.(*corev1.Pod)
	m.mu.Lock()
	st := m.running[pod.UID]
	m.mu.Unlock()
	switch {
	case pod.DeletionTimestamp != nil:
		if st != nil {
			if err := m.stop(ctx, st, pod); err != nil {
				return err
			}
		}
		err := m.api.Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0), Preconditions: &metav1.Preconditions{UID: &pod.UID}})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		return err
	case st != nil:
		m.mu.Lock()
		st.grace = graceOf(pod)
		m.mu.Unlock()
		return m.reconcile(ctx, pod, st)
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		return nil
	}
	return m.start(ctx, pod)
}

// imageRef names an image as containerd stores it, normalised as Docker
// does ("busybox" is docker.io/library/busybox:latest).
func imageRef(name string) (string, error) {
	named, err := reference.ParseDockerRef(name)
	if err != nil {
		return "", fmt.Errorf("image %q: %w", name, err)
	}
	return named.String(), nil
}

func (m *Manager) start(ctx context.Context, pod *corev1.Pod) error {
	cctx := m.ctx(ctx)
	if adopted, err := m.adopt(ctx, pod); adopted || err != nil {
		return err
	}
	images := make([]containerd.Image, len(pod.Spec.Containers))
	for i, c := range pod.Spec.Containers {
		ref, err := imageRef(c.Image)
		if err != nil {
			return m.waiting(ctx, pod, c, "InvalidImageName", err.Error())
		}
		img, err := m.ctr.GetImage(cctx, ref)
		if errdefs.IsNotFound(err) {
			return m.waiting(ctx, pod, c, "ErrImagePull",
				fmt.Sprintf("image %s is not on this node: put its tarball in %s (pulling from registries is not in this build yet)", ref, filepath.Join(m.dataDir, "images")))
		}
		if err != nil {
			return err
		}
		images[i] = img
	}
	id := string(pod.UID)
	nsPath, ip, err := m.net.setUp(ctx, id, pod.Namespace, pod.Name)
	if err != nil {
		return err
	}
	st := newPodState(pod, ip)
	m.mu.Lock()
	m.running[pod.UID] = st
	m.mu.Unlock()
	logDir := filepath.Join(m.dataDir, "pods", id)
	if err := os.MkdirAll(logDir, 0o700); err != nil {
		return err
	}
	for i, c := range pod.Spec.Containers {
		cid := id + "-" + c.Name
		var env []string
		for _, e := range c.Env {
			if e.ValueFrom == nil {
				env = append(env, e.Name+"="+e.Value)
			}
		}
		opts := []oci.SpecOpts{oci.WithImageConfig(images[i]), oci.WithHostname(pod.Name),
			oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: nsPath}), oci.WithEnv(env)}
		if len(c.Command) > 0 {
			opts = append(opts, oci.WithProcessArgs(append(append([]string{}, c.Command...), c.Args...)...))
		} else if len(c.Args) > 0 {
			opts = append(opts, withArgs(c.Args))
		}
		if c.WorkingDir != "" {
			opts = append(opts, oci.WithProcessCwd(c.WorkingDir))
		}
		container, err := m.ctr.NewContainer(cctx, cid, containerd.WithImage(images[i]), containerd.WithNewSnapshot(cid, images[i]),
			containerd.WithNewSpec(opts...), containerd.WithContainerLabels(map[string]string{"io.kubernetes.pod.uid": id}))
		if err != nil {
			return fmt.Errorf("container %s: %w", c.Name, err)
		}
		st.containers = append(st.containers, cid)
		task, err := container.NewTask(cctx, cio.LogFile(filepath.Join(logDir, c.Name+".log")))
		if err != nil {
			return fmt.Errorf("container %s task: %w", c.Name, err)
		}
		if err := m.startTask(ctx, pod, st, i, task); err != nil {
			return fmt.Errorf("start container %s: %w", c.Name, err)
		}
	}
	m.log.Info("pod started", "pod", pod.Namespace+"/"+pod.Name, "ip", ip)
	return m.reportStatus(ctx, pod, st)
}

// startTask starts a container's process and watches for its exit.
func (m *Manager) startTask(ctx context.Context, pod *corev1.Pod, st *podState, i int, task containerd.Task) error {
	cctx := m.ctx(ctx)
	exited, err := task.Wait(cctx)
	if err != nil {
		return err
	}
	if err := task.Start(cctx); err != nil {
		return err
	}
	m.mu.Lock()
	st.exits[i], st.startedAt[i] = nil, time.Now()
	m.mu.Unlock()
	m.watchExit(ctx, pod.Namespace+"/"+pod.Name, st, i, exited)
	return nil
}

// watchExit records container i's exit and syncs its pod again.
func (m *Manager) watchExit(ctx context.Context, key string, st *podState, i int, exited <-chan containerd.ExitStatus) {
	go func() {
		select {
		case status := <-exited:
			m.mu.Lock()
			st.exits[i] = &exit{code: int32(status.ExitCode()), at: status.ExitTime()}
			m.mu.Unlock()
			m.queue.Add(key)
		case <-ctx.Done():
		}
	}()
}

// crashBackoff is the kubelet's restart delay: none for the first
// restart, then 10 s doubling to five minutes.
func crashBackoff(restarts int32) time.Duration {
	if restarts == 0 {
		return 0
	}
	return min(10*time.Second<<min(restarts-1, 5), 5*time.Minute)
}

// reconcile restarts exited containers as the restart policy says and
// reports the pod's status.
func (m *Manager) reconcile(ctx context.Context, pod *corev1.Pod, st *podState) error {
	cctx := m.ctx(ctx)
	for i, c := range pod.Spec.Containers {
		m.mu.Lock()
		ex, next := st.exits[i], st.nextRestart[i]
		m.mu.Unlock()
		if ex == nil || !restarts(pod.Spec.RestartPolicy, ex.code) {
			continue
		}
		if wait := time.Until(next); wait > 0 {
			m.queue.AddAfter(pod.Namespace+"/"+pod.Name, wait)
			continue
		}
		container, err := m.ctr.LoadContainer(cctx, st.containers[i])
		if err != nil {
			return err
		}
		if task, err := container.Task(cctx, nil); err == nil {
			if _, err := task.Delete(cctx); err != nil && !errdefs.IsNotFound(err) {
				return err
			}
		}
		task, err := container.NewTask(cctx, cio.LogFile(filepath.Join(m.dataDir, "pods", string(pod.UID), c.Name+".log")))
		if err != nil {
			return err
		}
		m.mu.Lock()
		st.lastState[i] = corev1.ContainerState{Terminated: terminated(ex, st.startedAt[i])}
		st.restarts[i]++
		st.nextRestart[i] = time.Now().Add(crashBackoff(st.restarts[i]))
		m.mu.Unlock()
		if err := m.startTask(ctx, pod, st, i, task); err != nil {
			return err
		}
		m.log.Info("container restarted", "pod", pod.Namespace+"/"+pod.Name, "container", c.Name, "exitCode", ex.code)
	}
	return m.reportStatus(ctx, pod, st)
}

// restarts reports whether a container that exited with code starts again.
func restarts(policy corev1.RestartPolicy, code int32) bool {
	return policy == corev1.RestartPolicyAlways || policy == "" || policy == corev1.RestartPolicyOnFailure && code != 0
}

func terminated(ex *exit, started time.Time) *corev1.ContainerStateTerminated {
	reason := "Completed"
	if ex.code != 0 {
		reason = "Error"
	}
	return &corev1.ContainerStateTerminated{ExitCode: ex.code, Reason: reason, StartedAt: metav1.NewTime(started), FinishedAt: metav1.NewTime(ex.at)}
}

// adopt takes over a pod whose containers already exist: started by an
// earlier run of the agent, they kept running in their shims. Nothing is
// restarted; a container that exited meanwhile is handled by the restart
// policy like any exit.
func (m *Manager) adopt(ctx context.Context, pod *corev1.Pod) (bool, error) {
	cctx := m.ctx(ctx)
	found, err := m.ctr.Containers(cctx, fmt.Sprintf("labels.%q==%s", "io.kubernetes.pod.uid", pod.UID))
	if err != nil || len(found) == 0 {
		return false, err
	}
	st := newPodState(pod, pod.Status.PodIP)
	if pod.Status.StartTime != nil {
		st.started = pod.Status.StartTime.Time
	}
	key := pod.Namespace + "/" + pod.Name
	for i, c := range pod.Spec.Containers {
		cid := string(pod.UID) + "-" + c.Name
		st.containers = append(st.containers, cid)
		st.startedAt[i] = st.started
		for _, cs := range pod.Status.ContainerStatuses {
			if cs.Name == c.Name {
				st.restarts[i], st.lastState[i] = cs.RestartCount, cs.LastTerminationState
				if cs.State.Running != nil {
					st.startedAt[i] = cs.State.Running.StartedAt.Time
				}
			}
		}
		container, err := m.ctr.LoadContainer(cctx, cid)
		if err != nil {
			st.exits[i] = &exit{code: 255, at: time.Now()} // gone: it starts again as the policy says
			continue
		}
		task, err := container.Task(cctx, nil)
		if err != nil {
			st.exits[i] = &exit{code: 255, at: time.Now()}
			continue
		}
		exited, err := task.Wait(cctx)
		if err != nil {
			return false, err
		}
		m.watchExit(ctx, key, st, i, exited)
	}
	m.mu.Lock()
	m.running[pod.UID] = st
	m.mu.Unlock()
	m.log.Info("pod adopted", "pod", key)
	m.queue.Add(key)
	return true, nil
}

// withArgs keeps the image's entrypoint and replaces its command, as
// Kubernetes does for args without command.
func withArgs(args []string) oci.SpecOpts {
	return func(ctx context.Context, c oci.Client, ctr *containers.Container, s *oci.Spec) error {
		if s.Process == nil || len(s.Process.Args) == 0 {
			s.Process.Args = args
			return nil
		}
		s.Process.Args = append([]string{s.Process.Args[0]}, args...)
		return nil
	}
}

// reportStatus writes the pod's status as its containers are now; an
// unchanged status is not written again.
func (m *Manager) reportStatus(ctx context.Context, pod *corev1.Pod, st *podState) error {
	updated := pod.DeepCopy()
	s := &updated.Status
	started := metav1.NewTime(st.started)
	s.PodIP, s.PodIPs, s.HostIP, s.StartTime, s.QOSClass = st.ip, []corev1.PodIP{{IP: st.ip}}, m.nodeIP, &started, corev1.PodQOSBestEffort
	if m.nodeIP != "" {
		s.HostIPs = []corev1.HostIP{{IP: m.nodeIP}}
	}
	s.ContainerStatuses = nil
	allReady, allDone, allSucceeded := true, true, true
	m.mu.Lock()
	for i, c := range pod.Spec.Containers {
		ref, _ := imageRef(c.Image)
		cs := corev1.ContainerStatus{Name: c.Name, Image: ref, ImageID: ref, ContainerID: "containerd://" + st.containers[i],
			RestartCount: st.restarts[i], LastTerminationState: st.lastState[i]}
		ex := st.exits[i]
		switch {
		case ex == nil:
			cs.Ready, cs.Started = true, ptr.To(true)
			cs.State.Running = &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(st.startedAt[i])}
			allDone, allSucceeded = false, false
		case restarts(pod.Spec.RestartPolicy, ex.code):
			cs.Started = ptr.To(false)
			cs.LastTerminationState = corev1.ContainerState{Terminated: terminated(ex, st.startedAt[i])}
			cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff",
				Message: fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)", crashBackoff(st.restarts[i]+1), c.Name, pod.Name, pod.Namespace, pod.UID)}
			allReady, allDone, allSucceeded = false, false, false
		default:
			cs.Started = ptr.To(false)
			cs.State.Terminated = terminated(ex, st.startedAt[i])
			allReady = false
			allSucceeded = allSucceeded && ex.code == 0
		}
		s.ContainerStatuses = append(s.ContainerStatuses, cs)
	}
	m.mu.Unlock()
	s.Phase = corev1.PodRunning
	if allDone {
		s.Phase = corev1.PodFailed
		if allSucceeded {
			s.Phase = corev1.PodSucceeded
		}
	}
	ready := corev1.ConditionFalse
	if allReady {
		ready = corev1.ConditionTrue
	}
	s.Conditions = setPodCondition(pod.Status.Conditions, corev1.PodScheduled, corev1.ConditionTrue)
	s.Conditions = setPodCondition(s.Conditions, corev1.PodInitialized, corev1.ConditionTrue)
	s.Conditions = setPodCondition(s.Conditions, corev1.ContainersReady, ready)
	s.Conditions = setPodCondition(s.Conditions, corev1.PodReady, ready)
	if equality.Semantic.DeepEqual(pod.Status, *s) {
		return nil
	}
	_, err := m.api.Pods(pod.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
		return nil // gone: the node authorizer no longer relates it to this node
	}
	return err
}

// setPodCondition sets a condition, keeping its transition time when its
// status does not change.
func setPodCondition(conds []corev1.PodCondition, t corev1.PodConditionType, status corev1.ConditionStatus) []corev1.PodCondition {
	out := append([]corev1.PodCondition{}, conds...)
	for i := range out {
		if out[i].Type == t {
			if out[i].Status != status {
				out[i].Status, out[i].LastTransitionTime = status, metav1.Now()
			}
			return out
		}
	}
	return append(out, corev1.PodCondition{Type: t, Status: status, LastTransitionTime: metav1.Now()})
}

// waiting reports a container that cannot start, and tries again later.
func (m *Manager) waiting(ctx context.Context, pod *corev1.Pod, c corev1.Container, reason, message string) error {
	updated := pod.DeepCopy()
	updated.Status.Phase = corev1.PodPending
	updated.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: c.Name, Image: c.Image,
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: message}}}}
	if _, err := m.api.Pods(pod.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	m.queue.AddAfter(pod.Namespace+"/"+pod.Name, 10*time.Second)
	return nil
}

// stop ends a pod's containers (SIGTERM, SIGKILL after the grace period)
// and removes them, their snapshots and the pod's network.
func (m *Manager) stop(ctx context.Context, st *podState, pod *corev1.Pod) error {
	m.mu.Lock()
	grace := st.grace
	m.mu.Unlock()
	if pod != nil {
		grace = graceOf(pod)
	}
	cctx := m.ctx(ctx)
	for _, cid := range st.containers {
		container, err := m.ctr.LoadContainer(cctx, cid)
		if errdefs.IsNotFound(err) {
			continue
		}
		if err != nil {
			return err
		}
		if task, err := container.Task(cctx, nil); err == nil {
			if err := stopTask(cctx, task, grace); err != nil {
				return err
			}
		}
		if err := container.Delete(cctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
	}
	if err := m.net.tearDown(ctx, string(st.uid), st.namespace, st.name); err != nil {
		return err
	}
	_ = os.RemoveAll(filepath.Join(m.dataDir, "pods", string(st.uid)))
	m.mu.Lock()
	delete(m.running, st.uid)
	m.mu.Unlock()
	m.log.Info("pod stopped", "pod", st.namespace+"/"+st.name)
	return nil
}

// graceOf is the pod's termination grace period: the one its deletion
// set, else its spec's.
func graceOf(pod *corev1.Pod) time.Duration {
	switch {
	case pod.DeletionGracePeriodSeconds != nil:
		return time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
	case pod.Spec.TerminationGracePeriodSeconds != nil:
		return time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	return 30 * time.Second
}

func stopTask(ctx context.Context, task containerd.Task, grace time.Duration) error {
	exited, err := task.Wait(ctx)
	if err != nil {
		return err
	}
	if err := task.Kill(ctx, syscall.SIGTERM); err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	select {
	case <-exited:
	case <-time.After(grace):
		if err := task.Kill(ctx, syscall.SIGKILL); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
		<-exited
	}
	_, err = task.Delete(ctx)
	if err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	return nil
}

// forgetByKey cleans up a pod that is gone from the API.
func (m *Manager) forgetByKey(ctx context.Context, key string) error {
	ns, name, _ := strings.Cut(key, "/")
	m.mu.Lock()
	var st *podState
	for _, s := range m.running {
		if s.namespace == ns && s.name == name {
			st = s
		}
	}
	m.mu.Unlock()
	if st == nil {
		return nil
	}
	return m.stop(ctx, st, nil)
}
