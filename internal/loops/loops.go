// Package loops runs the control loops of orch server: the scheduler and
// the controllers, each a goroutine that watches the API through client-go
// informers and writes back through the API, with the loops' own identity
// and never around validation or admission. Each loop is level-triggered:
// it compares what is with what should be, so a missed event is made good
// by the next one or the next resync.
package loops

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/loops/daemonset"
	"github.com/orch-dev/orch/internal/loops/deployment"
	"github.com/orch-dev/orch/internal/loops/endpoints"
	"github.com/orch-dev/orch/internal/loops/gc"
	"github.com/orch-dev/orch/internal/loops/job"
	"github.com/orch-dev/orch/internal/loops/namespace"
	"github.com/orch-dev/orch/internal/loops/nodeipam"
	"github.com/orch-dev/orch/internal/loops/nodelifecycle"
	"github.com/orch-dev/orch/internal/loops/podgc"
	"github.com/orch-dev/orch/internal/loops/replicaset"
	"github.com/orch-dev/orch/internal/loops/scheduler"
	"github.com/orch-dev/orch/internal/loops/serviceaccount"
	"k8s.io/client-go/rest"
)

// Options configure the loops.
type Options struct {
	Logger *slog.Logger
	// Resync re-delivers every cached object to the loops this often, so
	// that a missed event is made good (default 10 minutes).
	Resync time.Duration
	// ClusterCIDR is the pod network nodes get their ranges from
	// (default 10.42.0.0/16).
	ClusterCIDR string
	// NodeMonitorGracePeriod and NodeCheckEvery tune node health
	// (defaults 40 s and 5 s, as in Kubernetes).
	NodeMonitorGracePeriod, NodeCheckEvery time.Duration
	// PodGC tunes the pod garbage collector.
	PodGC podgc.Options
}

// Run starts every loop against the API server at cfg, calls started once
// their caches are in sync and they all run, and returns when ctx ends.
func Run(ctx context.Context, cfg *rest.Config, opts Options, started func()) error {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Resync <= 0 {
		opts.Resync = 10 * time.Minute
	}
	if opts.ClusterCIDR == "" {
		opts.ClusterCIDR = "10.42.0.0/16"
	}
	client, err := kube.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("loops client: %w", err)
	}
	factory := kube.NewInformers(client, opts.Resync)
	broadcaster := kube.NewEvents(ctx, client, opts.Logger)
	sched, err := scheduler.New(client, factory, broadcaster.Recorder(scheduler.Name), scheduler.Options{Logger: opts.Logger})
	if err != nil {
		return err
	}
	sets, err := replicaset.New(client, factory, broadcaster.Recorder("replicaset-controller"), opts.Logger)
	if err != nil {
		return err
	}
	deployments, err := deployment.New(client, factory, broadcaster.Recorder("deployment-controller"), opts.Logger)
	if err != nil {
		return err
	}
	namespaces, err := namespace.New(client, factory, opts.Logger)
	if err != nil {
		return err
	}
	accounts, err := serviceaccount.New(client, factory, opts.Logger)
	if err != nil {
		return err
	}
	ipam, err := nodeipam.New(client, factory, opts.ClusterCIDR, opts.Logger)
	if err != nil {
		return err
	}
	jobs, err := job.New(client, factory, broadcaster.Recorder("job-controller"), opts.Logger)
	if err != nil {
		return err
	}
	daemons, err := daemonset.New(client, factory, broadcaster.Recorder("daemonset-controller"), opts.Logger)
	if err != nil {
		return err
	}
	opts.PodGC.Logger = opts.Logger
	podCollector := podgc.New(client, factory, opts.PodGC)
	eps, err := endpoints.New(client, factory, opts.Logger)
	if err != nil {
		return err
	}
	lifecycle := nodelifecycle.New(client, factory, broadcaster.Recorder("node-controller"),
		nodelifecycle.Options{GracePeriod: opts.NodeMonitorGracePeriod, CheckEvery: opts.NodeCheckEvery, Logger: opts.Logger})
	collector := gc.New(client, opts.Resync, opts.Logger)
	if err := collector.Start(ctx); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("loops: %v cache never synced", typ)
		}
	}
	go sched.Run(ctx)
	go sets.Run(ctx, 4)
	go deployments.Run(ctx, 4)
	go collector.Run(ctx, 4)
	go namespaces.Run(ctx, 2)
	go accounts.Run(ctx, 2)
	go ipam.Run(ctx)
	go eps.Run(ctx, 4)
	go lifecycle.Run(ctx)
	go jobs.Run(ctx, 4)
	go daemons.Run(ctx, 2)
	go podCollector.Run(ctx)
	opts.Logger.Info("control loops started")
	if started != nil {
		started()
	}
	<-ctx.Done()
	return nil
}
