package pods

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/identifiers"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/orch-dev/orch/internal/agent/podnet"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/uuid"
)

// TestExpandSubPaths: subPathExpr becomes the subPath with the container's
// variables, as a kubelet expands it; a missing or empty variable, an
// absolute result or one climbing out with '..' is a
// CreateContainerConfigError naming the mount.
func TestExpandSubPaths(t *testing.T) {
	env := map[string]string{"POD_NAME": "web-0", "UP": "..", "ABS": "/etc", "EMPTY": "", "ANNOTATION": "mypath"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	for _, tc := range []struct {
		expr, want, fails string
	}{
		{"$(POD_NAME)", "web-0", ""},
		{"$(ANNOTATION)/$(POD_NAME)", "mypath/web-0", ""},
		{"logs/$$(POD_NAME)", "logs/$(POD_NAME)", ""},
		{"$(UP)", "", "must not contain '..'"},
		{"$(ABS)", "", "must not be an absolute path"},
		{"$(NOPE)/x", "", "missing value for NOPE"},
		{"$(EMPTY)", "", "missing value for EMPTY"},
	} {
		c := &corev1.Container{Name: "app", VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/d", SubPathExpr: tc.expr}, {Name: "plain", MountPath: "/p", SubPath: "keep"}}}
		got, err := expandSubPaths(c, lookup)
		if tc.fails != "" {
			var ce *configError
			if !errors.As(err, &ce) || ce.reason != "CreateContainerConfigError" || !strings.Contains(ce.message, tc.fails) || !strings.Contains(ce.message, `"data"`) {
				t.Errorf("%s: %v, want a config error saying %q", tc.expr, err, tc.fails)
			}
			continue
		}
		if err != nil || got.VolumeMounts[0].SubPath != tc.want || got.VolumeMounts[0].SubPathExpr != "" || got.VolumeMounts[1].SubPath != "keep" {
			t.Errorf("%s: %+v %v, want subPath %q", tc.expr, got.VolumeMounts, err, tc.want)
		}
		if c.VolumeMounts[0].SubPathExpr != tc.expr {
			t.Errorf("%s: the pod's own container was changed", tc.expr)
		}
	}
}

// TestContainerIDFitsContainerd: a container's id stays within containerd's
// 76 characters for names up to Kubernetes' 63, the same for the same
// name and different for names alike in their first characters.
func TestContainerIDFitsContainerd(t *testing.T) {
	pod := &corev1.Pod{}
	pod.UID = "08f8b2f4-a68e-4871-b428-d16e4b99a0b3"
	short := containerID(pod, "main")
	if short != string(pod.UID)+"-main" {
		t.Fatalf("a short name's id: %s", short)
	}
	a, b := strings.Repeat("a", 62)+"1", strings.Repeat("a", 62)+"2"
	ida, idb := containerID(pod, a), containerID(pod, b)
	if len(ida) > 76 || len(idb) > 76 || ida == idb || ida != containerID(pod, a) || !strings.HasPrefix(ida, string(pod.UID)+"-aaa") {
		t.Fatalf("long names' ids: %s (%d), %s (%d)", ida, len(ida), idb, len(idb))
	}
	// Cut just after a hyphen (a name of Kubernetes' conformance suite):
	// containerd refuses two separators in a row.
	pod.UID = "cdb973ab-3b15-40a6-a4ba-9929325fa1f2"
	for _, name := range []string{"filler-pod-45b4f543-63e0-4d6e-b599-21e9eb3df8e3", a, "x" + strings.Repeat("-y", 31)} {
		if err := identifiers.Validate(containerID(pod, name)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestPortsClash: one host port of one protocol, on the same address or
// on all of them on either side, as the scheduler's NodePorts rule reads.
func TestPortsClash(t *testing.T) {
	pm := func(ip, proto string, port int32) podnet.PortMapping {
		return podnet.PortMapping{HostIP: ip, Protocol: proto, HostPort: port}
	}
	for _, tc := range []struct {
		a, b  podnet.PortMapping
		clash bool
	}{
		{pm("", "TCP", 80), pm("", "TCP", 80), true},
		{pm("", "TCP", 80), pm("10.0.0.1", "TCP", 80), true},
		{pm("10.0.0.1", "TCP", 80), pm("10.0.0.2", "TCP", 80), false},
		{pm("", "TCP", 80), pm("", "UDP", 80), false},
		{pm("0.0.0.0", "TCP", 80), pm("", "TCP", 81), false},
	} {
		if portsClash(tc.a, tc.b) != tc.clash || portsClash(tc.b, tc.a) != tc.clash {
			t.Errorf("%+v and %+v: clash %v", tc.a, tc.b, !tc.clash)
		}
	}
}

// TestOOMScoreAdj: the kubelet's scores, by QoS class and, for Burstable
// containers, by the share of the node's memory they request.
func TestOOMScoreAdj(t *testing.T) {
	const gi = int64(1) << 30
	burstable := func(request string) *corev1.Container {
		return &corev1.Container{Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(request)}}}
	}
	for _, tc := range []struct {
		name     string
		qos      corev1.PodQOSClass
		priority string
		c        *corev1.Container
		capacity int64
		want     int
		ok       bool
	}{
		{"guaranteed", corev1.PodQOSGuaranteed, "", &corev1.Container{}, 4 * gi, -997, true},
		{"best effort", corev1.PodQOSBestEffort, "", &corev1.Container{}, 4 * gi, 1000, true},
		{"node critical", corev1.PodQOSBestEffort, "system-node-critical", &corev1.Container{}, 4 * gi, -997, true},
		{"a tenth of the node", corev1.PodQOSBurstable, "", burstable("400Mi"), 4000 << 20, 900, true},
		{"more than the node", corev1.PodQOSBurstable, "", burstable("8Gi"), 4 * gi, 3, true},
		{"nothing requested", corev1.PodQOSBurstable, "", &corev1.Container{}, 4 * gi, 999, true},
		{"the node's memory unknown", corev1.PodQOSBurstable, "", burstable("1Gi"), 0, 0, false},
	} {
		pod := &corev1.Pod{Spec: corev1.PodSpec{PriorityClassName: tc.priority}, Status: corev1.PodStatus{QOSClass: tc.qos}}
		if got, ok := oomScoreAdj(pod, tc.c, tc.capacity); got != tc.want || ok != tc.ok {
			t.Errorf("%s: %d %v, want %d %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

// TestPrivilegedCgroupsStayItsOwn: a privileged container's /sys/fs/cgroup
// is writable, and every other container's stays read only after it (the
// mount's options were once shared, and containerd rewrites them in place).
func TestPrivilegedCgroupsStayItsOwn(t *testing.T) {
	ctx := namespaces.WithNamespace(context.Background(), "test")
	cgroupOptions := func(privileged bool) []string {
		c := &corev1.Container{Name: "main", SecurityContext: &corev1.SecurityContext{Privileged: &privileged}}
		pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{*c}}}
		opts := append([]oci.SpecOpts{oci.WithMounts([]specs.Mount{cgroupMount()})}, securityOpts(pod, c)...)
		s, err := oci.GenerateSpecWithPlatform(ctx, nil, "linux/amd64", &containers.Container{ID: "c"}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range s.Mounts {
			if m.Destination == "/sys/fs/cgroup" {
				return m.Options
			}
		}
		t.Fatal("no /sys/fs/cgroup mount")
		return nil
	}
	if got := cgroupOptions(true); !slices.Contains(got, "rw") || slices.Contains(got, "ro") {
		t.Errorf("privileged: /sys/fs/cgroup %v, want rw", got)
	}
	if got := cgroupOptions(false); !slices.Contains(got, "ro") {
		t.Errorf("unprivileged after a privileged one: /sys/fs/cgroup %v, want ro", got)
	}
}

// TestShimGroupOf: a pod's containers always get the same shim, and pods
// spread evenly over shimGroups of them.
func TestShimGroupOf(t *testing.T) {
	const pods = 400
	count := map[string]int{}
	for range pods {
		uid := uuid.NewUUID()
		group := shimGroupOf(uid)
		if again := shimGroupOf(uid); again != group {
			t.Fatalf("pod %s: shim %q, then %q", uid, group, again)
		}
		count[group]++
	}
	if len(count) != shimGroups {
		t.Fatalf("%d pods in %d shims %v, want %d", pods, len(count), count, shimGroups)
	}
	for group, n := range count {
		if even := pods / shimGroups; n < even/2 || n > even*3/2 {
			t.Errorf("shim %s runs %d of %d pods, want about %d", group, n, pods, even)
		}
	}
}
