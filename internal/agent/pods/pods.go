// Package pods runs the pods bound to this node in containerd, as the
// kubelet does: each pod gets a network namespace set up by CNI and one
// container per pod container from its image, and its status goes back to
// the API; a pod being deleted is stopped (SIGTERM, then SIGKILL after its
// grace period), cleaned up, and its deletion confirmed.
//
// Not yet here: pulling images (they come from DATA/agent/images), init
// containers, volumes, env from ConfigMaps and Secrets, probes, restart
// back-off, and the local checkpoint.
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
	uid        types.UID
	namespace  string
	name       string
	ip         string
	started    time.Time
	containers []string // container ids, in the pod's container order
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
		return nil
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
	images := make([]containerd.Image, len(pod.Spec.Containers))
	for i, c := range pod.Spec.Containers {
		ref, err := imageRef(c.Image)
		if err != nil {
			return m.waiting(ctx, pod, c.Name, "InvalidImageName", err.Error())
		}
		img, err := m.ctr.GetImage(cctx, ref)
		if errdefs.IsNotFound(err) {
			return m.waiting(ctx, pod, c.Name, "ErrImagePull",
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
	st := &podState{uid: pod.UID, namespace: pod.Namespace, name: pod.Name, ip: ip, started: time.Now()}
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
		if err := task.Start(cctx); err != nil {
			return fmt.Errorf("start container %s: %w", c.Name, err)
		}
	}
	m.log.Info("pod started", "pod", pod.Namespace+"/"+pod.Name, "ip", ip)
	return m.reportRunning(ctx, pod, st)
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

func (m *Manager) reportRunning(ctx context.Context, pod *corev1.Pod, st *podState) error {
	updated := pod.DeepCopy()
	now := metav1.NewTime(st.started)
	updated.Status.Phase = corev1.PodRunning
	updated.Status.PodIP, updated.Status.PodIPs = st.ip, []corev1.PodIP{{IP: st.ip}}
	updated.Status.HostIP = m.nodeIP
	if m.nodeIP != "" {
		updated.Status.HostIPs = []corev1.HostIP{{IP: m.nodeIP}}
	}
	updated.Status.StartTime = &now
	updated.Status.QOSClass = corev1.PodQOSBestEffort
	updated.Status.Conditions = nil
	for _, t := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		updated.Status.Conditions = append(updated.Status.Conditions, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: now})
	}
	updated.Status.ContainerStatuses = nil
	for i, c := range pod.Spec.Containers {
		ref, _ := imageRef(c.Image)
		updated.Status.ContainerStatuses = append(updated.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: ref, ImageID: ref, ContainerID: "containerd://" + st.containers[i], Ready: true, Started: ptr.To(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
	}
	_, err := m.api.Pods(pod.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// waiting reports a container that cannot start, and tries again later.
func (m *Manager) waiting(ctx context.Context, pod *corev1.Pod, container, reason, message string) error {
	updated := pod.DeepCopy()
	updated.Status.Phase = corev1.PodPending
	updated.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: container, Image: pod.Spec.Containers[0].Image,
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
	grace := 30 * time.Second
	if pod != nil && pod.DeletionGracePeriodSeconds != nil {
		grace = time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
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
