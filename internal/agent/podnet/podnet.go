// Package podnet gives a pod its network and the namespaces its
// containers share: a network namespace wired by CNI (the node's bridge,
// host-local addresses from its podCIDR, portmap for host ports, one
// iptables rule masquerading what leaves the cluster), and namespaces of
// any kind kept alive by a bind mount and entered on a thread of their
// own.
package podnet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/orch-dev/orch/internal/iptables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
)

// pluginDirs are where Debian's containernetworking-plugins live.
var pluginDirs = []string{"/usr/lib/cni", "/opt/cni/bin"}

// Network gives pods their network namespace and address with CNI: a
// bridge on the node with host-local addresses from the node's podCIDR
// and the bridge as pods' default gateway, and portmap for pods with host
// ports; one iptables rule masquerades what leaves the cluster.
type Network struct {
	cni *libcni.CNIConfig
	// plain wires a pod; withPorts also maps its host ports.
	plain, withPorts *libcni.NetworkConfigList
	netnsAt          string

	// firstMu serialises set-ups until one has made the bridge, so that
	// concurrent first pods do not race to create it; after that pods are
	// wired in parallel (host-local locks its own store).
	firstMu sync.RWMutex
	bridged atomic.Bool
	// portsMu serialises port mappings: portmap creates its iptables
	// chains without guarding against a concurrent creator.
	portsMu sync.Mutex
}

// New readies the node's pod network: CNI configurations over the node's
// podCIDR (state under runDir: the namespace pins, the plugins' cache
// and addresses, none of which outlives a reboot) and the masquerade rule for traffic
// leaving clusterCIDR. mtu is the pods' interfaces' (zero: their links'
// default), less than the node's when a tunnel carries pods' traffic to
// other nodes.
func New(runDir, podCIDR, clusterCIDR string, mtu int, ipt iptables.Interface) (*Network, error) {
	// The bridge plugin's ipMasq would add an iptables chain per pod (six
	// iptables runs, each taking the xtables lock and rewriting the
	// table): one node-wide rule (masquerade) does the same work and made
	// 30 pods starting at once Running 40% sooner.
	bridge := map[string]any{"type": "bridge", "bridge": bridgeName, "isGateway": true, "isDefaultGateway": true, "hairpinMode": true,
		"ipam": map[string]any{"type": "host-local", "ranges": [][]map[string]string{{{"subnet": podCIDR}}},
			"dataDir": filepath.Join(runDir, "cni", "ipam")}}
	if mtu > 0 {
		bridge["mtu"] = mtu
	}
	portmap := map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}}
	confList := func(plugins ...any) (*libcni.NetworkConfigList, error) {
		conf, err := json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": "orch", "plugins": plugins})
		if err != nil {
			return nil, err
		}
		list, err := libcni.ConfListFromBytes(conf)
		if err != nil {
			return nil, fmt.Errorf("CNI config: %w", err)
		}
		return list, nil
	}
	plain, err := confList(bridge)
	if err != nil {
		return nil, err
	}
	withPorts, err := confList(bridge, portmap)
	if err != nil {
		return nil, err
	}
	if err := masquerade(ipt, podCIDR, clusterCIDR); err != nil {
		return nil, err
	}
	netnsAt := filepath.Join(runDir, "netns")
	if err := os.MkdirAll(netnsAt, 0o700); err != nil {
		return nil, err
	}
	exec := &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}}
	return &Network{cni: libcni.NewCNIConfigWithCacheDir(pluginDirs, filepath.Join(runDir, "cni", "cache"), exec),
		plain: plain, withPorts: withPorts, netnsAt: netnsAt}, nil
}

// bridgeName is the node's pod bridge.
const bridgeName = "orch0"

// masquerade makes pod traffic leaving the cluster appear to come from
// the node, once for the whole podCIDR: what goes to another pod, on this
// node (through the bridge) or another (in clusterCIDR), keeps the pod's
// address, as Kubernetes' pod network model requires.
func masquerade(ipt iptables.Interface, podCIDR, clusterCIDR string) error {
	// Earlier versions masqueraded traffic to other nodes' pods too.
	legacy := []string{"-s", podCIDR, "!", "-o", bridgeName, "-m", "comment", "--comment", "orch: pod traffic leaving the node", "-j", "MASQUERADE"}
	if err := ipt.DeleteRule("nat", "POSTROUTING", legacy...); err != nil {
		return err
	}
	return ipt.EnsureRule("nat", "POSTROUTING", "-s", podCIDR, "!", "-d", clusterCIDR, "!", "-o", bridgeName,
		"-m", "comment", "--comment", "orch: pod traffic leaving the cluster", "-j", "MASQUERADE")
}

// PortMapping is one hostPort as portmap's runtime config names it.
type PortMapping struct {
	HostPort      int32  `json:"hostPort"`
	ContainerPort int32  `json:"containerPort"`
	Protocol      string `json:"protocol"`
	HostIP        string `json:"hostIP,omitempty"`
}

// HostPorts are the pod's container ports published on the node.
func HostPorts(pod *corev1.Pod) []PortMapping {
	var out []PortMapping
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.HostPort != 0 {
				out = append(out, PortMapping{HostPort: p.HostPort, ContainerPort: p.ContainerPort, Protocol: strings.ToLower(string(p.Protocol)), HostIP: p.HostIP})
			}
		}
	}
	return out
}

func (n *Network) runtimeConf(id, nsPath, namespace, name string, ports []PortMapping) *libcni.RuntimeConf {
	rc := &libcni.RuntimeConf{ContainerID: id, NetNS: nsPath, IfName: "eth0", Args: [][2]string{
		{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", namespace}, {"K8S_POD_NAME", name}, {"K8S_POD_INFRA_CONTAINER_ID", id},
	}}
	if len(ports) > 0 {
		rc.CapabilityArgs = map[string]any{"portMappings": ports}
	}
	return rc
}

func (n *Network) list(ports []PortMapping) *libcni.NetworkConfigList {
	if len(ports) > 0 {
		return n.withPorts
	}
	return n.plain
}

// SetUp makes the pod's network namespace and returns its path and IP. A
// set-up that fails half-way (CNI finding the disk full) is undone, so
// that the next try starts afresh instead of tripping on the namespace
// the last one left.
func (n *Network) SetUp(ctx context.Context, id, namespace, name string, ports []PortMapping) (_, _ string, err error) {
	nsPath := n.NSPath(id)
	if err := newNetNS(nsPath); err != nil {
		return "", "", err
	}
	defer func() {
		if err != nil {
			if terr := n.TearDown(context.WithoutCancel(ctx), id, namespace, name, ports); terr != nil {
				err = fmt.Errorf("%w (and undoing it: %w)", err, terr)
			}
		}
	}()
	if err := bringUpLoopback(nsPath); err != nil {
		return "", "", err
	}
	unlock := n.lock(ports)
	res, err := n.cni.AddNetworkList(ctx, n.list(ports), n.runtimeConf(id, nsPath, namespace, name, ports))
	if err == nil {
		n.bridged.Store(true)
	}
	unlock()
	if err != nil {
		return "", "", fmt.Errorf("CNI add: %w", err)
	}
	result, err := types100.NewResultFromResult(res)
	if err != nil {
		return "", "", fmt.Errorf("CNI result: %w", err)
	}
	if len(result.IPs) == 0 {
		return "", "", fmt.Errorf("CNI gave pod %s/%s no address", namespace, name)
	}
	return nsPath, result.IPs[0].Address.IP.String(), nil
}

// lock takes what a CNI call with these ports needs and returns its release.
func (n *Network) lock(ports []PortMapping) func() {
	n.firstMu.RLock()
	release := n.firstMu.RUnlock
	if !n.bridged.Load() {
		n.firstMu.RUnlock()
		n.firstMu.Lock()
		release = n.firstMu.Unlock
	}
	if len(ports) > 0 {
		n.portsMu.Lock()
		return func() { n.portsMu.Unlock(); release() }
	}
	return release
}

// CachedIP is the address CNI gave the pod, from libcni's cache: an
// adopted pod's when its status does not say.
func (n *Network) CachedIP(id, namespace, name string, ports []PortMapping) string {
	res, err := n.cni.GetNetworkListCachedResult(n.list(ports), n.runtimeConf(id, n.NSPath(id), namespace, name, ports))
	if err != nil || res == nil {
		return ""
	}
	result, err := types100.NewResultFromResult(res)
	if err != nil || len(result.IPs) == 0 {
		return ""
	}
	return result.IPs[0].Address.IP.String()
}

// Release gives back an address a pod held before the node restarted:
// its namespace is gone, so the plugins are told of none.
func (n *Network) Release(ctx context.Context, id, namespace, name string, ports []PortMapping) error {
	unlock := n.lock(ports)
	err := n.cni.DelNetworkList(ctx, n.list(ports), n.runtimeConf(id, "", namespace, name, ports))
	unlock()
	if err != nil {
		return fmt.Errorf("CNI del: %w", err)
	}
	_ = os.Remove(n.NSPath(id))
	return nil
}

// Alive reports whether the pod's network namespace is still there (it
// is not after a reboot: the file that held it stays behind).
func (n *Network) Alive(id string) bool {
	var st unix.Statfs_t
	return unix.Statfs(n.NSPath(id), &st) == nil && st.Type == unix.NSFS_MAGIC
}

// Stale reports whether a namespace file is left from before a restart.
func (n *Network) Stale(id string) bool {
	_, err := os.Stat(n.NSPath(id))
	return err == nil && !n.Alive(id)
}

// TearDown releases the pod's address and removes its namespace.
func (n *Network) TearDown(ctx context.Context, id, namespace, name string, ports []PortMapping) error {
	nsPath := n.NSPath(id)
	unlock := n.lock(ports)
	err := n.cni.DelNetworkList(ctx, n.list(ports), n.runtimeConf(id, nsPath, namespace, name, ports))
	unlock()
	if err != nil {
		return fmt.Errorf("CNI del: %w", err)
	}
	_ = unix.Unmount(nsPath, unix.MNT_DETACH)
	if err := os.Remove(nsPath); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

// newNetNS creates a network namespace kept alive by a bind mount at path.
func newNetNS(path string) error { return NewNamespace(Net, path, nil) }

// bringUpLoopback sets lo up inside the namespace, as runtimes do.
func bringUpLoopback(nsPath string) error {
	return InNetNS(nsPath, func() error {
		lo, err := net.InterfaceByName("lo")
		if err != nil {
			return err
		}
		return raiseLink(lo.Name)
	})
}

// NSPath is the pod's network namespace.
func (n *Network) NSPath(id string) string { return filepath.Join(n.netnsAt, id) }

// onNetNSThread runs fn, which may move its thread into another network
// namespace, on a thread of its own (onNSThread).
func onNetNSThread(fn func() error) error { return onNSThread(Net, fn) }

// Kind is a kind of namespace: its name under /proc/<tid>/ns and its
// clone flag.
type Kind struct {
	name string
	flag int
}

// The kinds of namespace a pod has of its own.
var (
	Net = Kind{"net", unix.CLONE_NEWNET}
	IPC = Kind{"ipc", unix.CLONE_NEWIPC}
	UTS = Kind{"uts", unix.CLONE_NEWUTS}
)

// onNSThread runs fn, which may move its thread into another namespace of
// the kind, on a thread of its own that is returned to the host's
// namespace before any other goroutine can use it; a thread that cannot
// go back is let die with its goroutine.
func onNSThread(kind Kind, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		host, err := os.Open("/proc/thread-self/ns/" + kind.name)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer func() { _ = host.Close() }()
		err = fn()
		if serr := unix.Setns(int(host.Fd()), kind.flag); serr != nil {
			errc <- fmt.Errorf("return to the host %s namespace: %w", kind.name, serr)
			return // still locked: the thread ends with the goroutine
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// NewNamespace creates a namespace of the kind, runs init in it, and keeps
// it alive by a bind mount at path.
func NewNamespace(kind Kind, path string, init func() error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	_ = f.Close()
	err = onNSThread(kind, func() error {
		if err := unix.Unshare(kind.flag); err != nil {
			return fmt.Errorf("unshare: %w", err)
		}
		if init != nil {
			if err := init(); err != nil {
				return err
			}
		}
		return unix.Mount("/proc/thread-self/ns/"+kind.name, path, "", unix.MS_BIND, "")
	})
	if err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("%s namespace %s: %w", kind.name, path, err)
	}
	return nil
}

// raiseLink raises an interface's IFF_UP flag.
func raiseLink(name string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
	if err != nil {
		return err
	}
	defer func() { _ = unix.Close(fd) }()
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// InNetNS runs fn in the network namespace at path.
func InNetNS(path string, fn func() error) error {
	target, err := os.Open(path)
	if err != nil {
		return err
	}
	defer func() { _ = target.Close() }()
	return onNetNSThread(func() error {
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			return err
		}
		return fn()
	})
}

// Cleanup removes what the pods' network left on the node once its pods
// are gone, for a node being uninstalled after orch has stopped: the
// pods' bridge, the masquerade rule and portmap's chains (CNI-*, as k3s's
// uninstall removes them). It returns what it removed, by kind.
func Cleanup(ipt iptables.Interface) (map[string]int, error) {
	removed := map[string]int{}
	var errs []error
	n, err := iptables.RemoveOwned(ipt, "nat", func(chain string) bool { return strings.HasPrefix(chain, "CNI-") },
		func(rule string) bool { return strings.Contains(rule, "orch: pod traffic leaving") })
	if err != nil {
		errs = append(errs, fmt.Errorf("nat table: %w", err))
	}
	removed["iptables nat"] = n
	if link, err := netlink.LinkByName(bridgeName); err == nil {
		if err := netlink.LinkDel(link); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", bridgeName, err))
		} else {
			removed["links"]++
		}
	} else if !errors.As(err, new(netlink.LinkNotFoundError)) {
		errs = append(errs, fmt.Errorf("%s: %w", bridgeName, err))
	}
	return removed, errors.Join(errs...)
}
