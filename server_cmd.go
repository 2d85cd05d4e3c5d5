package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/orch-dev/orch/internal/agent"
	"github.com/orch-dev/orch/internal/api"
	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/loops"
	"github.com/orch-dev/orch/internal/loops/leader"
	"github.com/orch-dev/orch/internal/memtrim"
	"github.com/robfig/cron/v3"
	"github.com/urfave/cli/v2"
	"k8s.io/klog/v2"
)

// serverCommand is `orch server`: the control plane. Flags follow k3s; each
// has an ORCH_* environment variable.
func serverCommand() *cli.Command {
	return &cli.Command{
		Name:  "server",
		Usage: "run the control plane (API server, scheduler, controllers)",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "data-dir", Value: "/var/lib/orch", EnvVars: []string{"ORCH_DATA_DIR"}, Usage: "where the store, certificates and token live"},
			&cli.StringFlag{Name: "bind-address", Value: "0.0.0.0", EnvVars: []string{"ORCH_BIND_ADDRESS"}, Usage: "address the API server listens on"},
			&cli.IntFlag{Name: "https-listen-port", Value: 6443, EnvVars: []string{"ORCH_HTTPS_LISTEN_PORT"}, Usage: "API server port"},
			&cli.StringFlag{Name: "advertise-address", EnvVars: []string{"ORCH_ADVERTISE_ADDRESS"}, Usage: "address agents and the kubernetes Service reach the API on (default: first host IPv4)"},
			&cli.StringFlag{Name: "token", EnvVars: []string{"ORCH_TOKEN"}, Usage: "join secret agents present (default: generated, see DATA/server/token)"},
			&cli.StringFlag{Name: "token-auth-file", EnvVars: []string{"ORCH_TOKEN_AUTH_FILE"}, Usage: "CSV of bearer tokens: token,user,uid,\"group1,group2\""},
			&cli.StringFlag{Name: "write-kubeconfig", Value: "/etc/orch/orch.yaml", EnvVars: []string{"ORCH_WRITE_KUBECONFIG"}, Usage: "where to write the admin kubeconfig (mode 0600)"},
			&cli.StringFlag{Name: "cluster-cidr", Value: "10.42.0.0/16", EnvVars: []string{"ORCH_CLUSTER_CIDR"}, Usage: "pod network"},
			&cli.StringFlag{Name: "service-cidr", Value: "10.43.0.0/16", EnvVars: []string{"ORCH_SERVICE_CIDR"}, Usage: "Service cluster IPs"},
			&cli.StringFlag{Name: "cluster-dns", Value: "10.43.0.10", EnvVars: []string{"ORCH_CLUSTER_DNS"}, Usage: "cluster DNS Service IP"},
			&cli.IntFlag{Name: "max-requests-inflight", Value: api.DefaultMaxRequestsInFlight, EnvVars: []string{"ORCH_MAX_REQUESTS_INFLIGHT"}, Usage: "reads served at once, beyond which clients get 429 (system:masters and watches are not counted)"},
			&cli.IntFlag{Name: "max-mutating-requests-inflight", Value: api.DefaultMaxMutatingRequestsInFlight, EnvVars: []string{"ORCH_MAX_MUTATING_REQUESTS_INFLIGHT"}, Usage: "writes served at once, beyond which clients get 429"},
			&cli.BoolFlag{Name: "profiling", Value: true, EnvVars: []string{"ORCH_PROFILING"}, Usage: "serve the process's CPU, heap and goroutine profiles at /debug/pprof/ to cluster admins (`kubectl get --raw /debug/pprof/heap`), as kube-apiserver's --profiling"},
			&cli.BoolFlag{Name: "watch-cache", Value: true, EnvVars: []string{"ORCH_WATCH_CACHE"}, Usage: "serve LISTs and WATCHes from objects held in memory (encoded, decoded when read), as kube-apiserver's --watch-cache (false: every one reads the store)"},
			&cli.BoolFlag{Name: "disable-agent", EnvVars: []string{"ORCH_DISABLE_AGENT"}, Usage: "do not run an agent on this machine"},
			&cli.StringSliceFlag{Name: "disable", EnvVars: []string{"ORCH_DISABLE"}, Usage: "packaged components not to run: servicelb (LoadBalancer Services get no node addresses; bring MetalLB), local-storage (no local-path StorageClass and provisioner), ingress (no orch IngressClass: the nodes serve no Ingress and leave ports 80 and 443 free; bring Traefik or another controller), gateway (no orch GatewayClass: bring another Gateway API implementation)"},
			&cli.StringFlag{Name: "default-local-storage-path", EnvVars: []string{"ORCH_DEFAULT_LOCAL_STORAGE_PATH"}, Usage: "where on each node the local-path provisioner keeps volumes (default DATA/storage, with the server's --data-dir)"},
			&cli.StringFlag{Name: "snapshot-schedule-cron", Value: "0 */12 * * *", EnvVars: []string{"ORCH_SNAPSHOT_SCHEDULE_CRON"}, Usage: "when to snapshot the store (cron syntax)"},
			&cli.IntFlag{Name: "snapshot-retention", Value: 5, EnvVars: []string{"ORCH_SNAPSHOT_RETENTION"}, Usage: "how many scheduled snapshots to keep"},
			&cli.StringFlag{Name: "snapshot-dir", EnvVars: []string{"ORCH_SNAPSHOT_DIR"}, Usage: "where snapshots go (default DATA/server/db/snapshots)"},
			&cli.StringFlag{Name: "pod-security-admission-config-file", EnvVars: []string{"ORCH_POD_SECURITY_ADMISSION_CONFIG_FILE"}, Usage: "Pod Security Admission's default levels and exemptions (an AdmissionConfiguration or a PodSecurityConfiguration, as k3s takes; default: privileged, as Kubernetes)"},
			&cli.BoolFlag{Name: "secrets-encryption", EnvVars: []string{"ORCH_SECRETS_ENCRYPTION"}, Usage: "encrypt Secrets at rest with AES-CBC (an EncryptionConfiguration made in DATA/server/cred/encryption-config.json, in force from then on; see orch secrets-encrypt)"},
			&cli.BoolFlag{Name: "disable-snapshots", EnvVars: []string{"ORCH_DISABLE_SNAPSHOTS"}, Usage: "take no scheduled snapshots"},
			&cli.StringFlag{Name: "datastore-endpoint", EnvVars: []string{"ORCH_DATASTORE_ENDPOINT"}, Usage: "keep the cluster's state in this etcd instead of DATA/server/db (client URLs, comma-separated: https://10.0.0.5:2379,https://10.0.0.6:2379)"},
			&cli.StringFlag{Name: "datastore-cafile", EnvVars: []string{"ORCH_DATASTORE_CAFILE"}, Usage: "CA that signed the datastore's serving certificate (default: the system's)"},
			&cli.StringFlag{Name: "datastore-certfile", EnvVars: []string{"ORCH_DATASTORE_CERTFILE"}, Usage: "client certificate orch presents to the datastore"},
			&cli.StringFlag{Name: "datastore-keyfile", EnvVars: []string{"ORCH_DATASTORE_KEYFILE"}, Usage: "its key"},
			&cli.BoolFlag{Name: "cluster-init", EnvVars: []string{"ORCH_CLUSTER_INIT"}, Usage: "make a cluster of several servers: this server keeps the state in an etcd member of its own (DATA/server/db/etcd) that others join with --server; a store already in DATA/server/db is moved into it"},
			&cli.StringFlag{Name: "server", EnvVars: []string{"ORCH_URL"}, Usage: "join the servers of the cluster this server runs (https://HOST:6443), with --token set to the server token (DATA/server/server-token there, not the agents' token)"},
			&cli.BoolFlag{Name: "etcd-unsupported-arch", EnvVars: []string{"ORCH_ETCD_UNSUPPORTED_ARCH"}, Usage: "run an etcd member on 32-bit ARM anyway (etcd supports 64-bit platforms only, and its database cannot pass 2 GB there)"},
			&cli.BoolFlag{Name: "cluster-reset", EnvVars: []string{"ORCH_CLUSTER_RESET"}, Usage: "on a server of the servers' own etcd, make its member a cluster of one with its data (the way out of a lost quorum); with --cluster-reset-restore-path, replace the state with a snapshot's; then exit (start again without it)"},
			&cli.StringFlag{Name: "cluster-reset-restore-path", EnvVars: []string{"ORCH_CLUSTER_RESET_RESTORE_PATH"}, Usage: "the snapshot --cluster-reset restores (on a new machine, with the server token as --token: the cluster's identity comes from the snapshot)"},
		}, append(nodeFlags(), processFlags()...)...),
		Before: loadConfigFile,
		Action: func(c *cli.Context) error {
			log, err := newLogger(c)
			if err != nil {
				return err
			}
			disabled, err := components(c.StringSlice("disable"))
			if err != nil {
				return err
			}
			if c.Bool("cluster-reset") || c.String("cluster-reset-restore-path") != "" {
				return clusterReset(c, log)
			}
			self, ctx, rollBack, err := selfUpgrade(c.Context, c.String("data-dir"), log)
			if err != nil {
				return err
			}
			if rollBack {
				return self.Exec()
			}
			schedule := c.String("snapshot-schedule-cron")
			if c.Bool("disable-snapshots") {
				schedule = ""
			} else if _, err := cron.ParseStandard(schedule); err != nil {
				return fmt.Errorf("--snapshot-schedule-cron %q: %w", schedule, err)
			}
			var node agent.Config
			if !c.Bool("disable-agent") {
				// This machine is a node too, as with k3s: the same flags as
				// orch agent, joined to this server over loopback.
				if node, err = nodeConfig(c); err != nil {
					return err
				}
				node.Logger, node.Self = log, self
			}
			// client-go logs through klog; send it where orch's own logs go
			// (before any goroutine starts: klog's setter is not synchronized).
			klog.SetSlogLogger(log)
			embedded, err := embeddedEtcd(c)
			if err != nil {
				return err
			}
			// A joining server's --token is the server token; the agents'
			// comes from the cluster.
			agentToken := c.String("token")
			if embedded != nil && embedded.Join != "" {
				agentToken = ""
			}
			// Servers sharing a datastore run the loops one at a time, and
			// each is ready without them.
			shared := c.String("datastore-endpoint") != "" || embedded != nil
			srv, err := api.New(ctx, api.Config{
				DataDir: c.String("data-dir"), BindAddress: c.String("bind-address"), Port: c.Int("https-listen-port"),
				AdvertiseAddress: c.String("advertise-address"), Token: agentToken, TokenAuthFile: c.String("token-auth-file"),
				KubeconfigPath: c.String("write-kubeconfig"), ServiceCIDR: c.String("service-cidr"), ClusterCIDR: c.String("cluster-cidr"),
				ClusterDNS: c.String("cluster-dns"),
				Version:    version, Logger: log, WaitForLoops: !shared,
				MaxRequestsInFlight: c.Int("max-requests-inflight"), MaxMutatingRequestsInFlight: c.Int("max-mutating-requests-inflight"),
				DisableWatchCache: !c.Bool("watch-cache"), DisableProfiling: !c.Bool("profiling"), DisableLocalStorage: disabled["local-storage"], DisableIngress: disabled["ingress"],
				SnapshotSchedule: schedule, SnapshotRetention: c.Int("snapshot-retention"), SnapshotDir: c.String("snapshot-dir"),
				SecretsEncryption: c.Bool("secrets-encryption"), PodsBehindNodes: c.Bool("disable-agent"),
				PodSecurityConfigFile: c.String("pod-security-admission-config-file"),
				Datastore: api.Datastore{Endpoint: c.String("datastore-endpoint"), CAFile: c.String("datastore-cafile"),
					CertFile: c.String("datastore-certfile"), KeyFile: c.String("datastore-keyfile")},
				Embedded: embedded,
				NodeName: node.NodeName,
			})
			if err != nil {
				return err
			}
			go func() {
				memtrim.AfterStartup(ctx, startupMemoryFor, log)
				memtrim.WhileIdle(ctx, memtrim.IdleCheckEvery, log)
			}()
			// Stopped in this order: the agent, then the loops, then the API
			// server and its store.
			var parts []part
			if node.NodeName != "" {
				node.Server, node.Token = srv.URL(), srv.Token()
				parts = append(parts, part{name: "agent", run: func(ctx context.Context) error { return agent.Run(ctx, node) }})
			}
			parts = append(parts,
				part{name: "loops", essential: true, run: func(ctx context.Context) error {
					runLoops := func(ctx context.Context) error {
						return loops.Run(ctx, srv.Loopback(), loops.Options{Logger: log, ClusterCIDR: c.String("cluster-cidr"), DisableServiceLB: disabled["servicelb"], DisableGateway: disabled["gateway"], LocalStoragePath: localStoragePath(c, disabled), RemoveLocalVolume: srv.RemoveLocalVolume, RootCA: srv.CACert, IssueLegacyToken: srv.IssueLegacyToken, SignCertificate: srv.SignCertificate, Metrics: srv.Metrics(),
							Releases: srv.ReleaseSum, Servers: srv.Servers, ServerReady: srv.ServerReady}, srv.LoopsStarted)
					}
					if !shared {
						return runLoops(ctx)
					}
					return leadLoops(ctx, srv, log, runLoops)
				}},
				part{name: "API server", essential: true, run: srv.Run})
			err = runStopInOrder(ctx, log, parts...)
			return execIfRestarting(self, err)
		},
	}
}

// leadLoops runs the loops while this server holds the controllers' Lease.
func leadLoops(ctx context.Context, srv *api.Server, log *slog.Logger, run func(context.Context) error) error {
	client, err := kube.NewForConfig(srv.Loopback())
	if err != nil {
		return err
	}
	host, _ := os.Hostname()
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	return leader.Run(ctx, leader.Config{
		Client: client, Namespace: "kube-system", Name: "orch-controllers",
		Identity: fmt.Sprintf("%s_%x", host, suffix), Logger: log,
	}, run)
}

// embeddedEtcd is what --cluster-init and --server ask for: nil when this
// server keeps the state alone (or in an external etcd), unless it is an
// etcd member already, which it stays.
func embeddedEtcd(c *cli.Context) (*api.Embedded, error) {
	member := api.IsEtcdMember(c.String("data-dir"))
	join := c.String("server")
	switch {
	case !c.Bool("cluster-init") && join == "" && !member:
		return nil, nil
	case c.Bool("cluster-init") && join != "":
		return nil, errors.New("--cluster-init makes a new cluster and --server joins one: give one of them")
	case c.String("datastore-endpoint") != "":
		return nil, errors.New("--datastore-endpoint keeps the state in an external etcd; --cluster-init and --server in the servers' own: give one of them")
	case join != "" && c.String("token") == "":
		return nil, errors.New("--server needs --token: the server token (DATA/server/server-token on a server of the cluster)")
	case runtime.GOARCH == "arm" && !c.Bool("etcd-unsupported-arch"):
		return nil, errors.New("etcd does not support 32-bit ARM (its database is limited to 2 GB there and the platform is untested): run HA servers on arm64 or amd64, or pass --etcd-unsupported-arch to run anyway")
	}
	return &api.Embedded{Join: join, ServerToken: c.String("token")}, nil
}

// clusterReset is k3s's --cluster-reset with a restore path: the store is
// replaced by the snapshot and the server exits, to be started again
// without the flag (a single bbolt server has no membership to reset).
func clusterReset(c *cli.Context, log *slog.Logger) error {
	path := c.String("cluster-reset-restore-path")
	if c.String("datastore-endpoint") != "" {
		return errors.New("--cluster-reset restores orch's own store; an external etcd (--datastore-endpoint) is restored by whoever runs it, with `etcdutl snapshot restore` of a snapshot `orch snapshot save` or etcdctl took")
	}
	if path != "" && !c.Bool("cluster-reset") {
		return errors.New("--cluster-reset-restore-path goes with --cluster-reset")
	}
	if api.IsEtcdMember(c.String("data-dir")) || c.Bool("cluster-init") || path != "" && api.IsEtcdSnapshot(path) {
		if err := api.ResetMember(c.Context, c.String("data-dir"), c.String("advertise-address"), path, c.String("token"), log); err != nil {
			return fmt.Errorf("--cluster-reset: %w", err)
		}
		log.Info("this server's etcd member is a cluster of one now, with its data or the snapshot's; start orch server again without --cluster-reset, " +
			"then join the other servers again: on each, move DATA/server/db/etcd away and start it with --server and the server token")
		return nil
	}
	if path == "" {
		return errors.New("--cluster-reset without --cluster-reset-restore-path resets the members of the servers' own etcd; this server keeps the state alone, with no membership to reset: give a snapshot to restore")
	}
	if err := api.RestoreSnapshot(c.String("data-dir"), path); err != nil {
		return fmt.Errorf("restore %s: %w", path, err)
	}
	log.Info("the store is restored from the snapshot; start orch server again without --cluster-reset", "snapshot", path)
	return nil
}

// components are the packaged components --disable names; only those
// orch has can be named.
func components(names []string) (map[string]bool, error) {
	out := map[string]bool{}
	for _, n := range names {
		for _, name := range strings.Split(n, ",") {
			switch name = strings.TrimSpace(name); name {
			case "":
			case "servicelb", "local-storage", "ingress":
				out[name] = true
			default:
				return nil, fmt.Errorf("--disable %q: orch packages only servicelb, local-storage and ingress", name)
			}
		}
	}
	return out, nil
}

// localStoragePath is where local-path volumes go on the nodes, empty when
// the provisioner is disabled.
func localStoragePath(c *cli.Context, disabled map[string]bool) string {
	switch {
	case disabled["local-storage"]:
		return ""
	case c.String("default-local-storage-path") != "":
		return c.String("default-local-storage-path")
	}
	return filepath.Join(c.String("data-dir"), "storage")
}
