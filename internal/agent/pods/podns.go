package pods

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/orch-dev/orch/internal/agent/podnet"
	"github.com/orch-dev/orch/internal/agent/volumes"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
)

// A pod's containers share more than its network: in Kubernetes they join
// the pause container's IPC and UTS namespaces and share one /dev/shm.
// orch has no pause container; each shared namespace is kept alive by a
// bind mount under the pod's directory (as its network namespace is), and
// /dev/shm is one tmpfs for the pod.

// shmSize is a pod's /dev/shm, containerd's and Docker's default (64 MiB).
const shmSize = "65536k"

func (m *Manager) sharedDir(uid string) string {
	return filepath.Join(m.runDir(uid), "shared")
}

// setUpSharedNamespaces makes (or, after an agent restart, keeps) what
// the pod's containers share: an IPC namespace and a /dev/shm unless
// hostIPC, a UTS namespace with the pod's hostname unless hostNetwork
// (whose pods have the node's, as in Kubernetes).
func (m *Manager) setUpSharedNamespaces(pod *corev1.Pod) error {
	dir := m.sharedDir(string(pod.UID))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if !pod.Spec.HostIPC {
		if path := filepath.Join(dir, "ipc"); !isNamespace(path) {
			if err := podnet.NewNamespace(podnet.IPC, path, nil); err != nil {
				return err
			}
		}
		shm := filepath.Join(dir, "shm")
		if err := os.MkdirAll(shm, 0o1777); err != nil {
			return err
		}
		if !volumes.IsMountPoint(shm) {
			if err := unix.Mount("shm", shm, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=1777,size="+shmSize); err != nil {
				return fmt.Errorf("pod /dev/shm: %w", err)
			}
		}
	}
	if !pod.Spec.HostNetwork {
		if path := filepath.Join(dir, "uts"); !isNamespace(path) {
			hostname := podHostname(pod, m.cfg.NodeHostname)
			if err := podnet.NewNamespace(podnet.UTS, path, func() error { return unix.Sethostname([]byte(hostname)) }); err != nil {
				return err
			}
		}
	}
	return nil
}

// tearDownSharedNamespaces unmounts the pod's shared namespaces and
// /dev/shm, so that its directory can go.
func (m *Manager) tearDownSharedNamespaces(uid string) error {
	dir := m.sharedDir(uid)
	for _, name := range []string{"ipc", "uts", "shm"} {
		path := filepath.Join(dir, name)
		if _, err := os.Stat(path); err != nil {
			continue
		}
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) { // EINVAL: not mounted
			return fmt.Errorf("unmount %s: %w", path, err)
		}
	}
	return nil
}

// isNamespace says whether path is a namespace kept by a bind mount (not
// the empty file a reboot leaves).
func isNamespace(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}

// sharedNamespaceOpts make a container join its pod's IPC and UTS
// namespaces and /dev/shm, or the host's.
func (m *Manager) sharedNamespaceOpts(pod *corev1.Pod) []oci.SpecOpts {
	dir := m.sharedDir(string(pod.UID))
	var opts []oci.SpecOpts
	if pod.Spec.HostIPC {
		opts = append(opts, oci.WithHostNamespace(specs.IPCNamespace), withShm("/dev/shm"))
	} else {
		opts = append(opts, oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.IPCNamespace, Path: filepath.Join(dir, "ipc")}),
			withShm(filepath.Join(dir, "shm")))
	}
	if pod.Spec.HostNetwork {
		// The host's UTS namespace, whose hostname a container may not set.
		opts = append(opts, oci.WithHostNamespace(specs.UTSNamespace), oci.WithHostname(""))
	} else {
		opts = append(opts, oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.UTSNamespace, Path: filepath.Join(dir, "uts")}))
	}
	return opts
}

// withShm puts a bind of source where the default spec mounts the
// container's own /dev/shm, so that a volume the pod mounts there (an
// emptyDir of medium Memory, the usual way to enlarge it) still comes
// later and wins.
func withShm(source string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *specs.Spec) error {
		shm := specs.Mount{Destination: "/dev/shm", Type: "bind", Source: source, Options: []string{"rbind", "rprivate", "nosuid", "nodev", "noexec"}}
		for i, mnt := range s.Mounts {
			if mnt.Destination == "/dev/shm" && mnt.Type == "tmpfs" {
				s.Mounts[i] = shm
				return nil
			}
		}
		s.Mounts = append([]specs.Mount{shm}, s.Mounts...)
		return nil
	}
}
