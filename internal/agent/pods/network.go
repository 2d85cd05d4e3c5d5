package pods

import (
	"context"
	"encoding/json"
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
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
)

// pluginDirs are where Debian's containernetworking-plugins live.
var pluginDirs = []string{"/usr/lib/cni", "/opt/cni/bin"}

// network gives pods their network namespace and address with CNI: a
// bridge on the node with host-local addresses from the node's podCIDR
// and the bridge as pods' default gateway, and portmap for pods with host
// ports; one iptables rule masquerades what leaves the cluster.
type network struct {
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

func newNetwork(dataDir, podCIDR, clusterCIDR string) (*network, error) {
	// The bridge plugin's ipMasq would add an iptables chain per pod (six
	// iptables runs, each taking the xtables lock and rewriting the
	// table): one node-wide rule (masquerade) does the same work and made
	// 30 pods starting at once Running 40% sooner.
	bridge := map[string]any{"type": "bridge", "bridge": bridgeName, "isGateway": true, "isDefaultGateway": true, "hairpinMode": true,
		"ipam": map[string]any{"type": "host-local", "ranges": [][]map[string]string{{{"subnet": podCIDR}}},
			"dataDir": filepath.Join(dataDir, "cni", "ipam")}}
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
	ipt, err := iptables.IPv4()
	if err != nil {
		return nil, err
	}
	if err := masquerade(ipt, podCIDR, clusterCIDR); err != nil {
		return nil, err
	}
	netnsAt := filepath.Join(dataDir, "netns")
	if err := os.MkdirAll(netnsAt, 0o700); err != nil {
		return nil, err
	}
	exec := &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}}
	return &network{cni: libcni.NewCNIConfigWithCacheDir(pluginDirs, filepath.Join(dataDir, "cni", "cache"), exec),
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

// portMapping is one hostPort as portmap's runtime config names it.
type portMapping struct {
	HostPort      int32  `json:"hostPort"`
	ContainerPort int32  `json:"containerPort"`
	Protocol      string `json:"protocol"`
	HostIP        string `json:"hostIP,omitempty"`
}

// hostPorts are the pod's container ports published on the node.
func hostPorts(pod *corev1.Pod) []portMapping {
	var out []portMapping
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.HostPort != 0 {
				out = append(out, portMapping{HostPort: p.HostPort, ContainerPort: p.ContainerPort, Protocol: strings.ToLower(string(p.Protocol)), HostIP: p.HostIP})
			}
		}
	}
	return out
}

func (n *network) runtimeConf(id, nsPath, namespace, name string, ports []portMapping) *libcni.RuntimeConf {
	rc := &libcni.RuntimeConf{ContainerID: id, NetNS: nsPath, IfName: "eth0", Args: [][2]string{
		{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", namespace}, {"K8S_POD_NAME", name}, {"K8S_POD_INFRA_CONTAINER_ID", id},
	}}
	if len(ports) > 0 {
		rc.CapabilityArgs = map[string]any{"portMappings": ports}
	}
	return rc
}

func (n *network) list(ports []portMapping) *libcni.NetworkConfigList {
	if len(ports) > 0 {
		return n.withPorts
	}
	return n.plain
}

// setUp makes the pod's network namespace and returns its path and IP. A
// set-up that fails half-way (CNI finding the disk full) is undone, so
// that the next try starts afresh instead of tripping on the namespace
// the last one left.
func (n *network) setUp(ctx context.Context, id, namespace, name string, ports []portMapping) (_, _ string, err error) {
	nsPath := n.nsPath(id)
	if err := newNetNS(nsPath); err != nil {
		return "", "", err
	}
	defer func() {
		if err != nil {
			if terr := n.tearDown(context.WithoutCancel(ctx), id, namespace, name, ports); terr != nil {
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
func (n *network) lock(ports []portMapping) func() {
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

// cachedIP is the address CNI gave the pod, from libcni's cache: an
// adopted pod's when its status does not say.
func (n *network) cachedIP(id, namespace, name string, ports []portMapping) string {
	res, err := n.cni.GetNetworkListCachedResult(n.list(ports), n.runtimeConf(id, n.nsPath(id), namespace, name, ports))
	if err != nil || res == nil {
		return ""
	}
	result, err := types100.NewResultFromResult(res)
	if err != nil || len(result.IPs) == 0 {
		return ""
	}
	return result.IPs[0].Address.IP.String()
}

// release gives back an address a pod held before the node restarted:
// its namespace is gone, so the plugins are told of none.
func (n *network) release(ctx context.Context, id, namespace, name string, ports []portMapping) error {
	unlock := n.lock(ports)
	err := n.cni.DelNetworkList(ctx, n.list(ports), n.runtimeConf(id, "", namespace, name, ports))
	unlock()
	if err != nil {
		return fmt.Errorf("CNI del: %w", err)
	}
	_ = os.Remove(n.nsPath(id))
	return nil
}

// alive reports whether the pod's network namespace is still there (it
// is not after a reboot: the file that held it stays behind).
func (n *network) alive(id string) bool {
	var st unix.Statfs_t
	return unix.Statfs(n.nsPath(id), &st) == nil && st.Type == unix.NSFS_MAGIC
}

// stale reports whether a namespace file is left from before a restart.
func (n *network) stale(id string) bool {
	_, err := os.Stat(n.nsPath(id))
	return err == nil && !n.alive(id)
}

// tearDown releases the pod's address and removes its namespace.
func (n *network) tearDown(ctx context.Context, id, namespace, name string, ports []portMapping) error {
	nsPath := n.nsPath(id)
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
func newNetNS(path string) error { return newNamespace(nsNet, path, nil) }

// bringUpLoopback sets lo up inside the namespace, as runtimes do.
func bringUpLoopback(nsPath string) error {
	return inNetNS(nsPath, func() error {
		lo, err := net.InterfaceByName("lo")
		if err != nil {
			return err
		}
		return setUp(lo.Name)
	})
}

// nsPath is the pod's network namespace.
func (n *network) nsPath(id string) string { return filepath.Join(n.netnsAt, id) }

// onNetNSThread runs fn, which may move its thread into another network
// namespace, on a thread of its own (onNSThread).
func onNetNSThread(fn func() error) error { return onNSThread(nsNet, fn) }

// nsKind is a kind of namespace: its name under /proc/<tid>/ns and its
// clone flag.
type nsKind struct {
	name string
	flag int
}

var (
	nsNet = nsKind{"net", unix.CLONE_NEWNET}
	nsIPC = nsKind{"ipc", unix.CLONE_NEWIPC}
	nsUTS = nsKind{"uts", unix.CLONE_NEWUTS}
)

// onNSThread runs fn, which may move its thread into another namespace of
// the kind, on a thread of its own that is returned to the host's
// namespace before any other goroutine can use it; a thread that cannot
// go back is let die with its goroutine.
func onNSThread(kind nsKind, fn func() error) error {
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

// newNamespace creates a namespace of the kind, runs init in it, and keeps
// it alive by a bind mount at path.
func newNamespace(kind nsKind, path string, init func() error) error {
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

// setUp raises an interface's IFF_UP flag.
func setUp(name string) error {
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
