// Package agenttest runs real nodes for tests: an agent data dir with the
// busybox test image, an agent in-process or orch built and run as a
// process, and reads of what containerd runs. The agent's tests and the
// end-to-end tests (e2e/) share it. Running containers needs root: the
// helpers skip the test without it.
package agenttest

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	orchctr "github.com/orch-dev/orch/internal/agent/containerd"
	"github.com/orch-dev/orch/internal/roottest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
	"github.com/orch-dev/orch/internal/agent"
	"github.com/orch-dev/orch/internal/agent/testimage"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// NodeDataDir skips the test unless this machine can run containers, and
// returns an agent data dir whose images directory holds the Busybox
// test image.
func NodeDataDir(t testing.TB) string {
	t.Helper()
	roottest.Require(t, "running containers")
	for _, bin := range []string{"containerd", "runc", "/usr/lib/cni/bridge"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not installed", bin)
		}
	}
	dir := t.TempDir()
	t.Cleanup(func() { ReapNode(dir) }) // before TempDir's removal
	WriteBusyboxImage(t, dir)
	return dir
}

// WriteBusyboxImage puts the busybox test image (busybox:test) where the
// agent of data dir imports images from.
func WriteBusyboxImage(t testing.TB, dir string) {
	t.Helper()
	images := filepath.Join(dir, "agent", "images")
	if err := os.MkdirAll(images, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := testimage.WriteBusybox(filepath.Join(images, "busybox.tar"), "docker.io/library/busybox:test", "sh"); err != nil {
		t.Fatal(err)
	}
}

// ReapNode kills what a node kept in dir leaves running and unmounts what
// it mounted there, so that a test that failed half-way leaves no shims,
// containers or mounts behind; after a test that passed there is nothing.
func ReapNode(dir string) {
	out, _ := exec.Command("pgrep", "-f", dir).Output() // containerd and the shims name dir
	for _, f := range strings.Fields(string(out)) {
		children, _ := exec.Command("pgrep", "-P", f).Output() // the containers' first processes
		for _, pid := range append(strings.Fields(string(children)), f) {
			if p, err := strconv.Atoi(pid); err == nil {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
		}
	}
	UnmountUnder(dir)
}

// UnmountUnder unmounts everything mounted under dir, the innermost first.
func UnmountUnder(dir string) {
	mountinfo, _ := os.ReadFile("/proc/self/mountinfo")
	var mounts []string
	for _, line := range strings.Split(string(mountinfo), "\n") {
		if fields := strings.Fields(line); len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			mounts = append(mounts, fields[4])
		}
	}
	slices.SortFunc(mounts, func(a, b string) int { return len(b) - len(a) }) // the innermost first
	for _, m := range mounts {
		_ = syscall.Unmount(m, syscall.MNT_DETACH)
	}
}

// RunAgent runs an agent for node name against server, keeping its state
// in dir, until the returned stop is called.
func RunAgent(t testing.TB, server, token, dir, name string, options ...func(*agent.Config)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	cfg := agent.Config{Server: server, Token: token, DataDir: dir, NodeName: name,
		NodeIPs: []string{"127.0.0.1"}, LeaseEvery: time.Second, ClusterDNS: "10.43.0.10", Version: "v0.0.0-test", Logger: Quiet}
	for _, o := range options {
		o(&cfg)
	}
	go func() { done <- agent.Run(ctx, cfg) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	}
}

// BuildOrch builds the orch binary into the test's temporary directory.
func BuildOrch(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "orch")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/orch-dev/orch").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// FreePort is a loopback TCP port free at the time of asking.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().(*net.TCPAddr).Port
}

// WaitServer waits for a server process to write its admin kubeconfig
// and answer, and returns a client of it.
func WaitServer(t testing.TB, kubeconfig string) kubernetes.Interface {
	t.Helper()
	var client kubernetes.Interface
	Eventually(t, "the server answering", func() bool {
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return false
		}
		if client, err = kubernetes.NewForConfig(cfg); err != nil {
			return false
		}
		_, err = client.Discovery().ServerVersion()
		return err == nil
	})
	return client
}

// Eventually waits up to a minute for cond.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	EventuallyWithin(t, what, time.Minute, cond)
}

// EventuallyWithin is Eventually with its own timeout.
func EventuallyWithin(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// ContainerdClient connects to the containerd an agent with data dir
// dir runs, until the test ends.
func ContainerdClient(t testing.TB, dir string) *containerd.Client {
	t.Helper()
	ctr, err := containerd.New(filepath.Join(dir, "agent", "containerd", "containerd.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ctr.Close() })
	return ctr
}

// TaskRunning says whether the container with that ID runs.
func TaskRunning(ctx context.Context, ctr *containerd.Client, id string) bool {
	nsCtx := namespaces.WithNamespace(ctx, orchctr.Namespace)
	task, err := LoadTask(nsCtx, ctr, id)
	if err != nil {
		return false
	}
	st, err := task.Status(nsCtx)
	return err == nil && st.Status == containerd.Running
}

// ContainerdPids are the containerd processes an agent with data dir dir
// runs (one, when all is well).
func ContainerdPids(dir string) []int {
	out, _ := exec.Command("pgrep", "-f", "containerd --config "+filepath.Join(dir, "agent", "containerd", "config.toml")+"$").Output()
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TaskPids are the pods' main processes by pod name, read from
// containerd.
func TaskPids(ctx context.Context, t *testing.T, dir string, pods map[string]string) map[string]uint32 {
	t.Helper()
	ctr := ContainerdClient(t, dir)
	nsCtx := namespaces.WithNamespace(ctx, orchctr.Namespace)
	out := map[string]uint32{}
	for name, uid := range pods {
		task, err := LoadTask(nsCtx, ctr, uid+"-main")
		if err != nil {
			t.Fatalf("pod %s's task: %v", name, err)
		}
		out[name] = task.Pid()
	}
	return out
}

// TaskPidsOrNil is TaskPids that fails quietly while containerd is down.
func TaskPidsOrNil(ctx context.Context, dir string, pods map[string]string) map[string]uint32 {
	out := map[string]uint32{}
	ctr, err := containerd.New(filepath.Join(dir, "agent", "containerd", "containerd.sock"), containerd.WithTimeout(time.Second))
	if err != nil {
		return nil
	}
	defer func() { _ = ctr.Close() }()
	nsCtx := namespaces.WithNamespace(ctx, orchctr.Namespace)
	for name, uid := range pods {
		task, err := LoadTask(nsCtx, ctr, uid+"-main")
		if err != nil {
			return nil
		}
		out[name] = task.Pid()
	}
	return out
}

// RunningPods creates sleepers and returns their UIDs by name once Running.
func RunningPods(ctx context.Context, t *testing.T, client kubernetes.Interface, names ...string) map[string]string {
	t.Helper()
	for _, name := range names {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{TerminationGracePeriodSeconds: PtrTo[int64](0),
			Containers: []corev1.Container{Busybox("main", "sleep 3600")}}}
		if _, err := client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	uids := map[string]string{}
	Eventually(t, "the pods Running", func() bool {
		for _, name := range names {
			p, err := client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil || p.Status.Phase != corev1.PodRunning {
				return false
			}
			uids[name] = string(p.UID)
		}
		return true
	})
	return uids
}

// RestartCounts are the pods' containers' restarts, by pod name.
func RestartCounts(ctx context.Context, client kubernetes.Interface, names ...string) map[string]int32 {
	out := map[string]int32{}
	for _, name := range names {
		p, err := client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].State.Running == nil {
			out[name] = -1
			continue
		}
		out[name] = p.Status.ContainerStatuses[0].RestartCount
	}
	return out
}

// ReadyPods are the Ready, Running pods, by UID, with their first
// container's ID and restart count.
func ReadyPods(ctx context.Context, client kubernetes.Interface) map[string]string {
	pods, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil
	}
	out := map[string]string{}
	for _, p := range pods.Items {
		ready := false
		for _, c := range p.Status.Conditions {
			ready = ready || c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
		}
		if ready && p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == 1 {
			cs := p.Status.ContainerStatuses[0]
			out[string(p.UID)] = cs.ContainerID + " restarts " + strconv.Itoa(int(cs.RestartCount))
		}
	}
	return out
}

// NodeReady reports whether the node says Ready.
func NodeReady(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// NodeReadySince reports whether the node said Ready in t's second or
// after (a heartbeat's time has whole seconds).
func NodeReadySince(node *corev1.Node, t time.Time) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue && !c.LastHeartbeatTime.Time.Before(t.Truncate(time.Second))
		}
	}
	return false
}

// LoadTask is the task of the container with that ID.
func LoadTask(ctx context.Context, c *containerd.Client, id string) (containerd.Task, error) {
	container, err := c.LoadContainer(ctx, id)
	if err != nil {
		return nil, err
	}
	return container.Task(ctx, nil)
}

// PtrTo points at a copy of v.
func PtrTo[T any](v T) *T { return &v }

// Busybox is a container running script in the busybox test image.
func Busybox(name, script string) corev1.Container {
	return corev1.Container{Name: name, Image: "busybox:test", Command: []string{"sh", "-c", script}}
}

// Quiet is a logger that drops everything.
var Quiet = slog.New(slog.NewTextHandler(io.Discard, nil))
