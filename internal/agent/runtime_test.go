package agent_test

import (
	"context"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
	orchctr "github.com/orch-dev/orch/internal/agent/containerd"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// containerdPids are the containerd processes an agent with data dir dir
// runs (one, when all is well).
func containerdPids(dir string) []int {
	out, _ := exec.Command("pgrep", "-f", "containerd --config "+filepath.Join(dir, "agent", "containerd", "config.toml")+"$").Output()
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// taskPids are the pods' main processes by pod name, read from
// containerd.
func taskPids(ctx context.Context, t *testing.T, dir string, pods map[string]string) map[string]uint32 {
	t.Helper()
	ctr := containerdClient(t, dir)
	nsCtx := namespaces.WithNamespace(ctx, orchctr.Namespace)
	out := map[string]uint32{}
	for name, uid := range pods {
		task, err := loadTask(nsCtx, ctr, uid+"-main")
		if err != nil {
			t.Fatalf("pod %s's task: %v", name, err)
		}
		out[name] = task.Pid()
	}
	return out
}

// runningPods creates sleepers and returns their UIDs by name once Running.
func runningPods(ctx context.Context, t *testing.T, client kubernetes.Interface, names ...string) map[string]string {
	t.Helper()
	for _, name := range names {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{TerminationGracePeriodSeconds: ptrTo[int64](0),
			Containers: []corev1.Container{busybox("main", "sleep 3600")}}}
		if _, err := client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	uids := map[string]string{}
	eventually(t, "the pods Running", func() bool {
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

// restartCounts are the pods' containers' restarts, by pod name.
func restartCounts(ctx context.Context, client kubernetes.Interface, names ...string) map[string]int32 {
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

// TestContainerdCrashRestartsNothing: containerd is killed under running
// pods and restarted by the agent; the containers ran on in their shims,
// so none is restarted (before, every lost wait was taken for an exit
// with code 255 and every container restarted), and a container that
// really exits afterwards is still seen to.
func TestContainerdCrashRestartsNothing(t *testing.T) {
	n := startNode(t, "crash-node")
	names := []string{"a", "b", "c"}
	uids := runningPods(n.Ctx, t, n.Client, names...)
	before := taskPids(n.Ctx, t, n.dir, uids)
	old := containerdPids(n.dir)
	if len(old) != 1 {
		t.Fatalf("containerd processes: %v", old)
	}
	if err := syscall.Kill(old[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a new containerd serving", func() bool {
		pids := containerdPids(n.dir)
		return len(pids) == 1 && pids[0] != old[0] && len(taskPidsOrNil(n.Ctx, n.dir, uids)) == len(uids)
	})
	// A real exit after the restart is still seen: the agent waits on the
	// task again.
	if err := syscall.Kill(int(before["c"]), syscall.SIGKILL); err != nil {
		t.Fatalf("c's container (pid %d) did not outlive containerd's restart: %v", before["c"], err)
	}
	eventually(t, "c restarted after its own exit", func() bool {
		return restartCounts(n.Ctx, n.Client, "c")["c"] == 1
	})
	if got := restartCounts(n.Ctx, n.Client, "a", "b"); got["a"] != 0 || got["b"] != 0 {
		t.Errorf("restarts after containerd's crash: %v, want none", got)
	}
	after := taskPids(n.Ctx, t, n.dir, map[string]string{"a": uids["a"], "b": uids["b"]})
	if after["a"] != before["a"] || after["b"] != before["b"] {
		t.Errorf("containers replaced after containerd's crash: %v, were %v", after, before)
	}
}

// taskPidsOrNil is taskPids that fails quietly while containerd is down.
func taskPidsOrNil(ctx context.Context, dir string, pods map[string]string) map[string]uint32 {
	out := map[string]uint32{}
	ctr, err := containerd.New(filepath.Join(dir, "agent", "containerd", "containerd.sock"), containerd.WithTimeout(time.Second))
	if err != nil {
		return nil
	}
	defer func() { _ = ctr.Close() }()
	nsCtx := namespaces.WithNamespace(ctx, orchctr.Namespace)
	for name, uid := range pods {
		task, err := loadTask(nsCtx, ctr, uid+"-main")
		if err != nil {
			return nil
		}
		out[name] = task.Pid()
	}
	return out
}

// TestKilledOrchTakesBackItsContainerd: orch server (with its own node) is
// killed with -9 while 5 pods run; its containerd outlives it, holding
// its root's lock. Started again, orch stops that containerd, runs its
// own, and adopts the pods: the node is Ready within a minute and no pod
// was restarted (before, the node stayed NotReady until an operator
// killed containerd by hand).
func TestKilledOrchTakesBackItsContainerd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs orch")
	}
	dir := nodeDataDir(t)
	bin := buildOrch(t)
	port, kubeletPort := freePort(t), freePort(t)
	kubeconfig := filepath.Join(dir, "admin.yaml")
	server := func() *exec.Cmd {
		cmd := exec.Command(bin, "server", "--data-dir", dir, "--node-name", "solo", "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
			"--node-ip", "127.0.0.1", "--https-listen-port", strconv.Itoa(port), "--kubelet-port", strconv.Itoa(kubeletPort), "--write-kubeconfig", kubeconfig)
		logPath := filepath.Join(t.TempDir(), "orch.log")
		logFile, err := os.Create(logPath)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if t.Failed() {
				out, _ := exec.Command("tail", "-n", "40", logPath).Output()
				t.Logf("orch server's log ends:\n%s", out)
			}
		})
		cmd.Stdout, cmd.Stderr = logFile, logFile
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
			_ = logFile.Close()
		})
		return cmd
	}
	srv := server()
	client := waitServer(t, kubeconfig)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	names := []string{"p1", "p2", "p3", "p4", "p5"}
	uids := runningPods(ctx, t, client, names...)
	before := taskPids(ctx, t, dir, uids)
	ctrBefore := containerdPids(dir)

	if err := srv.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = srv.Wait()
	if pids := containerdPids(dir); len(pids) != 1 || pids[0] != ctrBefore[0] {
		t.Fatalf("after kill -9 of orch its containerd is %v, was %v", pids, ctrBefore)
	}

	start := time.Now()
	server()
	eventually(t, "the node Ready again", func() bool {
		node, err := client.CoreV1().Nodes().Get(ctx, "solo", metav1.GetOptions{})
		if err != nil || !nodeReadySince(node, start) {
			return false
		}
		lease, err := client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, "solo", metav1.GetOptions{})
		return err == nil && lease.Spec.RenewTime != nil && lease.Spec.RenewTime.After(start)
	})
	t.Logf("node Ready %v after the restart", time.Since(start).Round(100*time.Millisecond))
	if pids := containerdPids(dir); len(pids) != 1 || pids[0] == ctrBefore[0] {
		t.Errorf("containerd after the restart: %v (the old one was %d)", pids, ctrBefore[0])
	}
	eventually(t, "the pods Running, not restarted", func() bool {
		for _, c := range restartCounts(ctx, client, names...) {
			if c != 0 {
				return false
			}
		}
		return true
	})
	if after := taskPids(ctx, t, dir, uids); !maps.Equal(after, before) {
		t.Errorf("containers after the restart %v, were %v", after, before)
	}
	if err := client.CoreV1().Pods("default").DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptrTo[int64](0)}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the pods gone from the node", func() bool {
		left, _ := os.ReadDir(filepath.Join(dir, "agent", "pods"))
		return len(left) == 0
	})
}

// nodeReadySince reports whether the node said Ready in t's second or
// after (a heartbeat's time has whole seconds).
func nodeReadySince(node *corev1.Node, t time.Time) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue && !c.LastHeartbeatTime.Time.Before(t.Truncate(time.Second))
		}
	}
	return false
}
