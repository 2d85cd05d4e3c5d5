// Package nodeipam gives each node its pod network: a /24 (for IPv4) out
// of the cluster CIDR in spec.podCIDR, freed when the node is deleted, as
// Kubernetes' node IPAM controller does with its range allocator.
package nodeipam

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/big"
	"net/netip"
	"sync"

	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/loops/controller"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Controller is the node IPAM loop.
type Controller struct {
	client *kube.Client
	nodes  corelisters.NodeLister
	synced toolscache.InformerSynced
	queue  workqueue.TypedRateLimitingInterface[string]
	log    *slog.Logger

	cluster netip.Prefix
	bits    int // prefix length of a node's range
	mu      sync.Mutex
	used    map[netip.Prefix]string // range → node
}

// New allocates node ranges of nodeBits (24 for IPv4 as in Kubernetes'
// default, 64 for IPv6) from clusterCIDR.
func New(client *kube.Client, factory *kube.Informers, clusterCIDR string, env controller.Env) (*Controller, error) {
	cluster, err := netip.ParsePrefix(clusterCIDR)
	if err != nil {
		return nil, fmt.Errorf("cluster CIDR %q: %w", clusterCIDR, err)
	}
	cluster = cluster.Masked()
	bits := 24
	if cluster.Addr().Is6() {
		bits = 64
	}
	if cluster.Bits() > bits {
		return nil, fmt.Errorf("cluster CIDR %s is smaller than one node's /%d", cluster, bits)
	}
	nodes := factory.Nodes()
	c := &Controller{
		client: client, nodes: nodes.Lister(), synced: nodes.Informer().HasSynced, log: env.Log.With("loop", "nodeipam"),
		queue:   workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](), workqueue.TypedRateLimitingQueueConfig[string]{Name: "nodeipam", Clock: env.Clock, MetricsProvider: env.Metrics}),
		cluster: cluster, bits: bits, used: map[netip.Prefix]string{},
	}
	if _, err := nodes.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.observe(obj.(*corev1.Node)) },
		UpdateFunc: func(_, obj any) { c.observe(obj.(*corev1.Node)) },
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if n, ok := obj.(*corev1.Node); ok {
				c.release(n.Name)
			}
		},
	}); err != nil {
		return nil, err
	}
	return c, nil
}

// observe records a node's range, or queues it for one.
func (c *Controller) observe(n *corev1.Node) {
	if n.Spec.PodCIDR == "" {
		c.queue.Add(n.Name)
		return
	}
	if p, err := netip.ParsePrefix(n.Spec.PodCIDR); err == nil {
		c.mu.Lock()
		c.used[p.Masked()] = n.Name
		c.mu.Unlock()
	}
}

func (c *Controller) release(node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for p, owner := range c.used {
		if owner == node {
			delete(c.used, p)
		}
	}
}

// Run allocates until ctx ends; ranges are handed out one at a time.
func (c *Controller) Run(ctx context.Context) {
	defer c.queue.ShutDown()
	if !toolscache.WaitForCacheSync(ctx.Done(), c.synced) {
		return
	}
	go func() { <-ctx.Done(); c.queue.ShutDown() }()
	for {
		name, quit := c.queue.Get()
		if quit {
			return
		}
		if err := c.allocate(ctx, name); err != nil {
			c.log.Warn("allocating a pod CIDR", "node", name, "err", err)
			c.queue.AddRateLimited(name)
		} else {
			c.queue.Forget(name)
		}
		c.queue.Done(name)
	}
}

func (c *Controller) allocate(ctx context.Context, name string) error {
	// Read live: the cache may not show the range this controller just
	// gave, and a second range must never be handed out.
	node, err := c.client.Nodes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if node.Spec.PodCIDR != "" {
		c.observe(node)
		return nil
	}
	c.mu.Lock()
	p, ok := c.next()
	if ok {
		c.used[p] = name
	}
	c.mu.Unlock()
	if !ok {
		return fmt.Errorf("no pod CIDR left in %s", c.cluster)
	}
	// The resourceVersion makes the patch fail if the node changed since.
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": node.ResourceVersion},
		"spec": map[string]any{"podCIDR": p.String(), "podCIDRs": []string{p.String()}}})
	if _, err := c.client.Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		c.mu.Lock()
		delete(c.used, p)
		c.mu.Unlock()
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	c.log.Info("pod CIDR allocated", "node", name, "podCIDR", p.String())
	return nil
}

// next is the lowest free node range.
func (c *Controller) next() (netip.Prefix, bool) {
	count := 1 << min(c.bits-c.cluster.Bits(), 20)
	base := new(big.Int).SetBytes(c.cluster.Addr().AsSlice())
	step := new(big.Int).Lsh(big.NewInt(1), uint(c.cluster.Addr().BitLen()-c.bits))
	for i := range count {
		n := new(big.Int).Add(base, new(big.Int).Mul(big.NewInt(int64(i)), step))
		raw := n.FillBytes(make([]byte, c.cluster.Addr().BitLen()/8))
		addr, _ := netip.AddrFromSlice(raw)
		p := netip.PrefixFrom(addr, c.bits)
		if _, taken := c.used[p]; !taken {
			return p, true
		}
	}
	return netip.Prefix{}, false
}
