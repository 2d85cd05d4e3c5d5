package agent

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"time"

	"github.com/orch-dev/orch/internal/agent/pods"
	"github.com/orch-dev/orch/internal/iptables"
	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/netproxy"
)

// runServiceProxy keeps the node's Service rules in step with the API
// until ctx ends (internal/netproxy). The rules outlive the agent: the
// node's Services go on working while it restarts, and the next agent's
// first sync takes them over.
func runServiceProxy(ctx context.Context, client *kube.Client, cfg Config, log *slog.Logger) {
	ensureBridgeNetfilter(log)
	ipt, err := iptables.IPv4()
	if err != nil {
		log.Error("service proxy: no iptables: Services get no rules on this node", "err", err)
		return
	}
	clusterCIDR := cfg.ClusterCIDR
	if clusterCIDR == "" {
		clusterCIDR = pods.DefaultClusterCIDR
	}
	informers := kube.NewInformers(client, 0)
	p, err := netproxy.New(netproxy.Config{Informers: informers, IPTables: ipt, ClusterCIDR: clusterCIDR, NodeName: cfg.NodeName, Logger: log})
	if err != nil {
		log.Error("service proxy", "err", err)
		return
	}
	informers.Start(ctx.Done())
	defer informers.Shutdown()
	p.Run(ctx)
}

// The pod networks across nodes --pod-network names.
const (
	PodNetworkHostGW = "host-gw"
	PodNetworkNone   = "none"
)

// runPodNetwork keeps the routes to the other nodes' pods (host-gw) until
// ctx ends; they stay when it does.
func runPodNetwork(ctx context.Context, client *kube.Client, cfg Config, log *slog.Logger) {
	ipt, err := iptables.IPv4()
	if err != nil {
		log.Error("pod network: no iptables: pods reach no other node's pods", "err", err)
		return
	}
	clusterCIDR := cfg.ClusterCIDR
	if clusterCIDR == "" {
		clusterCIDR = pods.DefaultClusterCIDR
	}
	informers := kube.NewInformers(client, 0)
	r, err := netproxy.NewRoutes(netproxy.RoutesConfig{Informers: informers, IPTables: ipt, NodeName: cfg.NodeName, ClusterCIDR: clusterCIDR, Logger: log})
	if err != nil {
		log.Error("pod network", "err", err)
		return
	}
	informers.Start(ctx.Done())
	defer informers.Shutdown()
	r.Run(ctx)
}

// bridgeNetfilter is the switch that makes traffic between two pods on
// the node's bridge pass iptables: without it a pod reaching a Service
// whose endpoint is on the same bridge gets no reply it recognises.
const bridgeNetfilter = "/proc/sys/net/bridge/bridge-nf-call-iptables"

// ensureBridgeNetfilter turns bridgeNetfilter on, as kube-proxy's
// installers do; it exists only while the br_netfilter module is loaded.
func ensureBridgeNetfilter(log *slog.Logger) {
	for range 2 {
		if err := os.WriteFile(bridgeNetfilter, []byte("1"), 0o644); err == nil {
			return
		} else if !os.IsNotExist(err) {
			log.Warn("service proxy: cannot turn on "+bridgeNetfilter+": a pod reaching a Service whose endpoint shares its node may get no answer", "err", err)
			return
		}
		// Loading modules is the distribution's business; try once.
		_ = runModprobe()
		time.Sleep(100 * time.Millisecond)
	}
	log.Warn("service proxy: the br_netfilter module is not loaded (modprobe br_netfilter): a pod reaching a Service whose endpoint shares its node may get no answer")
}

func runModprobe() error { return exec.Command("modprobe", "br_netfilter").Run() }
