package pods

import (
	"context"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/orch-dev/orch/internal/agent/volumes"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// shimGroup names, in a container's OCI annotations, the containerd shim
// it runs in: containers with the same value share one shim process.
const shimGroup = "io.containerd.runc.v2.group"

// shimGroups is how many shims a node's pods share. A shim per pod, as
// the CRI plugin runs one per sandbox, costs a board about 3 MB each (30
// pods: 88 MB of shims, more than the agent) and its spawn is a third of
// a container's start. One shim for every pod would serialize their
// starts (a shim creates one container at a time: a burst of 30 pods
// took p50 1.9 s instead of 1.1) and put every pod behind one process,
// whose death ends the containers it runs. Four, measured on 30 pods:
// shims 88 -> 21 MB (PSS), a burst as fast as with a shim each.
const shimGroups = 4

// shimGroupOf is the shim a pod's containers run in: all of one pod's in
// the same (as the CRI plugin groups a sandbox's), pods spread evenly over
// shimGroups by UID, so that a restarted agent or a container restarted
// later finds the same one.
func shimGroupOf(uid types.UID) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(uid))
	return "orch-pods-" + strconv.FormatUint(uint64(h.Sum32()%shimGroups), 10)
}

// defaultRuntimeHandler is the RuntimeClass handler the node's containerd
// runs pods with, named as containerd's CRI names its runc runtime.
const defaultRuntimeHandler = "runc"

// cpuPeriod is the CFS period the kubelet uses, in microseconds.
const cpuPeriod = 100_000

// containerSpec is the OCI spec of one pod container: the image's config
// overlaid with the container's command, env, mounts, resources and
// security context.
func (m *Manager) containerSpec(pod *corev1.Pod, c *corev1.Container, img containerd.Image, nsPath string, env []string, vols volumes.Paths) ([]oci.SpecOpts, error) {
	lookup := envLookup(env)
	c, err := expandSubPaths(c, lookup)
	if err != nil {
		return nil, err
	}
	volumeMounts, err := volumes.Mounts(c, vols)
	if err != nil {
		return nil, fromVolumes(err)
	}
	command, args := expandAll(c.Command, lookup), expandAll(c.Args, lookup)
	// Kubernetes' rule: command replaces the image's Entrypoint (and drops
	// its Cmd); args alone replace only the Cmd.
	imageConfig := oci.WithImageConfig(img)
	if len(command) == 0 && len(args) > 0 {
		imageConfig = oci.WithImageConfigArgs(img, args)
	}
	opts := []oci.SpecOpts{imageConfig, oci.WithHostname(podHostname(pod, m.cfg.NodeHostname)), oci.WithEnv(env),
		oci.WithAnnotations(map[string]string{shimGroup: shimGroupOf(pod.UID)}),
		oci.WithMounts(append(append([]specs.Mount{cgroupMount()}, m.etcMounts(pod, c)...), volumeMounts...))}
	if unifiedCgroups() && (c.SecurityContext == nil || !ptrTrue(c.SecurityContext.Privileged)) {
		// Its own cgroup as the root of /sys/fs/cgroup, as containerd's
		// CRI gives it on cgroup v2.
		opts = append(opts, oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.CgroupNamespace}))
	}
	if pod.Spec.HostNetwork {
		opts = append(opts, oci.WithHostNamespace(specs.NetworkNamespace))
	} else {
		opts = append(opts, oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: nsPath}))
	}
	opts = append(opts, m.sharedNamespaceOpts(pod)...)
	if pod.Spec.HostPID {
		opts = append(opts, oci.WithHostNamespace(specs.PIDNamespace))
	}
	if len(command) > 0 {
		opts = append(opts, oci.WithProcessArgs(append(command, args...)...))
	}
	if c.WorkingDir != "" {
		opts = append(opts, oci.WithProcessCwd(c.WorkingDir))
	}
	if c.TTY {
		// A terminal, and TERM=xterm, as the CRI runtimes give it.
		opts = append(opts, oci.WithTTY)
	}
	opts = append(opts, withResources(c.Resources))
	if score, ok := oomScoreAdj(pod, c, m.cfg.Allocatable.Memory().Value()); ok {
		opts = append(opts, withOOMScoreAdj(max(score, OOMScoreFloor())))
	}
	return append(opts, securityOpts(pod, c)...), nil
}

// cgroupMount shows a container its own cgroups at /sys/fs/cgroup, read
// only (privileged: writable), as the CRI runtimes mount it: the JVM,
// Go's and Node's runtimes size themselves from the limits there, and
// Kubernetes' conformance suite reads a resize there. A new one each
// time: containerd's WithWriteableCgroupfs rewrites the options in place.
func cgroupMount() specs.Mount {
	return specs.Mount{Source: "cgroup", Destination: "/sys/fs/cgroup", Type: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}}
}

// unifiedCgroups says whether the node runs cgroup v2 alone.
var unifiedCgroups = sync.OnceValue(func() bool {
	var st unix.Statfs_t
	return unix.Statfs("/sys/fs/cgroup", &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
})

func envLookup(env []string) func(string) (string, bool) {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func expandAll(in []string, lookup func(string) (string, bool)) []string {
	if in == nil {
		return nil
	}
	out := make([]string, len(in))
	for i, s := range in {
		out[i] = expand(s, lookup)
	}
	return out
}

// withResources enforces the container's limits through its cgroup as
// the kubelet does (linuxResources).
func withResources(r corev1.ResourceRequirements) oci.SpecOpts {
	return func(ctx context.Context, client oci.Client, ctr *containers.Container, s *oci.Spec) error {
		if s.Linux == nil {
			s.Linux = &specs.Linux{}
		}
		if s.Linux.Resources == nil {
			s.Linux.Resources = &specs.LinuxResources{}
		}
		res := linuxResources(r)
		s.Linux.Resources.Memory, s.Linux.Resources.CPU = res.Memory, res.CPU
		return nil
	}
}

// oomScoreAdj is the kubelet's: when the node runs out of memory, the
// kernel kills BestEffort containers first (1000), then Burstable ones by
// how little of the node they asked for, and Guaranteed ones and
// node-critical pods last (-997). ok is false where the node's memory is
// not known (a Burstable container's score depends on it).
func oomScoreAdj(pod *corev1.Pod, c *corev1.Container, memoryCapacity int64) (int, bool) {
	const guaranteed, bestEffort = -997, 1000
	if pod.Spec.PriorityClassName == "system-node-critical" {
		return guaranteed, true
	}
	switch pod.Status.QOSClass {
	case corev1.PodQOSGuaranteed:
		return guaranteed, true
	case corev1.PodQOSBestEffort, "":
		return bestEffort, true
	}
	if memoryCapacity <= 0 {
		return 0, false
	}
	score := int(1000 - 1000*c.Resources.Requests.Memory().Value()/memoryCapacity)
	switch {
	case score < 1000+guaranteed:
		return 1000 + guaranteed, true // above any Guaranteed container's own use
	case score == bestEffort:
		return bestEffort - 1, true // below any BestEffort one
	}
	return score, true
}

// OOMScoreFloor is the lowest oom_score_adj the node may give: without
// CAP_SYS_RESOURCE (a node in a container, or rootless) no process may
// go below the agent's own, and runc fails the container that asks to,
// so the score is raised to it, as containerd's restrict_oom_score_adj
// does.
var OOMScoreFloor = sync.OnceValue(func() int {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1000
	}
	for _, line := range strings.Split(string(status), "\n") {
		if hex, ok := strings.CutPrefix(line, "CapEff:"); ok {
			if caps, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64); err == nil && caps&(1<<unix.CAP_SYS_RESOURCE) != 0 {
				return -1000
			}
		}
	}
	own, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return -1000
	}
	score, err := strconv.Atoi(strings.TrimSpace(string(own)))
	if err != nil {
		return -1000
	}
	return score
})

func withOOMScoreAdj(score int) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Process == nil {
			s.Process = &specs.Process{}
		}
		s.Process.OOMScoreAdj = &score
		return nil
	}
}

// securityOpts apply the pod's and container's securityContext (the
// container's fields win): user and groups, runAsNonRoot, privileged,
// capabilities, readOnlyRootFilesystem, allowPrivilegeEscalation, sysctls.
func securityOpts(pod *corev1.Pod, c *corev1.Container) []oci.SpecOpts {
	var opts []oci.SpecOpts
	psc := pod.Spec.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	csc := c.SecurityContext
	if csc == nil {
		csc = &corev1.SecurityContext{}
	}
	uid, gid, nonRoot := psc.RunAsUser, psc.RunAsGroup, psc.RunAsNonRoot
	if csc.RunAsUser != nil {
		uid = csc.RunAsUser
	}
	if csc.RunAsGroup != nil {
		gid = csc.RunAsGroup
	}
	if csc.RunAsNonRoot != nil {
		nonRoot = csc.RunAsNonRoot
	}
	switch {
	case uid != nil && gid != nil:
		opts = append(opts, oci.WithUIDGID(uint32(*uid), uint32(*gid)))
	case uid != nil:
		opts = append(opts, oci.WithUserID(uint32(*uid)))
	case gid != nil:
		opts = append(opts, withGID(uint32(*gid)))
	}
	if groups := append(append([]int64{}, psc.SupplementalGroups...), fsGroupList(psc)...); len(groups) > 0 {
		opts = append(opts, func(ctx context.Context, client oci.Client, ctr *containers.Container, s *oci.Spec) error {
			for _, g := range groups {
				s.Process.User.AdditionalGids = append(s.Process.User.AdditionalGids, uint32(g))
			}
			return nil
		})
	}
	if ptrTrue(nonRoot) {
		opts = append(opts, func(ctx context.Context, client oci.Client, ctr *containers.Container, s *oci.Spec) error {
			if s.Process.User.UID == 0 {
				return &configError{reason: "CreateContainerConfigError", message: "container has runAsNonRoot and image will run as root"}
			}
			return nil
		})
	}
	if ptrTrue(csc.Privileged) {
		opts = append(opts, oci.WithPrivileged, oci.WithAllDevicesAllowed, oci.WithHostDevices, oci.WithWriteableSysfs, oci.WithWriteableCgroupfs,
			func(ctx context.Context, client oci.Client, ctr *containers.Container, s *oci.Spec) error {
				s.Linux.MaskedPaths, s.Linux.ReadonlyPaths = nil, nil
				return nil
			})
	} else if caps := csc.Capabilities; caps != nil {
		opts = append(opts, withCapabilities(caps))
	}
	if ptrTrue(csc.ReadOnlyRootFilesystem) {
		opts = append(opts, oci.WithRootFSReadonly())
	}
	// The kubelet's rule: no_new_privs only when allowPrivilegeEscalation
	// is false (and the container not privileged); containerd's default
	// spec sets it, so a setuid program would never elevate.
	if csc.AllowPrivilegeEscalation != nil && !*csc.AllowPrivilegeEscalation && !ptrTrue(csc.Privileged) {
		opts = append(opts, oci.WithNoNewPrivileges)
	} else {
		opts = append(opts, oci.WithNewPrivileges)
	}
	if len(psc.Sysctls) > 0 {
		opts = append(opts, func(ctx context.Context, client oci.Client, ctr *containers.Container, s *oci.Spec) error {
			if s.Linux.Sysctl == nil {
				s.Linux.Sysctl = map[string]string{}
			}
			for _, sc := range psc.Sysctls {
				s.Linux.Sysctl[sc.Name] = sc.Value
			}
			return nil
		})
	}
	return opts
}

func fsGroupList(psc *corev1.PodSecurityContext) []int64 {
	if psc.FSGroup == nil {
		return nil
	}
	return []int64{*psc.FSGroup}
}

// capName is Kubernetes' capability name ("NET_ADMIN", "ALL") as the
// runtime spells it ("CAP_NET_ADMIN").
func capName(c corev1.Capability) string {
	s := strings.ToUpper(string(c))
	if s == "ALL" || strings.HasPrefix(s, "CAP_") {
		return s
	}
	return "CAP_" + s
}

// withCapabilities drops, then adds, capabilities to the runtime's
// default set, as the CRI does; "ALL" drops or adds every one.
func withCapabilities(caps *corev1.Capabilities) oci.SpecOpts {
	return func(ctx context.Context, client oci.Client, ctr *containers.Container, s *oci.Spec) error {
		var add, drop []string
		for _, c := range caps.Drop {
			drop = append(drop, capName(c))
		}
		for _, c := range caps.Add {
			add = append(add, capName(c))
		}
		if slices.Contains(drop, "ALL") {
			if err := oci.WithCapabilities(nil)(ctx, client, ctr, s); err != nil {
				return err
			}
		} else if err := oci.WithDroppedCapabilities(drop)(ctx, client, ctr, s); err != nil {
			return err
		}
		if slices.Contains(add, "ALL") {
			return oci.WithAllKnownCapabilities(ctx, client, ctr, s)
		}
		return oci.WithAddedCapabilities(add)(ctx, client, ctr, s)
	}
}

func withGID(gid uint32) oci.SpecOpts {
	return func(ctx context.Context, client oci.Client, ctr *containers.Container, s *oci.Spec) error {
		s.Process.User.GID = gid
		return nil
	}
}

// expandSubPaths turns each volume mount's subPathExpr into its subPath
// with the container's environment, as a kubelet does: every variable it
// names must have a value, and the result must be a relative path that
// does not climb out of the volume.
func expandSubPaths(c *corev1.Container, lookup func(string) (string, bool)) (*corev1.Container, error) {
	if !slices.ContainsFunc(c.VolumeMounts, func(vm corev1.VolumeMount) bool { return vm.SubPathExpr != "" }) {
		return c, nil
	}
	out := c.DeepCopy()
	for i := range out.VolumeMounts {
		vm := &out.VolumeMounts[i]
		if vm.SubPathExpr == "" {
			continue
		}
		var missing []string
		sub := expand(vm.SubPathExpr, func(name string) (string, bool) {
			v, ok := lookup(name)
			if !ok || v == "" {
				missing = append(missing, name)
			}
			return v, true
		})
		fail := func(msg string) error {
			return &configError{reason: "CreateContainerConfigError", message: fmt.Sprintf("failed to prepare subPath for volumeMount %q of container %q: %s", vm.Name, c.Name, msg)}
		}
		switch {
		case len(missing) > 0:
			return nil, fail("missing value for " + strings.Join(missing, ", "))
		case filepath.IsAbs(sub):
			return nil, fail(fmt.Sprintf("subPath %q must not be an absolute path", sub))
		case slices.Contains(strings.Split(filepath.ToSlash(sub), "/"), ".."):
			return nil, fail(fmt.Sprintf("subPath %q must not contain '..'", sub))
		}
		vm.SubPath, vm.SubPathExpr = sub, ""
	}
	return out, nil
}
