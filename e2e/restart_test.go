//go:build e2e

package e2e_test

import (
	"context"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/orch-dev/orch/internal/agent/agenttest"
)

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
	dir := agenttest.NodeDataDir(t)
	bin := agenttest.BuildOrch(t)
	// Its node is this machine: once orch has stopped (cleanups run last
	// first), the uninstall's cleanup leaves no rules, bridge or tunnel.
	t.Cleanup(func() {
		if out, err := exec.Command(bin, "agent", "--cleanup").CombinedOutput(); err != nil {
			t.Errorf("orch agent --cleanup: %v\n%s", err, out)
		}
	})
	port, kubeletPort := agenttest.FreePort(t), agenttest.FreePort(t)
	kubeconfig := filepath.Join(dir, "admin.yaml")
	server := func() *exec.Cmd {
		cmd := exec.Command(bin, "server", "--data-dir", dir, "--runtime-dir", filepath.Join(dir, "run"), "--node-name", "solo", "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
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
	client := agenttest.WaitServer(t, kubeconfig)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	names := []string{"p1", "p2", "p3", "p4", "p5"}
	uids := agenttest.RunningPods(ctx, t, client, names...)
	before := agenttest.TaskPids(ctx, t, dir, uids)
	ctrBefore := agenttest.ContainerdPids(dir)

	if err := srv.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = srv.Wait()
	if pids := agenttest.ContainerdPids(dir); len(pids) != 1 || pids[0] != ctrBefore[0] {
		t.Fatalf("after kill -9 of orch its containerd is %v, was %v", pids, ctrBefore)
	}

	start := time.Now()
	server()
	agenttest.Eventually(t, "the node Ready again", func() bool {
		node, err := client.CoreV1().Nodes().Get(ctx, "solo", metav1.GetOptions{})
		if err != nil || !agenttest.NodeReadySince(node, start) {
			return false
		}
		lease, err := client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, "solo", metav1.GetOptions{})
		return err == nil && lease.Spec.RenewTime != nil && lease.Spec.RenewTime.After(start)
	})
	t.Logf("node Ready %v after the restart", time.Since(start).Round(100*time.Millisecond))
	if pids := agenttest.ContainerdPids(dir); len(pids) != 1 || pids[0] == ctrBefore[0] {
		t.Errorf("containerd after the restart: %v (the old one was %d)", pids, ctrBefore[0])
	}
	agenttest.Eventually(t, "the pods Running, not restarted", func() bool {
		for _, c := range agenttest.RestartCounts(ctx, client, names...) {
			if c != 0 {
				return false
			}
		}
		return true
	})
	if after := agenttest.TaskPids(ctx, t, dir, uids); !maps.Equal(after, before) {
		t.Errorf("containers after the restart %v, were %v", after, before)
	}
	if err := client.CoreV1().Pods("default").DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: agenttest.PtrTo[int64](0)}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	agenttest.Eventually(t, "the pods gone from the node", func() bool {
		left, _ := os.ReadDir(filepath.Join(dir, "agent", "pods"))
		return len(left) == 0
	})
}
