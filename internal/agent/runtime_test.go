package agent_test

import (
	"syscall"
	"testing"

	"github.com/orch-dev/orch/internal/agent/agenttest"
)

// TestContainerdCrashRestartsNothing: containerd is killed under running
// pods and restarted by the agent; the containers ran on in their shims,
// so none is restarted (before, every lost wait was taken for an exit
// with code 255 and every container restarted), and a container that
// really exits afterwards is still seen to.
func TestContainerdCrashRestartsNothing(t *testing.T) {
	n := startNode(t, "crash-node")
	names := []string{"a", "b", "c"}
	uids := agenttest.RunningPods(n.Ctx, t, n.Client, names...)
	before := agenttest.TaskPids(n.Ctx, t, n.dir, uids)
	old := agenttest.ContainerdPids(n.dir)
	if len(old) != 1 {
		t.Fatalf("containerd processes: %v", old)
	}
	if err := syscall.Kill(old[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	agenttest.Eventually(t, "a new containerd serving", func() bool {
		pids := agenttest.ContainerdPids(n.dir)
		return len(pids) == 1 && pids[0] != old[0] && len(agenttest.TaskPidsOrNil(n.Ctx, n.dir, uids)) == len(uids)
	})
	// A real exit after the restart is still seen: the agent waits on the
	// task again.
	if err := syscall.Kill(int(before["c"]), syscall.SIGKILL); err != nil {
		t.Fatalf("c's container (pid %d) did not outlive containerd's restart: %v", before["c"], err)
	}
	agenttest.Eventually(t, "c restarted after its own exit", func() bool {
		return agenttest.RestartCounts(n.Ctx, n.Client, "c")["c"] == 1
	})
	if got := agenttest.RestartCounts(n.Ctx, n.Client, "a", "b"); got["a"] != 0 || got["b"] != 0 {
		t.Errorf("restarts after containerd's crash: %v, want none", got)
	}
	after := agenttest.TaskPids(n.Ctx, t, n.dir, map[string]string{"a": uids["a"], "b": uids["b"]})
	if after["a"] != before["a"] || after["b"] != before["b"] {
		t.Errorf("containers replaced after containerd's crash: %v, were %v", after, before)
	}
}
