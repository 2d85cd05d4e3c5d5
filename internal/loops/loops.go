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
	"sync"
	"time"

	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/loops/certificates"
	"github.com/orch-dev/orch/internal/loops/clusterdns"
	"github.com/orch-dev/orch/internal/loops/clusterroleaggregation"
	"github.com/orch-dev/orch/internal/loops/controller"
	"github.com/orch-dev/orch/internal/loops/cronjob"
	"github.com/orch-dev/orch/internal/loops/daemonset"
	"github.com/orch-dev/orch/internal/loops/deployment"
	"github.com/orch-dev/orch/internal/loops/disruption"
	"github.com/orch-dev/orch/internal/loops/endpoints"
	"github.com/orch-dev/orch/internal/loops/gateway"
	"github.com/orch-dev/orch/internal/loops/gc"
	"github.com/orch-dev/orch/internal/loops/ingressstatus"
	"github.com/orch-dev/orch/internal/loops/job"
	"github.com/orch-dev/orch/internal/loops/legacytoken"
	"github.com/orch-dev/orch/internal/loops/namespace"
	"github.com/orch-dev/orch/internal/loops/nodeipam"
	"github.com/orch-dev/orch/internal/loops/nodelifecycle"
	"github.com/orch-dev/orch/internal/loops/podautoscaler"
	"github.com/orch-dev/orch/internal/loops/podgc"
	"github.com/orch-dev/orch/internal/loops/replicaset"
	"github.com/orch-dev/orch/internal/loops/resourcequota"
	"github.com/orch-dev/orch/internal/loops/rootcacert"
	"github.com/orch-dev/orch/internal/loops/scheduler"
	"github.com/orch-dev/orch/internal/loops/serviceaccount"
	"github.com/orch-dev/orch/internal/loops/servicelb"
	"github.com/orch-dev/orch/internal/loops/statefulset"
	"github.com/orch-dev/orch/internal/loops/storagemigration"
	"github.com/orch-dev/orch/internal/loops/upgrade"
	"github.com/orch-dev/orch/internal/loops/volume"
	"github.com/orch-dev/orch/internal/metrics"
	"github.com/orch-dev/orch/internal/upgradeapi"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
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
	// Clock is what every loop's timers run on (default the real one);
	// tests step a fake one.
	Clock clock.WithTicker
	// DisableServiceLB leaves LoadBalancer Services to another load
	// balancer (MetalLB): k3s's --disable servicelb.
	DisableServiceLB bool
	// DisableGateway makes no GatewayClass orch: Gateways are left to
	// another implementation (the Gateway API's definitions are still
	// installed, unless a newer release is).
	DisableGateway bool
	// LocalStoragePath is the directory on each node under which the
	// local-path provisioner makes volumes; empty provisions none.
	LocalStoragePath string
	// RemoveLocalVolume asks a node's agent to remove the directory of a
	// local-path volume it holds; nil leaves the data in place.
	RemoveLocalVolume func(ctx context.Context, node, pv string) error
	// RootCA gives the cluster CA (PEM) every namespace's kube-root-ca.crt
	// ConfigMap publishes (a rotation changes it); without it there is
	// none.
	RootCA func() []byte
	// IssueLegacyToken signs the tokens of kubernetes.io/service-account-token
	// Secrets; without it they are not filled in.
	IssueLegacyToken legacytoken.Issue
	// SignCertificate issues the certificates of approved
	// CertificateSigningRequests of the built-in signers, with the
	// cluster CA; without it none is signed.
	SignCertificate certificates.Sign
	// AutoscalerSyncPeriod is how often each HorizontalPodAutoscaler is
	// looked at (default 15 s, as in Kubernetes).
	AutoscalerSyncPeriod time.Duration
	// Metrics, when set, is where the loops' work queues and the
	// scheduler register their metrics.
	Metrics prometheus.Registerer
	// Releases says the sha256 of the orch binaries the server holds for
	// its nodes' upgrades; without it no Upgrade plan can run.
	Releases upgrade.Releases
	// Servers lists the cluster's API servers (upgrade.Options).
	Servers func(ctx context.Context) ([]upgradeapi.Server, error)
	// ServerReady checks the API server on a server's node (upgrade.Options).
	ServerReady func(ctx context.Context, node *corev1.Node) error
}

// Run starts every loop against the API server at cfg, calls started once
// their caches are in sync and they all run, and returns when ctx has
// ended and every loop has stopped.
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
	env := controller.Env{Log: opts.Logger, Clock: opts.Clock}.WithDefaults()
	if opts.Metrics != nil {
		// Their collectors leave the registry when the loops stop, so that
		// a server leading them again registers its new ones.
		scope := metrics.NewScope(opts.Metrics)
		defer scope.Close()
		opts.Metrics = scope
		env.Metrics = metrics.Workqueues(scope)
	}
	client, err := kube.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("loops client: %w", err)
	}
	factory := kube.NewInformers(client, opts.Resync)
	broadcaster := kube.NewEvents(ctx, client, opts.Logger)
	sched, err := scheduler.New(client, factory, broadcaster.Recorder(scheduler.Name), scheduler.Options{Logger: opts.Logger, Clock: env.Clock, Metrics: opts.Metrics, Workqueues: env.Metrics})
	if err != nil {
		return err
	}
	sets, err := replicaset.New(client, factory, broadcaster.Recorder("replicaset-controller"), env)
	if err != nil {
		return err
	}
	rcs, err := replicaset.NewForReplicationControllers(client, factory, broadcaster.Recorder("replication-controller"), env)
	if err != nil {
		return err
	}
	deployments, err := deployment.New(client, factory, broadcaster.Recorder("deployment-controller"), env)
	if err != nil {
		return err
	}
	scales := kube.NewScales(client)
	budgets, err := disruption.New(client, factory, scales, broadcaster.Recorder("controllermanager"), env)
	if err != nil {
		return err
	}
	autoscalers, err := podautoscaler.New(client, factory, podautoscaler.NewInformerScales(factory, scales), podautoscaler.MetricsAPI{Client: client}, broadcaster.Recorder("horizontal-pod-autoscaler"), opts.AutoscalerSyncPeriod, env)
	if err != nil {
		return err
	}
	namespaces, err := namespace.New(client, factory, env)
	if err != nil {
		return err
	}
	accounts, err := serviceaccount.New(client, factory, env)
	if err != nil {
		return err
	}
	ipam, err := nodeipam.New(client, factory, opts.ClusterCIDR, env)
	if err != nil {
		return err
	}
	jobs, err := job.New(client, factory, broadcaster.Recorder("job-controller"), env)
	if err != nil {
		return err
	}
	cronJobs, err := cronjob.New(client, factory, broadcaster.Recorder("cronjob-controller"), env)
	if err != nil {
		return err
	}
	volumes, err := volume.New(client, factory, broadcaster.Recorder("persistentvolume-controller"),
		volume.Options{StoragePath: opts.LocalStoragePath, RemoveDir: opts.RemoveLocalVolume}, env)
	if err != nil {
		return err
	}
	statefulSets, err := statefulset.New(client, factory, broadcaster.Recorder("statefulset-controller"), env)
	if err != nil {
		return err
	}
	daemons, err := daemonset.New(client, factory, broadcaster.Recorder("daemonset-controller"), env)
	if err != nil {
		return err
	}
	opts.PodGC.Logger, opts.PodGC.Clock = opts.Logger, env.Clock
	podCollector := podgc.New(client, factory, opts.PodGC)
	eps, err := endpoints.New(client, factory, env)
	if err != nil {
		return err
	}
	mirror, err := endpoints.NewMirror(client, factory, env)
	if err != nil {
		return err
	}
	dnsEndpoints, err := clusterdns.New(client, factory, env)
	if err != nil {
		return err
	}
	aggregation, err := clusterroleaggregation.New(client, factory, env)
	if err != nil {
		return err
	}
	quotas, err := resourcequota.New(client, factory, env)
	if err != nil {
		return err
	}
	var rootCA *rootcacert.Controller
	if opts.RootCA == nil {
		opts.RootCA = func() []byte { return nil }
	} else if rootCA, err = rootcacert.New(client, factory, opts.RootCA, env); err != nil {
		return err
	}
	var legacyTokens *legacytoken.Controller
	if opts.IssueLegacyToken != nil {
		if legacyTokens, err = legacytoken.New(client, factory, opts.IssueLegacyToken, opts.RootCA, env); err != nil {
			return err
		}
	}
	csrs, err := certificates.New(client, factory, opts.SignCertificate, certificates.Options{}, env)
	if err != nil {
		return err
	}
	migrations, err := storagemigration.New(client, factory, env)
	if err != nil {
		return err
	}
	status, err := ingressstatus.New(client, factory, env)
	if err != nil {
		return err
	}
	// The Gateway API's kinds are served before their informers start.
	if err := gateway.Install(ctx, client, !opts.DisableGateway, opts.Logger.With("loop", "gateway")); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	gateways, err := gateway.New(client, factory, env)
	if err != nil {
		return err
	}
	if err := upgrade.Install(ctx, client, opts.Logger.With("loop", "upgrade")); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	if opts.Releases == nil {
		opts.Releases = func(_ context.Context, version, platform string) (string, error) {
			return "", fmt.Errorf("orch %s for %s is not staged: this server holds no releases", version, platform)
		}
	}
	upgrades, err := upgrade.New(client, factory, upgrade.Options{Releases: opts.Releases, Servers: opts.Servers, ServerReady: opts.ServerReady}, env)
	if err != nil {
		return err
	}
	var lb *servicelb.Controller
	if !opts.DisableServiceLB {
		if lb, err = servicelb.New(client, factory, env); err != nil {
			return err
		}
	}
	lifecycle := nodelifecycle.New(client, factory, broadcaster.Recorder("node-controller"),
		nodelifecycle.Options{GracePeriod: opts.NodeMonitorGracePeriod, CheckEvery: opts.NodeCheckEvery, Logger: opts.Logger, Clock: env.Clock})
	collector := gc.New(client, factory, opts.Resync, env)
	if err := collector.Start(ctx); err != nil {
		return err
	}
	factory.Start(ctx)
	defer factory.Shutdown()
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("loops: %v cache never synced", typ)
		}
	}
	// Run returns only once every loop has: nothing of them writes after.
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { sched.Run(ctx) })
	wg.Go(func() { sets.Run(ctx, 4) })
	wg.Go(func() { rcs.Run(ctx, 2) })
	wg.Go(func() { deployments.Run(ctx, 4) })
	wg.Go(func() { budgets.Run(ctx, 2) })
	wg.Go(func() { autoscalers.Run(ctx, 2) })
	wg.Go(func() { collector.Run(ctx, 4) })
	wg.Go(func() { namespaces.Run(ctx, 2) })
	wg.Go(func() { accounts.Run(ctx, 2) })
	wg.Go(func() { ipam.Run(ctx) })
	wg.Go(func() { eps.Run(ctx, 4) })
	wg.Go(func() { mirror.Run(ctx, 1) })
	wg.Go(func() { dnsEndpoints.Run(ctx) })
	wg.Go(func() { aggregation.Run(ctx, 1) })
	wg.Go(func() { lifecycle.Run(ctx) })
	wg.Go(func() { jobs.Run(ctx, 4) })
	wg.Go(func() { daemons.Run(ctx, 2) })
	wg.Go(func() { cronJobs.Run(ctx, 2) })
	wg.Go(func() { volumes.Run(ctx, 2) })
	wg.Go(func() { statefulSets.Run(ctx, 2) })
	wg.Go(func() { podCollector.Run(ctx) })
	wg.Go(func() { gateways.Run(ctx) })
	wg.Go(func() { upgrades.Run(ctx) })
	wg.Go(func() { quotas.Run(ctx, 2) })
	wg.Go(func() { csrs.Run(ctx, 1) })
	wg.Go(func() { migrations.Run(ctx) })
	if rootCA != nil {
		wg.Go(func() { rootCA.Run(ctx, 2) })
	}
	if legacyTokens != nil {
		wg.Go(func() { legacyTokens.Run(ctx, 2) })
	}
	if lb != nil {
		wg.Go(func() { lb.Run(ctx, 2) })
	}
	wg.Go(func() { status.Run(ctx, 1) })
	opts.Logger.Info("control loops started")
	if started != nil {
		started()
	}
	<-ctx.Done()
	return nil
}
