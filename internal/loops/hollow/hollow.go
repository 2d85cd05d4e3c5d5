// Package hollow runs hollow nodes, as kubemark does: Node objects that
// renew their Leases, and a fake kubelet that reports the pods bound to
// them Running and Ready and finishes their deletion, all without
// containers. The loops are tested and benchmarked against hollow nodes;
// the real pod flow is the agent's to prove.
package hollow

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

// NodeOptions shape one hollow node.
type NodeOptions struct {
	CPU    string // allocatable; default "4"
	Memory string // default "8Gi"
	Pods   int    // default 110
	Labels map[string]string
	Taints []corev1.Taint
	// Extended are extended resources the node has (a device plugin's).
	Extended corev1.ResourceList
}

// Options shape the cluster of hollow nodes.
type Options struct {
	// LeaseEvery is how often each node renews its Lease (default 10 s,
	// the kubelet's); negative never renews after creating it.
	LeaseEvery time.Duration
	// Workers report pod status concurrently (default 8).
	Workers int
	Logger  *slog.Logger
	// Clock stamps the Leases' renewals (default the real one); the loops'
	// tests give the fake clock their loops run on. Renewals still come
	// every LeaseEvery of real time.
	Clock clock.PassiveClock
}

func (c *Cluster) clock() clock.PassiveClock {
	if c.opts.Clock == nil {
		return clock.RealClock{}
	}
	return c.opts.Clock
}

// Cluster is a set of hollow nodes sharing one fake kubelet.
type Cluster struct {
	client kubernetes.Interface
	opts   Options
	queue  workqueue.TypedRateLimitingInterface[string]
	pods   toolscache.SharedIndexInformer

	mu    sync.Mutex
	nodes map[string]*hollowNode
}

type hollowNode struct {
	index    int
	silenced bool // stopped renewing its Lease, as a node that lost power
	nextIP   int
}

// New returns a cluster with no nodes; Run starts its kubelet.
func New(client kubernetes.Interface, opts Options) *Cluster {
	if opts.LeaseEvery == 0 {
		opts.LeaseEvery = 10 * time.Second
	}
	if opts.Workers <= 0 {
		opts.Workers = 8
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	c := &Cluster{client: client, opts: opts, nodes: map[string]*hollowNode{}}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = "spec.nodeName!="
	}))
	c.pods = factory.Core().V1().Pods().Informer()
	_, _ = c.pods.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.enqueue(obj) },
		UpdateFunc: func(_, obj any) { c.enqueue(obj) },
	})
	return c
}

// AddNode registers a Ready node with its Lease.
func (c *Cluster) AddNode(ctx context.Context, name string, o NodeOptions) error {
	if o.CPU == "" {
		o.CPU = "4"
	}
	if o.Memory == "" {
		o.Memory = "8Gi"
	}
	if o.Pods == 0 {
		o.Pods = 110
	}
	labels := map[string]string{corev1.LabelHostname: name, corev1.LabelOSStable: "linux", corev1.LabelArchStable: "amd64"}
	for k, v := range o.Labels {
		labels[k] = v
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse(o.CPU), corev1.ResourceMemory: resource.MustParse(o.Memory),
		corev1.ResourcePods: *resource.NewQuantity(int64(o.Pods), resource.DecimalSI), corev1.ResourceEphemeralStorage: resource.MustParse("100Gi"),
	}
	for name, q := range o.Extended {
		capacity[name] = q
	}
	now := metav1.Now()
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec:       corev1.NodeSpec{Taints: o.Taints},
		Status: corev1.NodeStatus{
			Capacity: capacity, Allocatable: capacity,
			Conditions: []corev1.NodeCondition{
				{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "hollow kubelet is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now},
				{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientMemory", LastHeartbeatTime: now, LastTransitionTime: now},
				{Type: corev1.NodeDiskPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasNoDiskPressure", LastHeartbeatTime: now, LastTransitionTime: now},
				{Type: corev1.NodePIDPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientPID", LastHeartbeatTime: now, LastTransitionTime: now},
			},
			NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "v1.37.2-hollow", OperatingSystem: "linux", Architecture: "amd64", ContainerRuntimeVersion: "hollow://1"},
		},
	}
	c.mu.Lock()
	index := len(c.nodes)
	c.nodes[name] = &hollowNode{index: index}
	c.mu.Unlock()
	created, err := c.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create hollow node %s: %w", name, err)
	}
	// Status is a subresource: the create kept none of it. The loops may
	// change the node meanwhile (its pod CIDR), hence the retry.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		created.Status = node.Status
		_, err := c.client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			if latest, gerr := c.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); gerr == nil {
				created = latest
			}
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("hollow node %s status: %w", name, err)
	}
	return c.renew(ctx, name)
}

// Silence stops a node's Lease renewals and its kubelet, as when the
// machine loses power.
func (c *Cluster) Silence(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := c.nodes[name]; n != nil {
		n.silenced = true
	}
}

// Run renews Leases and reports pod status until ctx ends.
func (c *Cluster) Run(ctx context.Context) {
	// Made here, not in New: a queue runs a goroutine from its start, and
	// a cluster that is never Run (nodes only) would leave it running.
	c.queue = workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	defer c.queue.ShutDown()
	go c.pods.RunWithContext(ctx)
	if !toolscache.WaitForCacheSync(ctx.Done(), c.pods.HasSynced) {
		return
	}
	for range c.opts.Workers {
		go func() {
			for c.work(ctx) {
			}
		}()
	}
	if c.opts.LeaseEvery > 0 {
		go c.renewLoop(ctx)
	}
	<-ctx.Done()
}

func (c *Cluster) renewLoop(ctx context.Context) {
	t := time.NewTicker(c.opts.LeaseEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.mu.Lock()
		var names []string
		for name, n := range c.nodes {
			if !n.silenced {
				names = append(names, name)
			}
		}
		c.mu.Unlock()
		for _, name := range names {
			if err := c.renew(ctx, name); err != nil && ctx.Err() == nil {
				c.opts.Logger.Warn("hollow lease renewal", "node", name, "err", err)
			}
		}
	}
}

// renew creates or renews the node's Lease in kube-node-lease.
func (c *Cluster) renew(ctx context.Context, name string) error {
	leases := c.client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	now := metav1.NewMicroTime(c.clock().Now())
	lease, err := leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(name), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now},
		}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil // the renewal loop created it first
		}
		return err
	}
	if err != nil {
		return err
	}
	lease.Spec.RenewTime = &now
	_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		return nil // renewed concurrently
	}
	return err
}

func (c *Cluster) enqueue(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	c.mu.Lock()
	n, ours := c.nodes[pod.Spec.NodeName]
	silent := ours && n.silenced
	c.mu.Unlock()
	if !ours || silent {
		return // a silenced node's kubelet is gone with it
	}
	_, finishes := pod.Annotations[RunForAnnotation]
	if pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodPending || pod.Status.Phase == "" ||
		finishes && pod.Status.Phase == corev1.PodRunning {
		c.queue.Add(pod.Namespace + "/" + pod.Name)
	}
}

func (c *Cluster) work(ctx context.Context) bool {
	k, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(k)
	if err := c.sync(ctx, k); err != nil && ctx.Err() == nil {
		c.queue.AddRateLimited(k)
		return true
	}
	c.queue.Forget(k)
	return true
}

// sync does what a kubelet does for a pod: start it (Running, Ready, an
// IP) or, once it is being deleted, finish it.
func (c *Cluster) sync(ctx context.Context, k string) error {
	obj, exists, err := c.pods.GetIndexer().GetByKey(k)
	if err != nil || !exists {
		return err
	}
	pod := obj.(*corev1.Pod)
	pods := c.client.CoreV1().Pods(pod.Namespace)
	if pod.DeletionTimestamp != nil {
		err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0), Preconditions: &metav1.Preconditions{UID: &pod.UID}})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		return err
	}
	if pod.Status.Phase == corev1.PodRunning {
		return c.finish(ctx, k, pod)
	}
	if pod.Status.Phase != corev1.PodPending && pod.Status.Phase != "" {
		return nil
	}
	pod = pod.DeepCopy()
	now := metav1.Now()
	pod.Status.Phase = corev1.PodRunning
	pod.Status.StartTime = &now
	pod.Status.HostIP = c.hostIP(pod.Spec.NodeName)
	pod.Status.PodIP = c.podIP(pod.Spec.NodeName)
	pod.Status.PodIPs = []corev1.PodIP{{IP: pod.Status.PodIP}}
	pod.Status.Conditions = nil
	for _, t := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: now})
	}
	pod.Status.ContainerStatuses = nil
	for _, ctr := range pod.Spec.Containers {
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: ctr.Name, Image: ctr.Image, ImageID: "hollow://" + ctr.Image, ContainerID: "hollow://" + strings.ReplaceAll(string(pod.UID), "-", "")[:12],
			Ready: true, Started: ptr.To(true), State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
	}
	_, err = pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// Annotations that make a hollow pod's containers exit, for testing Jobs.
const (
	// RunForAnnotation: the containers exit this long (a Go duration)
	// after the pod started.
	RunForAnnotation = "hollow.orch.dev/run-for"
	// ExitCodeAnnotation: the code they exit with (default 0).
	ExitCodeAnnotation = "hollow.orch.dev/exit-code"
)

// finish ends a running pod whose RunForAnnotation time is up: Succeeded
// on exit code 0, Failed otherwise (hollow pods never restart).
func (c *Cluster) finish(ctx context.Context, k string, pod *corev1.Pod) error {
	runFor, err := time.ParseDuration(pod.Annotations[RunForAnnotation])
	if err != nil || pod.Status.StartTime == nil {
		return nil
	}
	if left := time.Until(pod.Status.StartTime.Add(runFor)); left > 0 {
		c.queue.AddAfter(k, left)
		return nil
	}
	code, _ := strconv.Atoi(pod.Annotations[ExitCodeAnnotation])
	pod = pod.DeepCopy()
	now := metav1.Now()
	reason := "Completed"
	pod.Status.Phase = corev1.PodSucceeded
	if code != 0 {
		pod.Status.Phase, reason = corev1.PodFailed, "Error"
	}
	for i := range pod.Status.Conditions {
		if t := pod.Status.Conditions[i].Type; t == corev1.PodReady || t == corev1.ContainersReady {
			pod.Status.Conditions[i].Status, pod.Status.Conditions[i].Reason, pod.Status.Conditions[i].LastTransitionTime = corev1.ConditionFalse, "PodCompleted", now
		}
	}
	for i := range pod.Status.ContainerStatuses {
		cs := &pod.Status.ContainerStatuses[i]
		started := now
		if cs.State.Running != nil {
			started = cs.State.Running.StartedAt
		}
		cs.Ready, cs.Started = false, ptr.To(false)
		cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: int32(code), Reason: reason, StartedAt: started, FinishedAt: now}}
	}
	_, err = c.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// hostIP is 10.255.x.y for the node's index: hollow nodes have no network.
func (c *Cluster) hostIP(node string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := c.nodes[node].index
	return netip.AddrFrom4([4]byte{10, 255, byte(i >> 8), byte(i)}).String()
}

// podIP hands out addresses from 10.<200+i/256>.<i%256>.0/24 per node.
func (c *Cluster) podIP(node string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[node]
	n.nextIP = n.nextIP%253 + 1
	return netip.AddrFrom4([4]byte{10, byte(200 + n.index/256), byte(n.index), byte(n.nextIP)}).String()
}
