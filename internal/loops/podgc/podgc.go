// Package podgc cleans up pods nobody else will, as Kubernetes' pod
// garbage collector does: finished pods beyond a threshold (oldest first),
// pods bound to nodes that no longer exist, and pods being deleted that
// were never scheduled (no kubelet will ever confirm them).
package podgc

import (
	"context"
	"log/slog"
	"sort"
	"time"

	"github.com/orch-dev/orch/internal/kube"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

// Options tune the collector; zero values are Kubernetes' defaults.
type Options struct {
	// TerminatedThreshold is how many finished pods are kept
	// (--terminated-pod-gc-threshold, 12500).
	TerminatedThreshold int
	// CheckEvery is how often pods are looked at (20 s).
	CheckEvery time.Duration
	Logger     *slog.Logger
	// Clock is what the checks run on (default real).
	Clock clock.WithTicker
}

// Collector is the pod garbage collection loop.
type Collector struct {
	client *kube.Client
	pods   corelisters.PodLister
	nodes  corelisters.NodeLister
	synced []toolscache.InformerSynced
	opts   Options
	log    *slog.Logger
}

// New registers the collector's informers.
func New(client *kube.Client, factory *kube.Informers, opts Options) *Collector {
	if opts.TerminatedThreshold <= 0 {
		opts.TerminatedThreshold = 12500
	}
	if opts.CheckEvery <= 0 {
		opts.CheckEvery = 20 * time.Second
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	pods, nodes := factory.Pods(), factory.Nodes()
	return &Collector{client: client, pods: pods.Lister(), nodes: nodes.Lister(), opts: opts, log: opts.Logger.With("loop", "podgc"),
		synced: []toolscache.InformerSynced{pods.Informer().HasSynced, nodes.Informer().HasSynced}}
}

// Run collects every CheckEvery until ctx ends.
func (c *Collector) Run(ctx context.Context) {
	if !toolscache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return
	}
	t := c.opts.Clock.NewTicker(c.opts.CheckEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		if err := c.collect(ctx); err != nil && ctx.Err() == nil {
			c.log.Warn("pod garbage collection", "err", err)
		}
	}
}

func (c *Collector) collect(ctx context.Context) error {
	pods, err := c.pods.List(labels.Everything())
	if err != nil {
		return err
	}
	var finished []*corev1.Pod
	for _, p := range pods {
		switch {
		case p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed:
			finished = append(finished, p)
		case p.Spec.NodeName == "" && p.DeletionTimestamp != nil:
			if err := c.forceDelete(ctx, p, "terminating and never scheduled"); err != nil {
				return err
			}
		case p.Spec.NodeName != "" && c.nodeGone(ctx, p.Spec.NodeName):
			if err := c.forceDelete(ctx, p, "its node "+p.Spec.NodeName+" is gone"); err != nil {
				return err
			}
		}
	}
	if excess := len(finished) - c.opts.TerminatedThreshold; excess > 0 {
		sort.Slice(finished, func(i, j int) bool {
			a, b := finished[i], finished[j]
			if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
				return a.CreationTimestamp.Before(&b.CreationTimestamp)
			}
			return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
		})
		for _, p := range finished[:excess] {
			if err := c.forceDelete(ctx, p, "finished pods over the threshold"); err != nil {
				return err
			}
		}
	}
	return nil
}

// nodeGone asks the API, not the cache: a node the cache has not seen yet
// must not cost its pods.
func (c *Collector) nodeGone(ctx context.Context, name string) bool {
	if _, err := c.nodes.Get(name); err == nil {
		return false
	}
	_, err := c.client.Nodes().Get(ctx, name, metav1.GetOptions{})
	return apierrors.IsNotFound(err)
}

func (c *Collector) forceDelete(ctx context.Context, p *corev1.Pod, why string) error {
	err := c.client.Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0), Preconditions: &metav1.Preconditions{UID: &p.UID}})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	if err == nil {
		c.log.Info("deleted pod", "pod", p.Namespace+"/"+p.Name, "why", why)
	}
	return err
}
