package agent

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	orchctr "github.com/orch-dev/orch/internal/agent/containerd"
	"github.com/orch-dev/orch/internal/agent/eviction"
	"github.com/orch-dev/orch/internal/kubeversion"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/orch-dev/orch/internal/agent/checkpoint"
	"github.com/orch-dev/orch/internal/agent/pods"
	"github.com/orch-dev/orch/internal/agent/registries"
	"github.com/orch-dev/orch/internal/agent/serverlb"
	"github.com/orch-dev/orch/internal/agent/shutdown"
	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/netproxy/netpolicy"
)

// Config is what `orch agent` is started with.
type Config struct {
	Server, Token string
	DataDir       string
	NodeName      string
	NodeIPs       []string
	// NodeExternalIPs are the node's ExternalIP addresses.
	NodeExternalIPs []string
	// ClusterCIDR is the pod network of the whole cluster (the server's
	// --cluster-cidr; default 10.42.0.0/16): pods' traffic to it is not
	// masqueraded.
	ClusterCIDR string
	Labels      map[string]string
	Taints      []corev1.Taint
	// LeaseEvery is how often the node's Lease is renewed (10 s, the
	// kubelet's default).
	LeaseEvery time.Duration
	// ContainerRuntimeEndpoint is a containerd socket to use; empty runs
	// the agent's own containerd under DataDir.
	ContainerRuntimeEndpoint string
	// KubeletPort is where the node's logs/exec API listens (10250; 0
	// picks a free port, for tests); the Node says which.
	KubeletPort int
	// ClusterDNS is the cluster DNS Service's IP written into pods'
	// resolv.conf (dnsPolicy ClusterFirst); ClusterDomain defaults to
	// cluster.local.
	ClusterDNS    string
	ClusterDomain string
	// ResolvConf is the node's resolv.conf: the cluster DNS's upstream
	// resolvers and what dnsPolicy Default pods get (the kubelet's
	// --resolv-conf). Empty: /etc/resolv.conf, or systemd-resolved's
	// real one when /etc/resolv.conf names only its stub, as k3s picks.
	ResolvConf string
	// ImageGC is when unused images are removed (zero: the kubelet's
	// defaults, 85 % and 80 % of the disk).
	ImageGC pods.ImageGC
	// PrivateRegistry is the registries.yaml (k3s's format) naming
	// registry mirrors and endpoints' TLS and credentials; a missing file
	// is none.
	PrivateRegistry string
	// Eviction is when pods are evicted for memory (zero: the kubelet's
	// memory.available<100Mi, read from /proc/meminfo).
	Eviction eviction.Config
	// DisableServiceProxy leaves Services to another proxy (kube-proxy,
	// Cilium): k3s's --disable-kube-proxy.
	DisableServiceProxy bool
	// ProxyMode is how the service proxy writes its rules:
	// ProxyModeNFTables, ProxyModeIPTables, or "" for nftables where the
	// machine has it (the nft command, the kernel's nf_tables), iptables
	// otherwise.
	ProxyMode string
	// DisableNetworkPolicy leaves NetworkPolicies to another enforcer
	// (Calico, Cilium): k3s's --disable-network-policy.
	DisableNetworkPolicy bool
	// PodNetwork is how pods reach other nodes' pods: "vxlan" (a tunnel
	// between the nodes' addresses; the command line's default), "host-gw"
	// (routes through the nodes' addresses, for nodes on one segment; the
	// default of a Config that names none) or "none" (a CNI the user
	// installs does it).
	PodNetwork string
	// RuntimeDir holds the state that need not outlive a reboot, on tmpfs
	// so that it costs the SD card no writes (the command line's
	// /run/orch, as k3s keeps containerd's state under /run/k3s):
	// containerd's state, the pods' network namespaces and CNI state,
	// their hosts, resolv.conf and hostname files, FIFOs and namespace
	// pins. Empty: DATA/agent/run.
	RuntimeDir string
	// CertificateCheckInterval and CertificateRenewBefore are how often
	// the node checks its certificates and how long before expiry it
	// renews them (DefaultCertificateCheckInterval,
	// DefaultCertificateRenewBefore).
	CertificateCheckInterval, CertificateRenewBefore time.Duration
	// Shutdown is the node's graceful shutdown: how long a machine's
	// shutdown or reboot waits for its pods (zero: it does not wait).
	Shutdown shutdown.Config
	// BalanceServers sends the node's clients through a load balancer on
	// its loopback to whichever API server is ready, learning the servers
	// from the kubernetes Service (orch agent; the agent inside orch
	// server talks to its own server).
	BalanceServers bool
	Version        string
	// Self replaces the node's binary when the upgrade loop says so; nil:
	// the node does not upgrade itself.
	Self   SelfUpgrader
	Logger *slog.Logger
}

// runtimeDir is where the state that does not outlive a reboot lives.
func (cfg Config) runtimeDir() string {
	if cfg.RuntimeDir != "" {
		return cfg.RuntimeDir
	}
	return filepath.Join(cfg.DataDir, "agent", "run")
}

// nodeAddresses are the addresses the node's serving certificate names.
func nodeAddresses(cfg Config) []string {
	return append(slices.Clip(cfg.NodeIPs), cfg.NodeExternalIPs...)
}

// notReadyMessage is what the node says until it can run pods (it needs
// its pod network from the server's node IPAM): the scheduler sends none
// to a node that is not Ready.
const notReadyMessage = "orch agent: waiting for the node's pod network (spec.podCIDR)"

// Run joins the cluster, registers the node and keeps its Lease until ctx
// ends.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.LeaseEvery <= 0 {
		cfg.LeaseEvery = 10 * time.Second
	}
	log := cfg.Logger.With("node", cfg.NodeName)
	var mirrors *registries.Config
	if cfg.PrivateRegistry != "" {
		var err error
		if mirrors, err = registries.Load(cfg.PrivateRegistry); err != nil {
			return err
		}
	}
	tlsDir := filepath.Join(cfg.DataDir, "agent", "tls")
	creds, err := Join(ctx, cfg.Server, cfg.Token, cfg.NodeName, nodeAddresses(cfg), tlsDir, log)
	if err != nil {
		return err
	}
	var balancer *serverlb.Balancer
	if cfg.BalanceServers {
		u, err := url.Parse(cfg.Server)
		if err != nil || u.Host == "" {
			return fmt.Errorf("--server %q: want https://HOST:PORT", cfg.Server)
		}
		if balancer, err = serverlb.New(hostPort(u), filepath.Join(cfg.DataDir, "agent", "servers.json"), creds.CA, log); err != nil {
			return err
		}
		lbCtx, stopLB := context.WithCancel(ctx)
		lbDone := make(chan error, 1)
		go func() { lbDone <- balancer.Run(lbCtx) }()
		// Stopped last: the node's clients use it to the end.
		defer func() {
			stopLB()
			if err := <-lbDone; err != nil {
				log.Warn("API server load balancer", "err", err)
			}
		}()
		// Renewal and everything after go through it.
		cfg.Server = "https://" + balancer.Address()
	}
	restConfig := &rest.Config{
		Host: cfg.Server,
		// From the files, which client-go reloads when renewal replaces
		// them (keepCredentials).
		TLSClientConfig: rest.TLSClientConfig{CAData: creds.CA, CertFile: filepath.Join(tlsDir, "client.crt"), KeyFile: filepath.Join(tlsDir, "client.key")},
		ContentConfig:   rest.ContentConfig{ContentType: "application/vnd.kubernetes.protobuf", AcceptContentTypes: "application/vnd.kubernetes.protobuf,application/json"},
		UserAgent:       "orch-agent/" + cfg.Version,
		// The kubelet's defaults (kubeAPIQPS 50, burst 100): client-go's
		// 5/s would make 30 pods starting at once wait six seconds for
		// their status writes.
		QPS: 50, Burst: 100,
	}
	client, err := kube.NewForConfig(restConfig)
	if err != nil {
		return err
	}
	// Events have their own rate limit (the kubelet's eventRecordQPS 50,
	// eventBurst 100), so that three events per starting pod never queue
	// the pods' status writes behind them.
	eventClient, err := kube.NewForConfig(rest.CopyConfig(restConfig))
	if err != nil {
		return err
	}
	events := kube.NewEvents(ctx, eventClient, log).RecorderFor("kubelet", cfg.NodeName)
	events.Eventf(pods.NodeRef(cfg.NodeName), nil, corev1.EventTypeNormal, "Starting", "Starting", "Starting orch agent.")
	kapi, port, err := serveKubeletAPI(ctx, cfg.KubeletPort, creds, log)
	if err != nil {
		return err
	}
	cfg.KubeletPort = port
	kapi.node, kapi.started = cfg.NodeName, time.Now()
	rt := startRuntime(ctx, cfg, log, func(reason string) {
		events.Eventf(pods.NodeRef(cfg.NodeName), nil, corev1.EventTypeWarning, "ContainerRuntimeUnhealthy", "Restart", "%s", reason)
	})
	if rt.stopped != nil {
		defer func() { <-rt.stopped }()
	}
	cp, err := checkpoint.Open(filepath.Join(cfg.DataDir, "agent", "checkpoint.db"))
	if err != nil {
		return err
	}
	defer func() { _ = cp.Close() }()
	// Registering needs the server; running the pods it ran before does
	// not. An unreachable server is retried, not fatal.
	// Run returns only once what it started has stopped: nothing writes to
	// the checkpoint after it is closed.
	var wg sync.WaitGroup
	defer wg.Wait()
	registered := make(chan struct{})
	var annotated atomic.Bool
	wg.Go(func() {
		defer close(registered)
		for {
			err := register(ctx, client, events, cfg, rt)
			if err == nil {
				err = annotateSelf(ctx, client, cfg)
			}
			if err == nil {
				log.Info("node registered", "server", cfg.Server, "runtime", rt.version, "version", cfg.Version)
				annotated.Store(true)
				if cfg.Self != nil {
					wg.Go(func() { followUpgrades(ctx, client, restConfig, cfg, log) })
				}
				return
			}
			log.Warn("registering the node (retrying)", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Second):
			}
		}
	})
	// The service proxy and the pod network read every Service,
	// EndpointSlice and Node: kube-proxy's identity, not the node's.
	proxyConfig := rest.CopyConfig(restConfig)
	proxyConfig.CertFile, proxyConfig.KeyFile, proxyConfig.UserAgent = filepath.Join(tlsDir, "proxy.crt"), filepath.Join(tlsDir, "proxy.key"), "orch-proxy/"+cfg.Version
	proxyClient, err := kube.NewForConfig(proxyConfig)
	if err != nil {
		return err
	}
	if balancer != nil {
		wg.Go(func() { followAPIServers(ctx, proxyClient, balancer, log) })
	}
	policies := networkPolicies(proxyClient, cfg, log)
	if policies != nil {
		wg.Go(func() { policies.run(ctx, events, cfg.NodeName) })
	}
	wg.Go(func() { runNodeNetwork(ctx, proxyClient, client, cfg, log) })
	wg.Go(func() { keepCredentials(ctx, cfg, creds, tlsDir, kapi.useCredentials, log) })
	var podsRunning, shuttingDown atomic.Bool
	if rt.client != nil {
		wg.Go(func() {
			runPods(ctx, client, events, rt, cfg, mirrors, kapi, cp, policies.policer(), &podsRunning, &shuttingDown, registered, log)
		})
	}
	t := time.NewTicker(cfg.LeaseEvery)
	defer t.Stop()
	keptToReport := false
	for {
		err := renewLease(ctx, client, cfg.NodeName)
		if err != nil && ctx.Err() == nil {
			// Offline is a state the agent lives through, not an error.
			log.Warn("lease not renewed", "err", err)
		}
		// Ready once the pods run, and Ready again after an outage made
		// the server mark the node Unknown: the kubelet's status sync.
		if err == nil && podsRunning.Load() && isClosed(registered) {
			err := syncNodeStatus(ctx, client, events, cfg.NodeName, cfg.DataDir, shuttingDown.Load(), log)
			if err != nil && ctx.Err() == nil {
				log.Warn("reporting the node ready", "err", err)
			}
			// Ready on an upgrade's binary: the upgrade is kept, then the
			// Node says so (until it has, each renewal tries again).
			if err == nil && annotated.Load() && cfg.Self != nil && !shuttingDown.Load() && cfg.Self.Ready() {
				keptToReport = true
			}
			if keptToReport {
				if err := keptUpgrade(ctx, client, cfg.NodeName); err != nil {
					log.Warn("reporting the upgrade kept (retrying)", "err", err)
				} else {
					keptToReport = false
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// register creates the Node, or takes over the one of the same name, and
// reports its status.
func register(ctx context.Context, client *kube.Client, events kube.EventRecorder, cfg Config, rt runtimeState) error {
	labels := map[string]string{corev1.LabelHostname: cfg.NodeName, corev1.LabelOSStable: runtime.GOOS, corev1.LabelArchStable: runtime.GOARCH}
	for k, v := range cfg.Labels {
		labels[k] = v
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: cfg.NodeName, Labels: labels}, Spec: corev1.NodeSpec{Taints: cfg.Taints}}
	created, err := client.Nodes().Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		created, err = client.Nodes().Get(ctx, cfg.NodeName, metav1.GetOptions{})
	}
	if err != nil {
		return fmt.Errorf("register node %s: %w", cfg.NodeName, err)
	}
	status := nodeStatus(cfg, rt)
	if !cfg.DisableNetworkPolicy {
		ensureBridgeNetfilter(cfg.Logger) // before the check reads it
	}
	if c, ok := networkPolicyCondition(cfg, netpolicy.KernelSupport); ok {
		status.Conditions = append(status.Conditions, c)
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		created.Status = status
		_, err := client.Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			if latest, gerr := client.Nodes().Get(ctx, cfg.NodeName, metav1.GetOptions{}); gerr == nil {
				created = latest
			}
		}
		if err != nil {
			return fmt.Errorf("node %s status: %w", cfg.NodeName, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	// The kubelet's first status reports each pressure condition; Ready
	// follows once the pods run (syncNodeStatus).
	for _, c := range status.Conditions {
		if c.Type != corev1.NodeReady && c.Type != NodeNetworkPolicyUnavailable {
			recordConditionEvent(events, cfg.NodeName, c)
		}
	}
	return nil
}

// recordConditionEvent records a node condition's new status as the
// kubelet does: NodeReady or NodeNotReady, and NodeHasSufficientMemory,
// NodeHasDiskPressure and the like for the pressure conditions (the
// condition's reason with Node for Kubelet).
func recordConditionEvent(events kube.EventRecorder, name string, c corev1.NodeCondition) {
	reason := "Node" + strings.TrimPrefix(c.Reason, "Kubelet")
	if c.Type == corev1.NodeReady {
		reason = "NodeNotReady"
		if c.Status == corev1.ConditionTrue {
			reason = "NodeReady"
		}
	}
	events.Eventf(pods.NodeRef(name), nil, corev1.EventTypeNormal, reason, reason, "Node %s status is now: %s", name, reason)
}

// nodeStatus describes this machine as a kubelet would.
func nodeStatus(cfg Config, rt runtimeState) corev1.NodeStatus {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(memoryBytes(), resource.BinarySI),
		corev1.ResourcePods:   *resource.NewQuantity(110, resource.DecimalSI),
	}
	if disk := diskBytes(cfg.DataDir); disk > 0 {
		capacity[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(disk, resource.BinarySI)
	}
	now := metav1.Now()
	kubeVersion := kubeversion.Info(cfg.Version).GitVersion
	var addresses []corev1.NodeAddress
	for _, ip := range cfg.NodeIPs {
		addresses = append(addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	for _, ip := range cfg.NodeExternalIPs {
		addresses = append(addresses, corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: ip})
	}
	addresses = append(addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: cfg.NodeName})
	// Every condition is False: no pressure, and not Ready until the pod
	// manager runs (runPods).
	condition := func(t corev1.NodeConditionType, reason, message string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: corev1.ConditionFalse, Reason: reason, Message: message, LastHeartbeatTime: now, LastTransitionTime: now}
	}
	return corev1.NodeStatus{
		Capacity: capacity, Allocatable: capacity, Addresses: addresses,
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(cfg.KubeletPort)}},
		Conditions: []corev1.NodeCondition{
			condition(corev1.NodeReady, "ContainerRuntimeNotReady", rt.notReady()),
			condition(corev1.NodeMemoryPressure, "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
			condition(corev1.NodeDiskPressure, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
			condition(corev1.NodePIDPressure, "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
		},
		NodeInfo: corev1.NodeSystemInfo{
			KubeletVersion: kubeVersion, OperatingSystem: runtime.GOOS, Architecture: runtime.GOARCH,
			KernelVersion: kernelVersion(), OSImage: osImage(), ContainerRuntimeVersion: rt.version,
		},
	}
}

// runPods starts the pod manager once the node has its pod network (from
// node IPAM, or from the checkpoint when the server is unreachable); the
// lease loop then reports the node Ready.
func runPods(ctx context.Context, client *kube.Client, events kube.EventRecorder, rt runtimeState, cfg Config, mirrors *registries.Config, kapi *kubeletAPI, cp *checkpoint.Checkpoint,
	policies pods.Policer, podsRunning, shuttingDown *atomic.Bool, registered <-chan struct{}, log *slog.Logger) {
	// The air-gap images are in before the first pod looks for them, as
	// k3s imports them before its kubelet starts: else a pod scheduled
	// at join races the import, goes to the registry an air-gapped node
	// cannot reach, and waits out a pull back-off.
	if _, err := rt.images.Scan(ctx); err != nil && ctx.Err() == nil {
		log.Warn("image import", "err", err)
	}
	go rt.images.Run(ctx, 10*time.Second)
	saved, err := cp.Node()
	if err != nil {
		log.Error("reading the checkpoint", "err", err)
	}
	node := saved
	for node.PodCIDR == "" {
		if n, err := client.Nodes().Get(ctx, cfg.NodeName, metav1.GetOptions{}); err == nil {
			node = checkpoint.Node{PodCIDR: n.Spec.PodCIDR, Allocatable: n.Status.Allocatable}
		}
		if node.PodCIDR == "" {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}
	if node.PodCIDR != saved.PodCIDR {
		if err := cp.SaveNode(node); err != nil {
			log.Error("checkpoint", "err", err)
		}
	}
	nodeIP := ""
	if len(cfg.NodeIPs) > 0 {
		nodeIP = cfg.NodeIPs[0]
	}
	hostname, _ := os.Hostname()
	m, err := pods.New(pods.Config{API: client, Runtime: orchctr.NewClient(rt.client), Node: cfg.NodeName, NodeIP: nodeIP, NodeHostname: hostname,
		PodCIDR: node.PodCIDR, ClusterCIDR: cfg.ClusterCIDR, MTU: podMTU(cfg, log), DataDir: filepath.Join(cfg.DataDir, "agent"), RuntimeDir: cfg.runtimeDir(), ClusterDNS: cfg.ClusterDNS, ClusterDomain: cfg.ClusterDomain, ResolvConf: resolvConf(cfg),
		Allocatable: node.Allocatable, Checkpoint: cp, ImageGC: cfg.ImageGC, RemoveOrphanCgroups: true, Registries: mirrors, Eviction: evictionConfig(cfg.Eviction, cfg.DataDir), Logger: log,
		Events: events, Policies: policies})
	if err != nil {
		log.Error("pod manager", "err", err)
		return
	}
	managed := make(chan struct{})
	go func() {
		defer close(managed)
		m.Run(ctx)
	}()
	kapi.pods.Store(m)
	podsRunning.Store(true)
	shutdownCfg := cfg.Shutdown
	shutdownCfg.Logger = log
	graceful := shutdown.New(shutdownCfg, m, func(on bool) {
		// NotReady at once, so that nothing more is scheduled here.
		shuttingDown.Store(on)
		if on {
			events.Eventf(pods.NodeRef(cfg.NodeName), nil, corev1.EventTypeNormal, "Shutdown", "Shutdown", "Shutdown manager detected shutdown event")
		}
		if isClosed(registered) {
			if err := syncNodeStatus(ctx, client, events, cfg.NodeName, cfg.DataDir, on, log); err != nil && ctx.Err() == nil {
				log.Warn("reporting the node's shutdown", "err", err)
			}
		}
	})
	shutdownDone := make(chan struct{})
	go func() {
		defer close(shutdownDone)
		graceful.Run(ctx)
	}()
	select { // at once, not at the next lease renewal
	case <-ctx.Done():
	case <-registered:
		if err := syncNodeStatus(ctx, client, events, cfg.NodeName, cfg.DataDir, shuttingDown.Load(), log); err != nil && ctx.Err() == nil {
			log.Warn("reporting the node ready (the lease loop retries)", "err", err)
		}
	}
	// The pods' manager writes the checkpoint to its last sync: runPods
	// returns only after it, and Run closes the checkpoint only after that.
	<-managed
	<-shutdownDone
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// syncNodeStatus sets the node's Ready condition True when it is not (or
// False while the machine shuts down, as the kubelet reports it) and its
// pressure conditions as memory, disk and processes stand, writing only
// what changed.
func syncNodeStatus(ctx context.Context, client *kube.Client, events kube.EventRecorder, name, dataDir string, shuttingDown bool, log *slog.Logger) error {
	ready := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "orch agent is posting ready status"}
	if shuttingDown {
		ready.Status, ready.Reason, ready.Message = corev1.ConditionFalse, "KubeletNotReady", "node is shutting down"
	}
	want := pressureConditions(readNode(dataDir))
	var changed []corev1.NodeCondition
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		changed = changed[:0]
		n, err := client.Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		for i := range n.Status.Conditions {
			c := &n.Status.Conditions[i]
			if c.Type == corev1.NodeReady && (c.Status != ready.Status || shuttingDown && c.Message != ready.Message) {
				c.Status, c.Reason, c.Message, c.LastHeartbeatTime, c.LastTransitionTime = ready.Status, ready.Reason, ready.Message, now, now
				changed = append(changed, *c)
			}
			for _, w := range want {
				if c.Type == w.Type && c.Status != w.Status {
					c.Status, c.Reason, c.Message, c.LastHeartbeatTime, c.LastTransitionTime = w.Status, w.Reason, w.Message, now, now
					changed = append(changed, *c)
				}
			}
		}
		if len(changed) == 0 {
			return nil
		}
		_, err = client.Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return err
	}
	for _, c := range changed {
		log.Info("node condition", "type", c.Type, "status", c.Status)
		recordConditionEvent(events, name, c)
	}
	return nil
}

// renewLease creates or renews the node's Lease in kube-node-lease.
func renewLease(ctx context.Context, client *kube.Client, name string) error {
	leases := client.Leases(corev1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	lease, err := leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			// 40 s, the kubelet's: the grace the node lifecycle gives too.
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(name), RenewTime: &now, LeaseDurationSeconds: ptr.To[int32](40)},
		}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	lease.Spec.RenewTime = &now
	_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
	return err
}

func memoryBytes() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer func() { _ = f.Close() }()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			kb, _ := strconv.ParseInt(fields[1], 10, 64)
			return kb * 1024
		}
	}
	return 0
}

func diskBytes(dir string) int64 {
	var st syscall.Statfs_t
	if err := os.MkdirAll(dir, 0o700); err != nil || syscall.Statfs(dir, &st) != nil {
		return 0
	}
	return int64(st.Blocks) * int64(st.Bsize) // Bsize is an int32 on 32-bit ARM
}

func kernelVersion() string {
	data, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(data))
}

func osImage() string {
	data, err := os.ReadFile("/etc/os-release")
	if err != nil {
		return runtime.GOOS
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return runtime.GOOS
}
