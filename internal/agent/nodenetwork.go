package agent

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/orch-dev/orch/internal/agent/podnet"
	"github.com/orch-dev/orch/internal/agent/pods"
	"github.com/orch-dev/orch/internal/iptables"
	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/netproxy"
	clusterdns "github.com/orch-dev/orch/internal/netproxy/dns"
	"github.com/orch-dev/orch/internal/netproxy/ingress"
	"github.com/orch-dev/orch/internal/netproxy/netpolicy"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/knftables"
)

// The pod networks across nodes --pod-network names.
const (
	PodNetworkVXLAN  = netproxy.VXLAN
	PodNetworkHostGW = netproxy.HostGW
	PodNetworkNone   = "none"
)

// podNetwork is cfg's pod network backend: the command line defaults to
// VXLAN; a Config that names none gets host-gw, which makes nothing until
// another node joins.
func podNetwork(cfg Config) string {
	if cfg.PodNetwork == "" {
		return PodNetworkHostGW
	}
	return cfg.PodNetwork
}

// podMTU is the MTU the node's pods get: the VXLAN tunnel's, or the
// default.
func podMTU(cfg Config, log *slog.Logger) int {
	if podNetwork(cfg) != PodNetworkVXLAN || len(cfg.NodeIPs) == 0 {
		return 0
	}
	mtu, err := netproxy.VXLANMTU(cfg.NodeIPs[0])
	if err != nil {
		log.Warn("pods get the default MTU: large transfers to other nodes' pods may stall", "err", err)
		return 0
	}
	return mtu
}

// runNodeNetwork keeps, until ctx ends, the node's Service rules in step
// with the API (unless DisableServiceProxy), its way to the other nodes'
// pods, the cluster DNS its pods ask and its ingress proxy on ports 80
// and 443, all from internal/netproxy over one set of informers. Rules and routes outlive the agent: the node's traffic goes
// on while it restarts, and the next agent's first sync takes them over.
// The node's own client (node) publishes what the other nodes need to
// reach its pods on its Node (VXLAN's tunnel end).
func runNodeNetwork(ctx context.Context, client, node *kube.Client, cfg Config, log *slog.Logger) {
	ipt, err := iptables.IPv4()
	if err != nil {
		log.Error("no iptables: Services get no rules and pods reach no other node's pods", "err", err)
		return
	}
	clusterCIDR := cfg.ClusterCIDR
	if clusterCIDR == "" {
		clusterCIDR = pods.DefaultClusterCIDR
	}
	informers := kube.NewInformers(client, 0)
	var run []func(context.Context)
	if dns := clusterDNS(cfg, informers, clusterCIDR, log); dns != nil {
		run = append(run, dns)
	}
	if !cfg.DisableServiceProxy {
		ensureBridgeNetfilter(log)
		pc := netproxy.Config{Informers: informers, IPTables: ipt, ClusterCIDR: clusterCIDR, NodeName: cfg.NodeName, Logger: log}
		pc.Mode, pc.NFTables, pc.AfterFirstSync = proxyMode(cfg.ProxyMode, ipt, log)
		p, err := netproxy.New(pc)
		if err != nil {
			log.Error("service proxy", "err", err)
			return
		}
		run = append(run, p.Run)
	}
	if backend := podNetwork(cfg); backend != PodNetworkNone {
		nodeIP := ""
		if len(cfg.NodeIPs) > 0 {
			nodeIP = cfg.NodeIPs[0]
		}
		annotate := func(ctx context.Context, annotations map[string]string) error {
			patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
			if err != nil {
				return err
			}
			_, err = node.Nodes().Patch(ctx, cfg.NodeName, types.MergePatchType, patch, metav1.PatchOptions{})
			return err
		}
		r, err := netproxy.NewPodNetwork(netproxy.PodNetworkConfig{Informers: informers, IPTables: ipt, Backend: backend, NodeName: cfg.NodeName,
			NodeIP: nodeIP, ClusterCIDR: clusterCIDR, Annotate: annotate, Logger: log})
		if err != nil {
			log.Error("pod network", "err", err)
			return
		}
		run = append(run, r.Run)
	}
	// The Ingresses and the TLS Secrets they name are read with the
	// node's own identity (the node authorizer allows those), the
	// Services and their endpoints from the service proxy's informers.
	nodeInformers := kube.NewInformers(node, 0)
	in, err := ingress.New(ingress.Config{Node: nodeInformers, Services: informers, HTTPAddr: ":80", HTTPSAddr: ":443", Logger: log,
		StatePath: filepath.Join(cfg.DataDir, "agent", "ingress.json"),
		Secret: func(ctx context.Context, namespace, name string) (*corev1.Secret, error) {
			return node.Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
		}})
	if err != nil {
		log.Error("ingress proxy", "err", err)
		return
	}
	run = append(run, in.Run)
	informers.Start(ctx)
	defer informers.Shutdown()
	nodeInformers.Start(ctx)
	defer nodeInformers.Shutdown()
	var wg sync.WaitGroup
	for _, fn := range run {
		wg.Go(func() { fn(ctx) })
	}
	wg.Wait()
}

// clusterDNS is the node's cluster DNS server, answering on its address
// at dns.Port (the kube-dns Service sends its pods there) for its pods
// and itself, over informers; nil for a node at a loopback address,
// which no Service may send to.
func clusterDNS(cfg Config, informers *kube.Informers, clusterCIDR string, log *slog.Logger) func(context.Context) {
	if len(cfg.NodeIPs) == 0 {
		return nil
	}
	nodeIP, err := netip.ParseAddr(cfg.NodeIPs[0])
	if err != nil || nodeIP.IsLoopback() {
		log.Info("no cluster DNS on this node: it has no address a Service may send to", "nodeIP", cfg.NodeIPs[0])
		return nil
	}
	pods, err := netip.ParsePrefix(clusterCIDR)
	if err != nil {
		log.Error("no cluster DNS", "clusterCIDR", clusterCIDR, "err", err)
		return nil
	}
	var own []netip.Addr
	for _, ip := range append(slices.Clip(cfg.NodeIPs), cfg.NodeExternalIPs...) {
		if a, err := netip.ParseAddr(ip); err == nil {
			own = append(own, a)
		}
	}
	cluster, err := clusterdns.NewCluster(informers)
	if err != nil {
		log.Error("no cluster DNS", "err", err)
		return nil
	}
	upstreams, err := clusterdns.Upstreams(resolvConf(cfg))
	if err != nil {
		log.Warn("cluster DNS: names outside the cluster will not resolve", "err", err)
	}
	server := clusterdns.New(clusterdns.Config{Domain: cfg.ClusterDomain, Cluster: cluster, Upstreams: upstreams, Logger: log,
		// The pods, and the node itself (hostNetwork pods): not the LAN.
		Allow: func(a netip.Addr) bool { return pods.Contains(a) || a.IsLoopback() || slices.Contains(own, a) }})
	addr := net.JoinHostPort(nodeIP.String(), strconv.Itoa(clusterdns.Port))
	return func(ctx context.Context) {
		for {
			err := server.Serve(ctx, addr)
			if ctx.Err() != nil {
				return
			}
			log.Error("cluster DNS not answering (retrying)", "addr", addr, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Second):
			}
		}
	}
}

// resolvConf is the node's resolv.conf (Config.ResolvConf).
func resolvConf(cfg Config) string {
	if cfg.ResolvConf != "" {
		return cfg.ResolvConf
	}
	return clusterdns.HostResolvConf()
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

// The service proxy's modes (Config.ProxyMode).
const (
	ProxyModeNFTables = netproxy.ModeNFTables
	ProxyModeIPTables = netproxy.ModeIPTables
)

// proxyMode picks the service proxy's mode (asked, or nftables where the
// machine has it); once the proxy's first sync is in, the returned
// cleanup removes the other mode's rules, which would fight it (not
// before: Services keep working through a restart that changes modes).
// A machine without nftables gets the iptables mode, said in the log,
// rather than no Services at all.
func proxyMode(asked string, ipt iptables.Interface, log *slog.Logger) (string, knftables.Interface, func()) {
	if asked != netproxy.ModeIPTables {
		nft, err := netproxy.NewNFTables()
		if err == nil {
			log.Info("service proxy in the nftables mode: its rules are in nftables (nft list table ip kube-proxy), not in iptables-save")
			return netproxy.ModeNFTables, nft, func() {
				// The iptables mode's guard of 127.0.0.1 goes with its rules.
				if err := netproxy.DisableLocalhostNodePorts(); err != nil {
					log.Warn("service proxy", "err", err)
				}
				if n, err := netproxy.RemoveIPTablesRules(ipt); err != nil {
					log.Warn("service proxy: the iptables mode's rules could not all be removed", "err", err)
				} else if n > 0 {
					log.Info("service proxy: removed the iptables mode's rules", "removed", n)
				}
			}
		}
		if asked == netproxy.ModeNFTables {
			log.Error("service proxy: the nftables mode was asked for but this machine cannot have it: using iptables", "err", err)
		} else {
			log.Info("service proxy in the iptables mode: no nftables here", "err", err)
		}
	}
	if err := netproxy.EnableLocalhostNodePorts(); err != nil {
		log.Warn("service proxy: node ports will not answer on 127.0.0.1", "err", err)
	}
	return netproxy.ModeIPTables, nil, func() {
		if had, err := netproxy.RemoveNFTables(context.Background()); err != nil {
			log.Warn("service proxy: the nftables mode's table could not be removed", "err", err)
		} else if had {
			log.Info("service proxy: removed the nftables mode's table")
		}
	}
}

func runModprobe() error { return exec.Command("modprobe", "br_netfilter").Run() }

// CleanupNetwork removes what orch made of this machine's network (orch
// agent --cleanup, for uninstalling it once it has stopped): the service
// proxy's rules, the NetworkPolicy chains and sets, the pod network's
// routes and VXLAN device, the pods' bridge and their masquerade and
// port-mapping rules. Run while orch
// runs, it would only be made again.
func CleanupNetwork(log *slog.Logger) error {
	ipt, err := iptables.IPv4()
	if err != nil {
		return err
	}
	proxy, perr := netproxy.Cleanup(ipt)
	pod, err := podnet.Cleanup(ipt)
	for what, n := range pod {
		proxy[what] += n
	}
	policy, nerr := netpolicy.Cleanup(ipt, nil)
	for what, n := range policy {
		proxy[what] += n
	}
	for what, n := range proxy {
		log.Info("node network cleaned up", "what", what, "removed", n)
	}
	return errors.Join(perr, err, nerr)
}
