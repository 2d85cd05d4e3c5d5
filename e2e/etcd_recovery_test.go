//go:build e2e

package e2e_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/orch-dev/orch/internal/agent/agenttest"
)

// TestEmbeddedEtcdRecovery drives three servers with their own etcd
// through what boards meet, as an operator would see it:
//   - the etcd leader's server paused past the election timeout (a board
//     stalled on its SD card) serves no stale read once it runs again;
//   - a server cut off from the others' etcd by iptables (on a machine of
//     its own: a network namespace) acknowledges no write and is not
//     ready, while the two others go on; healed, it catches up;
//   - two servers killed: the last acknowledges no write; stopped, then
//     `orch server --cluster-reset` makes its member a cluster of one with
//     everything it had, and it serves again;
//   - `orch snapshot save` taken while it served restores with
//     `--cluster-reset --cluster-reset-restore-path`: the snapshot's
//     objects and not the later ones; `orch snapshot save` works with the
//     server stopped too;
//   - a lost server rejoins the restored one once its old member's data
//     is moved away, and serves the restored state;
//   - a snapshot restores on a new machine with the server token alone.
func TestEmbeddedEtcdRecovery(t *testing.T) {
	c := newCluster(t) // the bridge and the first address; its own server is not used
	_ = c.serverCmd.Process.Kill()
	_ = c.serverCmd.Wait()
	addrs := []string{c.server, "198.18.0.2", "198.18.0.3"}
	run(t, "ip", "addr", "add", addrs[1]+"/24", "dev", c.bridge)
	apart := c.netns("rec-server3", addrs[2])
	port := agenttest.FreePort(t)
	first := startHAServer(t, c.bin, addrs[0], port, []string{"--cluster-init", "--token", "e2e-recovery-agents-0123456789"})
	raw, err := os.ReadFile(filepath.Join(first.dir, "server", "server-token"))
	if err != nil {
		t.Fatal(err)
	}
	serverToken := strings.TrimSpace(string(raw))
	join := []string{"--server", first.url, "--token", serverToken}
	second := startHAServer(t, c.bin, addrs[1], port, join)
	third := startHAServerIn(t, apart, c.bin, addrs[2], port, join)
	servers := []*haServer{first, second, third}
	members := etcdClient(t, first, etcdEndpoint(addrs[0]), etcdEndpoint(addrs[1]))
	agenttest.EventuallyWithin(t, "three voting members", time.Minute, func() bool {
		v, l := membership(t, members)
		return v == 3 && l == 0
	})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	clients := make([]kubernetes.Interface, len(servers))
	for i, s := range servers {
		clients[i] = s.client(t, 10*time.Second)
	}
	create := func(client kubernetes.Interface, name, value string) error {
		_, err := client.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"v": value}}, metav1.CreateOptions{})
		return err
	}
	// mustCreate retries through a cluster electing a leader; a retry
	// that finds the object made by the try before is done.
	mustCreate := func(client kubernetes.Interface, name, value string) {
		t.Helper()
		agenttest.EventuallyWithin(t, "create "+name, time.Minute, func() bool {
			err := create(client, name, value)
			return err == nil || apierrors.IsAlreadyExists(err)
		})
	}
	value := func(client kubernetes.Interface, name string) (string, error) {
		cm, err := client.CoreV1().ConfigMaps("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		return cm.Data["v"], nil
	}
	orch := func(s *haServer, args ...string) string {
		t.Helper()
		out, err := s.command(args...).CombinedOutput()
		if err != nil {
			t.Fatalf("orch %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	snapshotPath := regexp.MustCompile(`Snapshot (\S+) saved at revision (\d+)`)

	// A snapshot while the servers serve, then a write it does not have.
	mustCreate(clients[0], "before-snapshot", "1")
	saved := snapshotPath.FindStringSubmatch(orch(first, "snapshot", "save", "--data-dir", first.dir, "--dir", t.TempDir()))
	if saved == nil {
		t.Fatal("orch snapshot save printed no snapshot")
	}
	mustCreate(clients[0], "after-snapshot", "1")

	// The etcd leader's server paused past the election timeout (5 s).
	leader, pausedID := etcdLeader(t, members, addrs)
	paused, others := servers[leader], []int{}
	for i := range servers {
		if i != leader {
			others = append(others, i)
		}
	}
	mustCreate(clients[others[0]], "pause", "before")
	if err := paused.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	pausedAt := time.Now()
	other := etcdClient(t, servers[others[0]], etcdEndpoint(addrs[others[0]]))
	agenttest.EventuallyWithin(t, "another etcd leader", 30*time.Second, func() bool {
		sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
		defer scancel()
		st, err := other.Status(sctx, etcdEndpoint(addrs[others[0]]))
		return err == nil && st.Leader != 0 && st.Leader != pausedID
	})
	agenttest.EventuallyWithin(t, "the write after the pause", time.Minute, func() bool {
		cm, err := clients[others[1]].CoreV1().ConfigMaps("default").Get(ctx, "pause", metav1.GetOptions{})
		if err != nil {
			return false
		}
		if cm.Data["v"] == "after" {
			return true
		}
		cm.Data["v"] = "after"
		_, err = clients[others[1]].CoreV1().ConfigMaps("default").Update(ctx, cm, metav1.UpdateOptions{})
		return err == nil
	})
	t.Logf("a write acknowledged %s after the leader's server was paused", time.Since(pausedAt).Round(100*time.Millisecond))
	if err := paused.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// From the moment it runs again, the paused server answers with the
	// new value or not at all: never the one it had, by a GET (the store)
	// or a LIST (its watch cache, once at the store's revision).
	served, listed := 0, 0
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); {
		if v, err := value(clients[leader], "pause"); err == nil {
			served++
			if v != "after" {
				t.Fatalf("the server paused while it led served a stale read: %q, the value acknowledged meanwhile is \"after\"", v)
			}
		}
		if list, err := clients[leader].CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{}); err == nil {
			listed++
			for _, cm := range list.Items {
				if cm.Name == "pause" && cm.Data["v"] != "after" {
					t.Fatalf("the server paused while it led listed a stale value: %q, the value acknowledged meanwhile is \"after\"", cm.Data["v"])
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("after the pause: %d reads and %d lists, none stale", served, listed)
	// Its member caught up (on a loaded machine it takes longer than the
	// window above) before the next phase leaves the quorum to it and one
	// other.
	agenttest.EventuallyWithin(t, "the paused server serving the new value", 2*time.Minute, func() bool {
		v, err := value(clients[leader], "pause")
		return err == nil && v == "after"
	})
	mustCreate(clients[leader], "after-pause", "1")

	// The third server cut off from the others' etcd (its API still
	// reachable): no write acknowledged, not ready; the others go on.
	ipt := func(op string) {
		for _, chain := range []string{"INPUT", "OUTPUT"} {
			for _, port := range []string{"--dport", "--sport"} {
				run(t, "nsenter", "--net=/run/netns/"+apart, "iptables", op, chain, "-p", "tcp", port, "2380", "-j", "DROP")
			}
		}
	}
	ipt("-I")
	partitioned := time.Now()
	if err := create(clients[2], "through-the-partitioned", "1"); err == nil {
		t.Fatal("the partitioned server acknowledged a write")
	} else {
		t.Logf("a write through the partitioned server: %v", err)
	}
	agenttest.EventuallyWithin(t, "the partitioned server not ready", time.Minute, func() bool {
		_, err := clients[2].CoreV1().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err != nil
	})
	mustCreate(clients[0], "during-partition", "1")
	ipt("-D")
	agenttest.EventuallyWithin(t, "the healed server caught up", time.Minute, func() bool {
		v, err := value(clients[2], "during-partition")
		return err == nil && v == "1"
	})
	mustCreate(clients[2], "after-heal", "1")
	t.Logf("partitioned for %s; caught up and writing once healed", time.Since(partitioned).Round(time.Second))

	// Two servers lost: the quorum is gone.
	second.kill()
	third.kill()
	if err := create(clients[0], "without-quorum", "1"); err == nil {
		t.Fatal("a server without a quorum acknowledged a write")
	}
	first.stop()
	// --cluster-reset keeps the member's data as a cluster of one.
	orch(first, "server", "--data-dir", first.dir, "--advertise-address", addrs[0], "--cluster-reset")
	first.start(t)
	agenttest.WaitServer(t, first.kubeconfig)
	for _, name := range []string{"before-snapshot", "after-snapshot", "during-partition", "after-heal"} {
		if _, err := value(clients[0], name); err != nil {
			t.Errorf("%s after --cluster-reset: %v", name, err)
		}
	}
	mustCreate(clients[0], "after-reset", "1")

	// Restore the snapshot taken at the start; a snapshot of the stopped
	// server's member is taken first.
	first.stop()
	stoppedSnapshot := snapshotPath.FindStringSubmatch(orch(first, "snapshot", "save", "--data-dir", first.dir, "--dir", t.TempDir()))
	if stoppedSnapshot == nil {
		t.Fatal("orch snapshot save with the server stopped printed no snapshot")
	}
	if rev := mustAtoi(t, stoppedSnapshot[2]); rev <= mustAtoi(t, saved[2]) {
		t.Errorf("the stopped server's snapshot is at revision %d, not past the first snapshot's %s", rev, saved[2])
	}
	orch(first, "server", "--data-dir", first.dir, "--advertise-address", addrs[0], "--cluster-reset", "--cluster-reset-restore-path", saved[1])
	first.start(t)
	agenttest.WaitServer(t, first.kubeconfig)
	if _, err := value(clients[0], "before-snapshot"); err != nil {
		t.Errorf("before-snapshot after the restore: %v", err)
	}
	for _, name := range []string{"after-snapshot", "after-reset"} {
		if _, err := value(clients[0], name); !apierrors.IsNotFound(err) {
			t.Errorf("%s, written after the snapshot, after the restore: %v, want NotFound", name, err)
		}
	}

	// A lost server joins the restored cluster anew, its old member's
	// data moved away (as the reset's message says).
	if err := os.Rename(filepath.Join(third.dir, "server", "db", "etcd"), filepath.Join(third.dir, "server", "db", "etcd-lost")); err != nil {
		t.Fatal(err)
	}
	third.start(t)
	agenttest.EventuallyWithin(t, "the rejoined server serving the restored state", 2*time.Minute, func() bool {
		_, err := value(clients[2], "before-snapshot")
		_, gone := value(clients[2], "after-snapshot")
		return err == nil && apierrors.IsNotFound(gone)
	})
	mustCreate(clients[2], "through-the-rejoined", "1")

	// A new machine (the second's, its disk replaced) restores the
	// snapshot taken with the server stopped, from the server token
	// alone: the cluster's identity is in the snapshot.
	if err := os.RemoveAll(second.dir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(second.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	orch(second, "server", "--data-dir", second.dir, "--advertise-address", addrs[1], "--cluster-reset", "--cluster-reset-restore-path", stoppedSnapshot[1], "--token", serverToken)
	second.start(t)
	agenttest.WaitServer(t, second.kubeconfig)
	if _, err := value(clients[1], "after-reset"); err != nil {
		t.Errorf("after-reset, in the snapshot, on the new machine: %v", err)
	}
	for _, name := range []string{"tls/ca.crt", "token", "server-token"} {
		a, _ := os.ReadFile(filepath.Join(first.dir, "server", name))
		b, _ := os.ReadFile(filepath.Join(second.dir, "server", name))
		if len(a) == 0 || string(a) != string(b) {
			t.Errorf("the new machine's %s is not the cluster's", name)
		}
	}
}

// etcdLeader is the index of the address whose member leads, as the
// members at addrs say, and its member ID; it fails the test when none
// does.
func etcdLeader(t *testing.T, c *clientv3.Client, addrs []string) (int, uint64) {
	t.Helper()
	for i, a := range addrs {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := c.Status(ctx, etcdEndpoint(a))
		cancel()
		if err == nil && st.Leader == st.Header.MemberId {
			return i, st.Leader
		}
	}
	t.Fatal("no etcd member says it leads")
	return -1, 0
}
