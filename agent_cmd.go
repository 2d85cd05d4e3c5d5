package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/orch-dev/orch/internal/agent"
	"github.com/orch-dev/orch/internal/agent/pods"
	"github.com/orch-dev/orch/internal/agent/shutdown"
	"github.com/orch-dev/orch/internal/memtrim"
	"github.com/urfave/cli/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	kubeletapis "k8s.io/kubelet/pkg/apis"
)

// agentCommand is `orch agent`: this machine joins as a node. Flags follow
// k3s; each has an ORCH_* environment variable.
func agentCommand() *cli.Command {
	return &cli.Command{
		Name:  "agent",
		Usage: "join this machine to a cluster as a node",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "server", EnvVars: []string{"ORCH_URL"}, Usage: "the API server, https://HOST:6443"},
			&cli.StringFlag{Name: "token", EnvVars: []string{"ORCH_TOKEN"}, Usage: "join token (K10<CA hash>::server:<secret>, from the server's DATA/server/token)"},
			&cli.StringFlag{Name: "data-dir", Value: "/var/lib/orch", EnvVars: []string{"ORCH_DATA_DIR"}, Usage: "where the agent keeps its certificates, images and pods"},
			&cli.StringFlag{Name: "cluster-dns", Value: "10.43.0.10", EnvVars: []string{"ORCH_CLUSTER_DNS"}, Usage: "cluster DNS Service IP written into pods' resolv.conf (the server's --cluster-dns)"},
			&cli.StringFlag{Name: "cluster-cidr", Value: pods.DefaultClusterCIDR, EnvVars: []string{"ORCH_CLUSTER_CIDR"}, Usage: "the cluster's pod network (the server's --cluster-cidr): pod traffic to it is not masqueraded"},
			// kube-proxy's --cleanup, for the uninstall.
			&cli.BoolFlag{Name: "cleanup", Usage: "remove the Service and NetworkPolicy rules, pod network routes and devices orch made on this machine, and exit (after orch has stopped, to uninstall it)"},
		}, append(nodeFlags(), processFlags()...)...),
		Before: loadConfigFile,
		Action: func(c *cli.Context) error {
			if c.Bool("cleanup") {
				log, err := newLogger(c)
				if err != nil {
					return err
				}
				return agent.CleanupNetwork(log)
			}
			cfg, err := agentConfig(c)
			if err != nil {
				return err
			}
			klog.SetSlogLogger(cfg.Logger)
			self, ctx, rollBack, err := selfUpgrade(c.Context, c.String("data-dir"), cfg.Logger)
			if err != nil {
				return err
			}
			if rollBack {
				return self.Exec()
			}
			cfg.Self = self
			go func() {
				memtrim.AfterStartup(ctx, startupMemoryFor, cfg.Logger)
				memtrim.WhileIdle(ctx, memtrim.IdleCheckEvery, cfg.Logger)
			}()
			return execIfRestarting(self, agent.Run(ctx, cfg))
		},
	}
}

// nodeFlags are the flags of this machine's node, which orch server takes
// too for its own agent, as k3s's does.
func nodeFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "node-name", EnvVars: []string{"ORCH_NODE_NAME"}, Usage: "node name (default: the hostname)"},
		&cli.StringSliceFlag{Name: "node-ip", EnvVars: []string{"ORCH_NODE_IP"}, Usage: "node address (default: the first host IPv4)"},
		&cli.StringSliceFlag{Name: "node-external-ip", EnvVars: []string{"ORCH_NODE_EXTERNAL_IP"}, Usage: "node's external address"},
		&cli.StringSliceFlag{Name: "node-label", EnvVars: []string{"ORCH_NODE_LABEL"}, Usage: "node label (key=value)"},
		&cli.StringSliceFlag{Name: "node-taint", EnvVars: []string{"ORCH_NODE_TAINT"}, Usage: "node taint (key=value:Effect)"},
		&cli.StringFlag{Name: "runtime-dir", Value: "/run/orch", EnvVars: []string{"ORCH_RUNTIME_DIR"},
			Usage: "where state that need not outlive a reboot lives (containerd's state, the pods' network and sandbox files): a tmpfs, so that it costs the SD card no writes"},
		&cli.StringFlag{Name: "container-runtime-endpoint", EnvVars: []string{"ORCH_CONTAINER_RUNTIME_ENDPOINT"}, Usage: "containerd socket (default: run one under the data dir)"},
		&cli.IntFlag{Name: "kubelet-port", Value: 10250, EnvVars: []string{"ORCH_KUBELET_PORT"}, Usage: "port of the logs/exec API"},
		// The node's registries.yaml, as k3s's.
		&cli.StringFlag{Name: "private-registry", Value: "/etc/orch/registries.yaml", EnvVars: []string{"ORCH_PRIVATE_REGISTRY"},
			Usage: "registry mirrors and endpoints' TLS and credentials, in k3s's registries.yaml format (a missing file is none)"},
		&cli.StringFlag{Name: "pod-network", Value: agent.PodNetworkVXLAN, EnvVars: []string{"ORCH_POD_NETWORK"},
			Usage: "how pods reach other nodes' pods: vxlan (a tunnel between the nodes' addresses, UDP 8472), host-gw (routes through the nodes' addresses, nodes on one segment) or none (a CNI you install)"},
		&cli.StringFlag{Name: "cluster-domain", Value: "cluster.local", EnvVars: []string{"ORCH_CLUSTER_DOMAIN"}, Usage: "the cluster's DNS domain, which every node's cluster DNS answers"},
		&cli.StringFlag{Name: "resolv-conf", EnvVars: []string{"ORCH_RESOLV_CONF"},
			Usage: "the node's resolv.conf: the cluster DNS's upstream resolvers, and dnsPolicy Default pods' (default /etc/resolv.conf, or systemd-resolved's when it names only 127.0.0.53)"},
		&cli.BoolFlag{Name: "disable-kube-proxy", EnvVars: []string{"ORCH_DISABLE_KUBE_PROXY"}, Usage: "leave Services to another proxy (kube-proxy, Cilium): no Service rules in iptables"},
		&cli.StringFlag{Name: "proxy-mode", EnvVars: []string{"ORCH_PROXY_MODE"},
			Usage: "how the service proxy writes its rules: nftables (kube-proxy's nftables mode; the default where the machine has the nft command and nf_tables) or iptables (kube-proxy's iptables mode, which also takes node ports on 127.0.0.1)"},
		&cli.BoolFlag{Name: "disable-network-policy", EnvVars: []string{"ORCH_DISABLE_NETWORK_POLICY"}, Usage: "leave NetworkPolicies to another enforcer (Calico, Cilium): no policy rules in iptables"},
		// The kubelet's graceful node shutdown (shutdownGracePeriod and
		// shutdownGracePeriodCriticalPods), on by default: a board's
		// reboot should not cut its databases off mid-write.
		&cli.DurationFlag{Name: "shutdown-grace-period", Value: 30 * time.Second, EnvVars: []string{"ORCH_SHUTDOWN_GRACE_PERIOD"},
			Usage: "how long the machine's shutdown or reboot waits for the node's pods to stop (through a systemd-logind delay lock; 0 does not wait)"},
		&cli.DurationFlag{Name: "shutdown-grace-period-critical-pods", Value: 10 * time.Second, EnvVars: []string{"ORCH_SHUTDOWN_GRACE_PERIOD_CRITICAL_PODS"},
			Usage: "the part of --shutdown-grace-period kept for critical pods (system-node-critical, system-cluster-critical), which stop after the others"},
	}
}

// startupMemoryFor is how long after starting a process keeps the pages
// only its start touches (memtrim): time enough to join, list, adopt or
// start its pods.
const startupMemoryFor = time.Minute

func agentConfig(c *cli.Context) (agent.Config, error) {
	cfg, err := nodeConfig(c)
	if err != nil {
		return cfg, err
	}
	cfg.Server, cfg.Token = c.String("server"), c.String("token")
	// A node reaches whichever server is ready, as k3s's agent load
	// balancer does: one server's death does not cut it off.
	cfg.BalanceServers = true
	if cfg.Logger, err = newLogger(c); err != nil {
		return cfg, err
	}
	if cfg.Server == "" || cfg.Token == "" {
		return cfg, errors.New("orch agent needs --server (ORCH_URL) and --token (ORCH_TOKEN)")
	}
	if !strings.HasPrefix(cfg.Server, "https://") {
		return cfg, fmt.Errorf("--server %q: want https://HOST:PORT", cfg.Server)
	}
	return cfg, nil
}

// nodeConfig is what orch agent and orch server's own node share: the
// node's flags (nodeFlags), the data dir and the cluster's networks. The
// name defaults to the hostname, the address to the first host IPv4.
func nodeConfig(c *cli.Context) (agent.Config, error) {
	cfg := agent.Config{NodeName: c.String("node-name"), NodeIPs: c.StringSlice("node-ip"), NodeExternalIPs: c.StringSlice("node-external-ip"),
		DataDir: c.String("data-dir"), RuntimeDir: c.String("runtime-dir"), ClusterDNS: c.String("cluster-dns"), ClusterCIDR: c.String("cluster-cidr"),
		ContainerRuntimeEndpoint: c.String("container-runtime-endpoint"), KubeletPort: c.Int("kubelet-port"),
		PrivateRegistry: c.String("private-registry"), DisableServiceProxy: c.Bool("disable-kube-proxy"), DisableNetworkPolicy: c.Bool("disable-network-policy"), PodNetwork: c.String("pod-network"), ClusterDomain: c.String("cluster-domain"), ResolvConf: c.String("resolv-conf"), Version: version,
		ProxyMode: c.String("proxy-mode")}
	switch cfg.ProxyMode {
	case "", agent.ProxyModeIPTables, agent.ProxyModeNFTables:
	default:
		return cfg, fmt.Errorf("--proxy-mode %q: want %s or %s", cfg.ProxyMode, agent.ProxyModeNFTables, agent.ProxyModeIPTables)
	}
	if cfg.NodeName == "" {
		host, err := os.Hostname()
		if err != nil {
			return cfg, fmt.Errorf("node name: %w", err)
		}
		cfg.NodeName = strings.ToLower(host)
	}
	if len(cfg.NodeIPs) == 0 {
		if ip := firstIPv4(); ip != "" {
			cfg.NodeIPs = []string{ip}
		}
	}
	switch cfg.PodNetwork {
	case agent.PodNetworkVXLAN, agent.PodNetworkHostGW, agent.PodNetworkNone:
	default:
		return cfg, fmt.Errorf("--pod-network %q: want vxlan, host-gw or none", cfg.PodNetwork)
	}
	for _, ip := range append(slices.Clip(cfg.NodeIPs), cfg.NodeExternalIPs...) {
		if net.ParseIP(ip) == nil {
			return cfg, fmt.Errorf("node address %q is not an IP", ip)
		}
	}
	cfg.Shutdown = shutdown.Config{GracePeriod: c.Duration("shutdown-grace-period"), CriticalPodsGracePeriod: c.Duration("shutdown-grace-period-critical-pods")}
	if cfg.Shutdown.GracePeriod < 0 || cfg.Shutdown.CriticalPodsGracePeriod < 0 {
		return cfg, errors.New("--shutdown-grace-period and --shutdown-grace-period-critical-pods may not be negative")
	}
	if cfg.Shutdown.CriticalPodsGracePeriod > cfg.Shutdown.GracePeriod {
		return cfg, fmt.Errorf("--shutdown-grace-period-critical-pods %v is more than --shutdown-grace-period %v, of which it is a part",
			cfg.Shutdown.CriticalPodsGracePeriod, cfg.Shutdown.GracePeriod)
	}
	var err error
	if cfg.Labels, err = parseLabels(c.StringSlice("node-label")); err != nil {
		return cfg, err
	}
	if cfg.Taints, err = parseTaints(c.StringSlice("node-taint")); err != nil {
		return cfg, err
	}
	return cfg, nil
}

func firstIPv4() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil {
			return ipn.IP.String()
		}
	}
	return ""
}

// parseLabels reads --node-label; as the kubelet's --node-labels, it
// refuses labels in the kubernetes.io and k8s.io namespaces that a node
// may not set on itself (node-role.kubernetes.io/..., which
// NodeRestriction would refuse at registration).
func parseLabels(specs []string) (map[string]string, error) {
	out := map[string]string{}
	for _, s := range specs {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--node-label %q: want key=value", s)
		}
		ns, _, _ := strings.Cut(k, "/")
		kubernetes := ns == "kubernetes.io" || strings.HasSuffix(ns, ".kubernetes.io") || ns == "k8s.io" || strings.HasSuffix(ns, ".k8s.io")
		if strings.Contains(k, "/") && kubernetes && !kubeletapis.IsKubeletLabel(k) {
			return nil, fmt.Errorf("--node-label %q: a node may not set its own 'kubernetes.io' or 'k8s.io' labels other than %s and those under %s (set others with kubectl label node)",
				s, strings.Join(kubeletapis.KubeletLabels(), ", "), strings.Join(kubeletapis.KubeletLabelNamespaces(), ", "))
		}
		out[k] = v
	}
	return out, nil
}

// parseTaints reads Kubernetes' key=value:Effect (or key:Effect).
func parseTaints(specs []string) ([]corev1.Taint, error) {
	var out []corev1.Taint
	for _, s := range specs {
		kv, effect, ok := strings.Cut(s, ":")
		k, v, _ := strings.Cut(kv, "=")
		switch e := corev1.TaintEffect(effect); {
		case !ok || k == "":
			return nil, fmt.Errorf("--node-taint %q: want key=value:Effect", s)
		case e != corev1.TaintEffectNoSchedule && e != corev1.TaintEffectPreferNoSchedule && e != corev1.TaintEffectNoExecute:
			return nil, fmt.Errorf("--node-taint %q: effect must be NoSchedule, PreferNoSchedule or NoExecute", s)
		default:
			out = append(out, corev1.Taint{Key: k, Value: v, Effect: e})
		}
	}
	return out, nil
}
