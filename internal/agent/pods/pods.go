// Package pods runs the pods bound to this node in containerd, as the
// kubelet does: each pod gets a network namespace set up by CNI (or the
// node's, for hostNetwork pods), its volumes and its hosts and
// resolv.conf files; its init containers run one after another to
// success, then its containers, each from its image with the env,
// mounts, resource limits and security context its spec gives. Probes
// decide readiness and restart what fails its liveness; exited
// containers start again as the restart policy says, with the kubelet's
// back-off (CrashLoopBackOff). The pod's status goes back to the API; a
// pod being deleted is stopped (preStop, SIGTERM, SIGKILL after its grace
// period), cleaned up, and its deletion confirmed.
package pods

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
	"github.com/distribution/reference"
	"github.com/orch-dev/orch/internal/agent/checkpoint"
	orchctr "github.com/orch-dev/orch/internal/agent/containerd"
	"github.com/orch-dev/orch/internal/agent/eviction"
	"github.com/orch-dev/orch/internal/agent/podnet"
	"github.com/orch-dev/orch/internal/agent/registries"
	"github.com/orch-dev/orch/internal/agent/usage"
	"github.com/orch-dev/orch/internal/iptables"
	"github.com/orch-dev/orch/internal/kube"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	corelisters "k8s.io/client-go/listers/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

// podUIDLabel marks a container with its pod's UID, as the kubelet's
// containers are marked.
const podUIDLabel = "io.kubernetes.pod.uid"

// DefaultClusterCIDR is the pod network's default, the server's.
const DefaultClusterCIDR = "10.42.0.0/16"

// Config is what the pod manager needs to know about its node.
type Config struct {
	API *kube.Client
	// Runtime runs the containers: containerd's, or a fake in tests.
	Runtime orchctr.Runtime
	Node    string
	NodeIP  string
	// NodeHostname is what hostNetwork pods see as their hostname.
	NodeHostname string
	PodCIDR      string
	// ClusterCIDR is every node's pods' network: traffic to it is not
	// masqueraded (default 10.42.0.0/16, the server's --cluster-cidr).
	ClusterCIDR string
	// MTU is the pods' interfaces' (zero: the default, 1500): the VXLAN
	// pod network's tunnel takes 50 bytes of the node's.
	MTU int
	// DataDir is the agent's directory (DATA/agent).
	DataDir string
	// RuntimeDir holds what need not outlive a reboot (tmpfs, /run/orch):
	// the pods' hosts, resolv.conf and hostname files, their streams'
	// FIFOs and namespace pins, and the pod network's state. Empty is
	// DataDir/run.
	RuntimeDir string
	// ClusterDNS is the cluster DNS Service's IP for resolv.conf; empty
	// gives pods the node's resolvers.
	ClusterDNS    string
	ClusterDomain string
	// ResolvConf is the node's resolv.conf, which pods with dnsPolicy
	// Default get (default /etc/resolv.conf).
	ResolvConf string
	// Allocatable is the node's, for resourceFieldRef limits left unset.
	Allocatable corev1.ResourceList
	// Checkpoint keeps the node's pods for starting them without the API
	// server (after a reboot offline); nil keeps none.
	Checkpoint *checkpoint.Checkpoint
	// ImageGC is when unused images are removed; zero is the kubelet's
	// defaults.
	ImageGC ImageGC
	// RemoveOrphanCgroups removes, as the agent starts, the cgroups of
	// containers that no longer exist (left by killed runs); the host's
	// cgroups are not a fake runtime's to touch.
	RemoveOrphanCgroups bool
	// Registries are the node's registry mirrors and endpoint settings
	// (registries.yaml); nil pulls from the registries images name.
	Registries *registries.Config
	// Events records the kubelet's events about pods; nil records none.
	Events EventRecorder
	// Eviction is when the node evicts pods: for its memory or disk, or
	// for their own storage limits.
	Eviction eviction.Config
	Logger   *slog.Logger
	// IPTables holds the pods' masquerade rule; nil is the node's.
	IPTables iptables.Interface
	// Clock times probes; nil is the real one.
	Clock clock.WithTicker
	// Policies polices the pods' traffic (NetworkPolicies); nil: none.
	Policies Policer
}

// Policer is the node's NetworkPolicy engine as the pods see it: a pod's
// rules are in place before its first container starts, as Kubernetes
// says a selected pod is isolated before it runs.
type Policer interface {
	// Admit returns once the rules police the pod at its sandbox's
	// address.
	Admit(ctx context.Context, pod *corev1.Pod, ip string) error
	// Forget is told that the pod's sandbox, and its address, are gone.
	Forget(uid types.UID)
}

// admitTimeout bounds the wait for a pod's policy rules: past it the
// start fails and is retried, the pod never started unpoliced.
const admitTimeout = 30 * time.Second

// workers is how many pods are synced at once: a pod's start is mostly
// waiting on CNI plugins and runc, so more than the cores.
const workers = 16

// offlineAfter is how long the manager waits to hear from the API server
// before it runs the checkpointed pods.
const offlineAfter = 5 * time.Second

// apiVolumeResync is how often ConfigMap, Secret and downward API volumes
// are brought up to date, as the kubelet's periodic sync does.
const apiVolumeResync = time.Minute

// Manager runs this node's pods.
type Manager struct {
	cfg      Config
	api      *kube.Client
	ctr      orchctr.Runtime
	net      *podnet.Network
	log      *slog.Logger
	pods     toolscache.SharedIndexInformer
	services corelisters.ServiceLister
	svcInf   toolscache.SharedIndexInformer
	queue    workqueue.TypedRateLimitingInterface[string]

	pulls pulls

	mu      sync.Mutex
	running map[types.UID]*podState
	// retryAt holds off pods waiting for an image or their config until
	// their retry: the sync their own status update causes must not
	// replace ErrImagePull with ImagePullBackOff at once.
	retryAt map[string]retry
	// offline are the checkpointed pods by key, which stand in for the
	// API's until the pod informer has synced.
	offline map[string]*corev1.Pod
	// imageUsed is when a pod last wanted each image, for image garbage
	// collection's least recently used first.
	imageUsed map[string]time.Time
	// evicted are the pods the node evicted (or stopped for its
	// shutdown), never started again, until the API has them ended.
	evicted map[types.UID]*evictionReport
	// shuttingDown: the machine is shutting down, no new pod starts.
	shuttingDown bool
	// tokens are the pods' service-account tokens.
	tokens tokens
	// podCerts are the keys and certificates of podCertificate volumes.
	podCerts podCertificates
	// lastUsage is each container's (and the node's, under "") CPU as the
	// last Summary read it, for the rate the next one reports.
	lastUsage map[string]usage.Sample
}

// New watches the pods bound to the node.
func New(cfg Config) (*Manager, error) {
	if cfg.ResolvConf == "" {
		cfg.ResolvConf = "/etc/resolv.conf"
	}
	if cfg.ClusterDomain == "" {
		cfg.ClusterDomain = "cluster.local"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	cfg.ImageGC = cfg.ImageGC.withDefaults()
	cfg.Eviction = cfg.Eviction.WithDefaults()
	if cfg.ClusterCIDR == "" {
		cfg.ClusterCIDR = DefaultClusterCIDR
	}
	if cfg.IPTables == nil {
		ipt, err := iptables.IPv4()
		if err != nil {
			return nil, err
		}
		cfg.IPTables = ipt
	}
	if cfg.RuntimeDir == "" {
		cfg.RuntimeDir = filepath.Join(cfg.DataDir, "run")
	}
	net, err := podnet.New(cfg.RuntimeDir, cfg.PodCIDR, cfg.ClusterCIDR, cfg.MTU, cfg.IPTables)
	if err != nil {
		return nil, err
	}
	pods := cfg.API.Pods("")
	selector := "spec.nodeName=" + cfg.Node
	podLW := &toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return pods.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return pods.Watch(ctx, o)
		},
	}
	services := cfg.API.Services("")
	svcLW := &toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return services.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return services.Watch(ctx, o)
		},
	}
	svcInf := toolscache.NewSharedIndexInformer(svcLW, &corev1.Service{}, 0, toolscache.Indexers{toolscache.NamespaceIndex: toolscache.MetaNamespaceIndexFunc})
	m := &Manager{cfg: cfg, api: cfg.API, ctr: cfg.Runtime, net: net, log: cfg.Logger.With("component", "pods"),
		pods:     toolscache.NewSharedIndexInformer(podLW, &corev1.Pod{}, 0, toolscache.Indexers{}),
		svcInf:   svcInf,
		services: corelisters.NewServiceLister(svcInf.GetIndexer()),
		queue:    workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		running:  map[types.UID]*podState{}, offline: map[string]*corev1.Pod{}, retryAt: map[string]retry{}, imageUsed: map[string]time.Time{}, evicted: map[types.UID]*evictionReport{},
		pulls: pulls{inFlight: map[string]*pull{}, failed: map[string]pullFailure{}}, tokens: tokens{clock: cfg.Clock}, podCerts: podCertificates{clock: cfg.Clock}}
	enqueue := func(obj any) {
		if k, err := toolscache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			m.queue.Add(k)
		}
	}
	// The node needs no managedFields: neither in memory nor in its
	// offline checkpoint, which is written on every pod change.
	_ = m.pods.SetTransform(kube.DropManagedFields)
	_ = svcInf.SetTransform(kube.DropManagedFields)
	if _, err := m.pods.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, obj any) { enqueue(obj) }, DeleteFunc: enqueue,
	}); err != nil {
		return nil, err
	}
	return m, nil
}

// Run syncs pods until ctx ends. Until the API server has been heard
// from, the pods come from the checkpoint: a node that boots while the
// server is unreachable runs what it ran before.
func (m *Manager) Run(ctx context.Context) {
	// workersDone and the rest: Run returns once all it started is done.
	var workersDone, rest sync.WaitGroup
	defer func() {
		m.queue.ShutDown()
		workersDone.Wait()
		rest.Wait()
		m.closeOutputs()
	}()
	checkpointed := m.readCheckpoint()
	rest.Go(func() { m.pods.RunWithContext(ctx) })
	rest.Go(func() { m.svcInf.RunWithContext(ctx) })
	// A reachable server answers in well under offlineAfter; only then
	// does the checkpoint (whose statuses are older) stand in.
	syncCtx, cancel := context.WithTimeout(ctx, offlineAfter)
	synced := toolscache.WaitForCacheSync(syncCtx.Done(), m.pods.HasSynced)
	cancel()
	if !synced && ctx.Err() == nil && m.cfg.Checkpoint != nil {
		m.log.Warn("the API server is unreachable: running the pods of the checkpoint")
		m.mu.Lock()
		for _, p := range checkpointed {
			m.offline[p.Namespace+"/"+p.Name] = p
		}
		m.mu.Unlock()
		for _, p := range checkpointed {
			m.queue.Add(p.Namespace + "/" + p.Name)
		}
	}
	for range workers {
		workersDone.Add(1)
		go func() {
			defer workersDone.Done()
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
	if !toolscache.WaitForCacheSync(ctx.Done(), m.pods.HasSynced, m.svcInf.HasSynced) {
		return
	}
	// The API is the truth again: what it no longer has is stopped.
	m.mu.Lock()
	var keys []string
	for k := range m.offline {
		keys = append(keys, k)
	}
	for _, st := range m.running {
		keys = append(keys, st.key())
	}
	m.offline = map[string]*corev1.Pod{}
	m.mu.Unlock()
	for _, k := range keys {
		m.queue.Add(k)
	}
	if err := m.housekeeping(ctx); err != nil {
		m.log.Warn("housekeeping", "err", err)
	}
	rest.Go(func() { m.collectImagesEvery(ctx) })
	rest.Go(func() { m.evictEvery(ctx) })
	<-ctx.Done()
}

// closeOutputs closes the agent's ends of its containers' output as it
// stops. The containers go on running in their shims, which keep the FIFOs
// (and buffer 64 KiB each) until the next agent adopts them and reads on.
func (m *Manager) closeOutputs() {
	m.mu.Lock()
	var outputs []*containerState
	for _, st := range m.running {
		for _, cs := range st.all() {
			if cs.io != nil || cs.logs != nil {
				outputs = append(outputs, cs)
			}
		}
	}
	m.mu.Unlock()
	for _, cs := range outputs {
		m.mu.Lock()
		output, lw := cs.io, cs.logs
		cs.io, cs.logs = nil, nil
		m.mu.Unlock()
		if o, ok := output.(*containerIO); ok {
			o.detach()
		}
		if lw != nil {
			_ = lw.Close()
		}
	}
}

// housekeeping removes what is left of pods the API no longer has (deleted
// while the agent was down): their containers, network, directory and
// checkpoint entry, as the kubelet's orphaned-pod cleanup does.
func (m *Manager) housekeeping(ctx context.Context) error {
	known := map[types.UID]bool{}
	for _, obj := range m.pods.GetIndexer().List() {
		known[obj.(*corev1.Pod).UID] = true
	}
	orphans := map[types.UID]*corev1.Pod{} // the checkpoint's copy, when it has one
	containers, err := m.ctr.Containers(ctx, nil)
	if err != nil {
		return err
	}
	containerIDs := map[string]bool{}
	for _, c := range containers {
		containerIDs[c.ID] = true
		if uid := types.UID(c.Labels[podUIDLabel]); uid != "" && !known[uid] {
			orphans[uid] = nil
			if err := m.removeContainer(ctx, &containerState{id: c.ID}); err != nil {
				return err
			}
		}
	}
	if m.cfg.RemoveOrphanCgroups {
		n, err := removeOrphanCgroups(containerIDs, orphanCgroupAge)
		if n > 0 {
			m.log.Info("removed the cgroups of containers that no longer exist", "count", n)
		}
		if err != nil {
			m.log.Warn("removing the cgroups of containers that no longer exist", "err", err)
		}
	}
	if m.cfg.Checkpoint != nil {
		pods, err := m.cfg.Checkpoint.Pods()
		if err != nil {
			return err
		}
		for _, p := range pods {
			if !known[p.UID] {
				orphans[p.UID] = p
			}
		}
	}
	for uid, pod := range orphans {
		m.mu.Lock()
		_, running := m.running[uid]
		m.mu.Unlock()
		if running {
			continue // stopped through its own key
		}
		id := string(uid)
		if _, err := os.Stat(m.net.NSPath(id)); err == nil {
			namespace, name, ports := "", "", []podnet.PortMapping(nil)
			if pod != nil {
				namespace, name, ports = pod.Namespace, pod.Name, podnet.HostPorts(pod)
			}
			if err := m.net.TearDown(ctx, id, namespace, name, ports); err != nil {
				return err
			}
			if m.cfg.Policies != nil {
				m.cfg.Policies.Forget(uid)
			}
		}
		if err := m.tearDownVolumes(id); err != nil {
			return err
		}
		if m.cfg.Checkpoint != nil {
			if err := m.cfg.Checkpoint.DeletePod(uid); err != nil {
				return err
			}
		}
		m.log.Info("removed what was left of a deleted pod", "uid", uid)
	}
	return nil
}

// pod is the pod for key: the API's, or before the API has been heard
// from, the checkpoint's.
func (m *Manager) pod(key string) (*corev1.Pod, bool, error) {
	obj, exists, err := m.pods.GetIndexer().GetByKey(key)
	if err != nil || exists {
		if exists {
			return obj.(*corev1.Pod), true, nil
		}
		return nil, false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if p, ok := m.offline[key]; ok && !m.pods.HasSynced() {
		return p, true, nil
	}
	return nil, false, nil
}

func (m *Manager) ctx(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, orchctr.Namespace)
}

func (m *Manager) sync(ctx context.Context, key string) error {
	pod, exists, err := m.pod(key)
	if err != nil {
		return err
	}
	if !exists {
		return m.forgetByKey(ctx, key)
	}
	m.mu.Lock()
	st := m.running[pod.UID]
	m.mu.Unlock()
	switch {
	case pod.DeletionTimestamp != nil:
		m.mu.Lock()
		delete(m.retryAt, key)
		m.mu.Unlock()
		if st != nil {
			if err := m.stop(ctx, st, pod); err != nil {
				return err
			}
		}
		if err := m.reportFinal(ctx, pod, st); err != nil {
			return err
		}
		err := m.api.Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0), Preconditions: &metav1.Preconditions{UID: &pod.UID}})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		return err
	case st != nil && m.evicting(st):
		return m.carryOutEviction(ctx, st)
	case st != nil:
		m.mu.Lock()
		specChanged := !equality.Semantic.DeepEqual(st.pod.Spec, pod.Spec)
		st.grace, st.pod = graceOf(pod), pod
		m.mu.Unlock()
		if specChanged {
			m.checkpoint(pod)
		}
		if left, ok := deadlineLeft(pod, time.Now()); ok {
			if left <= 0 {
				return m.deadlineExceeded(ctx, st, pod)
			}
			m.queue.AddAfter(key, left)
		}
		return m.reconcile(ctx, pod, st)
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		m.forgetEviction(pod.UID) // the API has it ended: it stays so
		return nil
	}
	if report := m.evictionOf(pod.UID); report != nil {
		// Stopped already; the API has not taken its report yet.
		return m.reportEviction(ctx, pod, report)
	}
	if left, ok := deadlineLeft(pod, time.Now()); ok && left <= 0 {
		// Stopped at its deadline; the API has not taken the report yet.
		return m.deadlineExceeded(ctx, nil, pod)
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

// start sets up a new pod's sandbox (network, hosts files, termination
// logs) and hands it to reconcile, which runs its containers.
func (m *Manager) start(ctx context.Context, pod *corev1.Pod) error {
	if adopted, err := m.adopt(ctx, pod); adopted || err != nil {
		return err
	}
	m.mu.Lock()
	r, waiting := m.retryAt[pod.Namespace+"/"+pod.Name]
	m.mu.Unlock()
	if waiting && r.uid == pod.UID && time.Now().Before(r.at) {
		return nil
	}
	if m.isShuttingDown() {
		return m.reject(ctx, pod, shutdownRejectedReason, shutdownRejectedMessage)
	}
	if reason, message := m.admitted(pod); reason != "" {
		return m.reject(ctx, pod, reason, message)
	}
	if err := m.runtimeHandler(ctx, pod); err != nil {
		m.event(pod, "", corev1.EventTypeWarning, "FailedCreatePodSandBox", "Failed to create pod sandbox: %v", err)
		return err
	}
	images := map[string]containerd.Image{}
	for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		img, _, err := m.image(ctx, pod, c)
		if err != nil {
			var ce *configError
			if errors.As(err, &ce) {
				return m.waiting(ctx, pod, c, ce.reason, ce.message)
			}
			return err
		}
		images[c.Name] = img
	}
	m.mu.Lock()
	delete(m.retryAt, pod.Namespace+"/"+pod.Name)
	m.mu.Unlock()
	st := newPodState(pod)
	st.images = images
	if ptr.Deref(pod.Spec.ShareProcessNamespace, false) && !pod.Spec.HostPID {
		// Without a pause container nothing holds a pod-wide process
		// namespace: say so where `kubectl describe pod` shows it rather
		// than run the pod differently in silence.
		m.event(pod, "", corev1.EventTypeWarning, "ShareProcessNamespaceUnsupported",
			"shareProcessNamespace is not supported by this node: each container has its own process namespace")
	}
	if pod.Spec.HostNetwork {
		st.ip = m.cfg.NodeIP
	} else {
		if m.net.Stale(string(pod.UID)) {
			if err := m.net.Release(ctx, string(pod.UID), pod.Namespace, pod.Name, st.ports); err != nil {
				return err
			}
		}
		_, ip, err := m.net.SetUp(ctx, string(pod.UID), pod.Namespace, pod.Name, st.ports)
		if err != nil {
			return err
		}
		st.ip = ip
		if m.cfg.Policies != nil {
			actx, cancel := context.WithTimeout(ctx, admitTimeout)
			err := m.cfg.Policies.Admit(actx, pod, ip)
			cancel()
			if err != nil {
				// The next try sets the sandbox up afresh.
				m.cfg.Policies.Forget(pod.UID)
				if terr := m.net.TearDown(ctx, string(pod.UID), pod.Namespace, pod.Name, st.ports); terr != nil {
					m.log.Warn("pod network not torn down", "pod", st.key(), "err", terr)
				}
				return err
			}
		}
	}
	m.mu.Lock()
	m.running[pod.UID] = st
	m.mu.Unlock()
	m.checkpoint(pod)
	if err := m.setUpSharedNamespaces(pod); err != nil {
		return err
	}
	if err := m.writeEtcFiles(pod, st.ip); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(m.terminationLog(pod, "x")), 0o755); err != nil {
		return err
	}
	m.log.Info("pod sandbox ready", "pod", st.key(), "ip", st.ip)
	return m.reconcile(ctx, pod, st)
}

// runtimeHandler checks the pod's RuntimeClass names a handler this node
// has: runc, the only one its containerd runs (the RuntimeClass handler
// kubeadm and k3s clusters name "runc" too). As on a kubelet, a pod asking
// for another stays Pending, its sandbox refused. Without the API server
// the pod is started as it was before (a node keeps its pods offline).
func (m *Manager) runtimeHandler(ctx context.Context, pod *corev1.Pod) error {
	name := ptr.Deref(pod.Spec.RuntimeClassName, "")
	if name == "" {
		return nil
	}
	rc, err := m.api.RuntimeClasses().Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("RuntimeClass %q not found", name)
	case err != nil:
		m.log.Warn("RuntimeClass not checked", "pod", pod.Namespace+"/"+pod.Name, "runtimeClass", name, "err", err)
		return nil
	case rc.Handler != defaultRuntimeHandler:
		return fmt.Errorf("no runtime for %q is configured", rc.Handler)
	}
	return nil
}

// waiting reports a container that cannot start before its pod has a
// sandbox, and tries again later.
func (m *Manager) waiting(ctx context.Context, pod *corev1.Pod, c corev1.Container, reason, message string) error {
	updated := pod.DeepCopy()
	updated.Status.Phase = corev1.PodPending
	updated.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: c.Name, Image: c.Image,
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: message}}}}
	if _, err := m.api.Pods(pod.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	m.mu.Lock()
	m.retryAt[pod.Namespace+"/"+pod.Name] = retry{uid: pod.UID, at: time.Now().Add(waitingRetry)}
	m.mu.Unlock()
	m.queue.AddAfter(pod.Namespace+"/"+pod.Name, waitingRetry)
	return nil
}

// retry is when a waiting pod is tried again.
type retry struct {
	uid types.UID
	at  time.Time
}

// waitingRetry is how soon a pod that could not start tries again.
const waitingRetry = 10 * time.Second

// stop ends a pod's containers (preStop hooks, SIGTERM, SIGKILL once the
// grace period is over) and removes them, their snapshots, the pod's
// network, volumes and logs.
func (m *Manager) stop(ctx context.Context, st *podState, pod *corev1.Pod) error {
	m.mu.Lock()
	grace := st.grace
	all := st.all()
	for _, cs := range all {
		if cs.stopProbes != nil {
			cs.stopProbes()
		}
	}
	m.mu.Unlock()
	if pod != nil {
		grace = graceOf(pod)
	}
	deadline := time.Now().Add(grace)
	// The containers stop together, then the sidecars, the last declared
	// first, as the kubelet stops them: a log shipper or proxy sidecar
	// outlives what it serves (within the same grace period).
	var containers, sidecars []*containerState
	m.mu.Lock()
	for _, cs := range all {
		if cs.init && cs.spec != nil && sidecar(cs.spec) {
			sidecars = append([]*containerState{cs}, sidecars...)
		} else {
			containers = append(containers, cs)
		}
	}
	m.mu.Unlock()
	errs := make(chan error, len(containers))
	for _, cs := range containers {
		go func() { errs <- m.stopContainer(ctx, st, cs, deadline) }()
	}
	var firstErr error
	for range containers {
		if err := <-errs; err != nil && firstErr == nil {
			firstErr = err
		}
	}
	for _, cs := range sidecars {
		if err := m.stopContainer(ctx, st, cs, deadline); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	if firstErr != nil {
		return firstErr
	}
	if !st.hostNetwork {
		if err := m.net.TearDown(ctx, string(st.uid), st.namespace, st.name, st.ports); err != nil {
			return err
		}
		if m.cfg.Policies != nil {
			m.cfg.Policies.Forget(st.uid)
		}
	}
	if err := m.tearDownVolumes(string(st.uid)); err != nil {
		return err
	}
	if m.cfg.Checkpoint != nil {
		if err := m.cfg.Checkpoint.DeletePod(st.uid); err != nil {
			m.log.Error("checkpoint", "pod", st.key(), "err", err)
		}
	}
	m.mu.Lock()
	delete(m.running, st.uid)
	m.mu.Unlock()
	m.log.Info("pod stopped", "pod", st.key())
	return nil
}

// checkpoint records a pod the node runs.
func (m *Manager) checkpoint(pod *corev1.Pod) {
	if m.cfg.Checkpoint == nil {
		return
	}
	if err := m.cfg.Checkpoint.SavePod(pod); err != nil {
		m.log.Error("checkpoint", "pod", pod.Namespace+"/"+pod.Name, "err", err)
	}
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

// forgetByKey cleans up a pod that is gone from the API.
func (m *Manager) forgetByKey(ctx context.Context, key string) error {
	ns, name, _ := strings.Cut(key, "/")
	m.mu.Lock()
	delete(m.retryAt, key)
	anyEvicted := len(m.evicted) > 0
	var st *podState
	for _, s := range m.running {
		if s.namespace == ns && s.name == name {
			st = s
		}
	}
	m.mu.Unlock()
	if anyEvicted {
		m.forgetEvictionsOfGonePods()
	}
	if st == nil {
		return nil
	}
	return m.stop(ctx, st, nil)
}
