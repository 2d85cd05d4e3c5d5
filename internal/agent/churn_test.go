package agent_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/snapshots"
	"github.com/orch-dev/orch/internal/agent/agenttest"
	orchctr "github.com/orch-dev/orch/internal/agent/containerd"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// churn creates and deletes cycles pods, batch at a time, each Running
// before its batch is deleted, and returns what the node has left over
// that it did not have before: containers, active snapshots, network
// namespaces, pod directories, addresses, CNI results, mounts, iptables
// rules, goroutines.
func churn(tb testing.TB, n *node, cycles, batch int) map[string]int {
	tb.Helper()
	before := n.leftovers(tb)
	pods := n.Client.CoreV1().Pods("default")
	for done := 0; done < cycles; done += batch {
		for i := range batch {
			n.create(tb, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("churn-%d-%d", done, i)},
				Spec: corev1.PodSpec{TerminationGracePeriodSeconds: agenttest.PtrTo[int64](0), Containers: []corev1.Container{agenttest.Busybox("main", "sleep 3600")}}})
		}
		n.Eventually("the batch Running", 2*time.Minute, podsRunning(pods, batch))
		if err := pods.DeleteCollection(n.Ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			tb.Fatal(err)
		}
		n.Eventually("the batch gone from the node", 2*time.Minute, func(ctx context.Context) (bool, error) {
			l, err := pods.List(ctx, metav1.ListOptions{})
			left, _ := os.ReadDir(filepath.Join(n.dir, "agent", "pods"))
			return err == nil && len(l.Items) == 0 && len(left) == 0, nil
		})
	}
	// Looked at until nothing grew, for 20 s at most: goroutines of the
	// last stops wind down, and the host's iptables are shared with the
	// tests of other packages, which go test runs at the same time. A
	// leak stays.
	var grown map[string]int
	for range 20 {
		time.Sleep(time.Second)
		after := n.leftovers(tb)
		grown = map[string]int{}
		for k, v := range after {
			if v > before[k] {
				grown[k] = v - before[k]
			}
		}
		if len(grown) == 0 || len(grown) == 1 && grown["goroutines"] > 0 && grown["goroutines"] < 50 {
			break
		}
	}
	return grown
}

// leftovers counts what pods leave on a node if not cleaned up.
func (n *node) leftovers(tb testing.TB) map[string]int {
	tb.Helper()
	out := map[string]int{}
	ctr, err := containerd.New(filepath.Join(n.dir, "agent", "containerd", "containerd.sock"))
	if err != nil {
		tb.Fatal(err)
	}
	defer func() { _ = ctr.Close() }()
	ctx := namespaces.WithNamespace(context.Background(), orchctr.Namespace)
	containers, err := ctr.Containers(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	out["containers"] = len(containers)
	err = ctr.SnapshotService(containerd.DefaultSnapshotter).Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		if info.Kind == snapshots.KindActive {
			out["active snapshots"]++
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	count := func(dir string) int {
		entries, _ := os.ReadDir(dir)
		return len(entries)
	}
	out["network namespaces"] = count(filepath.Join(n.dir, "agent", "run", "netns"))
	out["pod directories"] = count(filepath.Join(n.dir, "agent", "pods"))
	out["pod runtime directories"] = count(filepath.Join(n.dir, "agent", "run", "pods"))
	out["CNI results"] = count(filepath.Join(n.dir, "agent", "run", "cni", "cache", "results"))
	ipam, _ := os.ReadDir(filepath.Join(n.dir, "agent", "run", "cni", "ipam", "orch"))
	for _, e := range ipam {
		if !strings.HasPrefix(e.Name(), "last_reserved_ip") && e.Name() != "lock" {
			out["reserved addresses"]++
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	out["mounts"] = strings.Count(string(mounts), n.dir)
	// Rules a pod could leave: the CNI plugins' per-pod chains and rules
	// naming pod addresses. Other tests running beside this one may change
	// the host's other rules (Services, their own chains).
	rules, _ := exec.Command("iptables-save").Output()
	for _, line := range strings.Split(string(rules), "\n") {
		if strings.HasPrefix(line, "-A ") && (strings.Contains(line, "CNI-") || strings.Contains(line, " 10.42.")) {
			out["pod iptables rules"]++
		}
	}
	out["goroutines"] = runtime.NumGoroutine()
	return out
}

// TestPodChurnLeavesNothing: pods created and deleted again and again
// leave nothing behind on the node (1,000 cycles with ORCH_CHURN_CYCLES=1000).
func TestPodChurnLeavesNothing(t *testing.T) {
	cycles := 100
	if v, err := strconv.Atoi(os.Getenv("ORCH_CHURN_CYCLES")); err == nil {
		cycles = v
	}
	n := startNode(t, "churn")
	start := time.Now()
	grown := churn(t, n, cycles, 20)
	t.Logf("%d pods created and deleted in %s", cycles, time.Since(start).Round(time.Second))
	// A few goroutines come and go with HTTP connections and watches (15
	// to 20 here, more on a busy machine); a leak per pod would be
	// hundreds.
	if grown["goroutines"] < 50 {
		delete(grown, "goroutines")
	}
	if len(grown) > 0 {
		t.Errorf("after %d pods the node has more than before: %v", cycles, grown)
	}
}
