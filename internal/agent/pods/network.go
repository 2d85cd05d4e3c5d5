package pods

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"golang.org/x/sys/unix"
)

// pluginDirs are where Debian's containernetworking-plugins live.
var pluginDirs = []string{"/usr/lib/cni", "/opt/cni/bin"}

// network gives pods their network namespace and address with CNI: a
// bridge on the node with host-local addresses from the node's podCIDR,
// masquerading out, and loopback.
type network struct {
	// mu serialises CNI calls: libcni's config is not safe for concurrent
	// use, and pod set-ups are few.
	mu      sync.Mutex
	cni     *libcni.CNIConfig
	list    *libcni.NetworkConfigList
	netnsAt string
}

func newNetwork(dataDir, podCIDR string) (*network, error) {
	conf, err := json.Marshal(map[string]any{
		"cniVersion": "1.0.0", "name": "orch",
		"plugins": []any{
			map[string]any{"type": "bridge", "bridge": "orch0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
				"ipam": map[string]any{"type": "host-local", "ranges": [][]map[string]string{{{"subnet": podCIDR}}},
					"dataDir": filepath.Join(dataDir, "cni", "ipam")}},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	})
	if err != nil {
		return nil, err
	}
	list, err := libcni.ConfListFromBytes(conf)
	if err != nil {
		return nil, fmt.Errorf("CNI config: %w", err)
	}
	netnsAt := filepath.Join(dataDir, "netns")
	if err := os.MkdirAll(netnsAt, 0o700); err != nil {
		return nil, err
	}
	exec := &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}}
	return &network{cni: libcni.NewCNIConfigWithCacheDir(pluginDirs, filepath.Join(dataDir, "cni", "cache"), exec), list: list, netnsAt: netnsAt}, nil
}

func (n *network) runtimeConf(id, nsPath, namespace, name string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: id, NetNS: nsPath, IfName: "eth0", Args: [][2]string{
		{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", namespace}, {"K8S_POD_NAME", name}, {"K8S_POD_INFRA_CONTAINER_ID", id},
	}}
}

// setUp makes the pod's network namespace and returns its path and IP.
func (n *network) setUp(ctx context.Context, id, namespace, name string) (string, string, error) {
	nsPath := filepath.Join(n.netnsAt, id)
	if err := newNetNS(nsPath); err != nil {
		return "", "", err
	}
	if err := bringUpLoopback(nsPath); err != nil {
		return "", "", err
	}
	n.mu.Lock()
	res, err := n.cni.AddNetworkList(ctx, n.list, n.runtimeConf(id, nsPath, namespace, name))
	n.mu.Unlock()
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

// tearDown releases the pod's address and removes its namespace.
func (n *network) tearDown(ctx context.Context, id, namespace, name string) error {
	nsPath := filepath.Join(n.netnsAt, id)
	n.mu.Lock()
	err := n.cni.DelNetworkList(ctx, n.list, n.runtimeConf(id, nsPath, namespace, name))
	n.mu.Unlock()
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
func newNetNS(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	_ = f.Close()
	err = onNetNSThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare network namespace: %w", err)
		}
		return unix.Mount("/proc/thread-self/ns/net", path, "", unix.MS_BIND, "")
	})
	if err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("network namespace %s: %w", path, err)
	}
	return nil
}

// bringUpLoopback sets lo up inside the namespace, as runtimes do.
func bringUpLoopback(nsPath string) error {
	target, err := os.Open(nsPath)
	if err != nil {
		return err
	}
	defer func() { _ = target.Close() }()
	return onNetNSThread(func() error {
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			return err
		}
		lo, err := net.InterfaceByName("lo")
		if err != nil {
			return err
		}
		return setUp(lo.Name)
	})
}

// onNetNSThread runs fn, which may move its thread into another network
// namespace, on a thread of its own that is returned to the host's
// namespace before any other goroutine can use it; a thread that cannot
// go back is let die with its goroutine.
func onNetNSThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		host, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer func() { _ = host.Close() }()
		err = fn()
		if serr := unix.Setns(int(host.Fd()), unix.CLONE_NEWNET); serr != nil {
			errc <- fmt.Errorf("return to the host network namespace: %w", serr)
			return // still locked: the thread ends with the goroutine
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
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
