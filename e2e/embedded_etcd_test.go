//go:build e2e

package e2e_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/orch-dev/orch/internal/agent/agenttest"
	"github.com/orch-dev/orch/internal/api/etcdmember"
)

// etcdClient reaches the servers' own etcd with a server's client
// certificate, as an operator with etcdctl would.
func etcdClient(t *testing.T, s *haServer, endpoints ...string) *clientv3.Client {
	t.Helper()
	certs, err := etcdmember.LoadCertificates(filepath.Join(s.dir, "server", "tls", "etcd"), false)
	if err != nil {
		t.Fatal(err)
	}
	c, err := certs.Client(endpoints)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func etcdEndpoint(addr string) string { return "https://" + addr + ":2379" }

// membership counts the voting members and the learners.
func membership(t *testing.T, c *clientv3.Client) (voters, learners int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	voters, learners, err := etcdmember.CountMembers(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	return voters, learners
}

// TestServersWithEmbeddedEtcd: three servers hold the cluster's state
// themselves, as k3s users build HA: the first with --cluster-init, the
// others with --server and the server token (the agents' token is
// refused). The second waits as a learner until the third joins (two
// voters are less available than one). A node joined to one server runs
// what another is asked for. Then the server whose etcd member leads is
// killed (-9) under reads and writes through all three: the history stays
// linearizable, no acknowledged write is lost, a watch resumes across the
// kill, and writes resume within two election timeouts; the node, its pod
// and the cluster carry on through the two left.
func TestServersWithEmbeddedEtcd(t *testing.T) {
	c := newCluster(t) // the bridge and the first address; its own server is not used
	_ = c.serverCmd.Process.Kill()
	_ = c.serverCmd.Wait()
	addrs := []string{c.server, "198.18.0.2", "198.18.0.3"}
	for _, a := range addrs[1:] {
		run(t, "ip", "addr", "add", a+"/24", "dev", c.bridge)
	}
	port := agenttest.FreePort(t)
	const agentToken = "e2e-embedded-agents-0123456789"
	first := startHAServer(t, c.bin, addrs[0], port, []string{"--cluster-init", "--token", agentToken})
	raw, err := os.ReadFile(filepath.Join(first.dir, "server", "server-token"))
	if err != nil {
		t.Fatal(err)
	}
	serverToken := strings.TrimSpace(string(raw))
	agentTokenFull, err := os.ReadFile(filepath.Join(first.dir, "server", "token"))
	if err != nil {
		t.Fatal(err)
	}

	// The agents' token does not make a server.
	refused := exec.Command(c.bin, "server", "--data-dir", t.TempDir(), "--disable-agent", "--bind-address", addrs[1], "--advertise-address", addrs[1],
		"--https-listen-port", "0", "--server", first.url, "--token", strings.TrimSpace(string(agentTokenFull)))
	if out, err := refused.CombinedOutput(); err == nil || !strings.Contains(string(out), "agents' join token") {
		t.Fatalf("a server joined with the agents' token: %v\n%s", err, out)
	}

	second := startHAServer(t, c.bin, addrs[1], port, []string{"--server", first.url, "--token", serverToken})
	members := etcdClient(t, first, etcdEndpoint(addrs[0]))
	// Rounds of promotion pass (every 5 s): the second stays a learner.
	time.Sleep(7 * time.Second)
	if v, l := membership(t, members); v != 1 || l != 1 {
		t.Fatalf("with two servers: %d voting members and %d learners, want 1 and 1", v, l)
	}
	third := startHAServer(t, c.bin, addrs[2], port, []string{"--server", second.url, "--token", serverToken})
	agenttest.EventuallyWithin(t, "three voting members", time.Minute, func() bool {
		v, l := membership(t, members)
		return v == 3 && l == 0
	})
	servers := []*haServer{first, second, third}
	agenttest.Eventually(t, "the three servers in the kubernetes Service", func() bool {
		c.kubeconfig = third.kubeconfig
		out, err := c.kubectl("", "get", "endpoints", "kubernetes", "-o", "jsonpath={.subsets[0].addresses[*].ip}")
		return err == nil && strings.TrimSpace(out) == strings.Join(addrs, " ")
	})

	// A node joins the first server, with the agents' token.
	c.url, c.token = first.url, strings.TrimSpace(string(agentTokenFull))
	c.addNode("emb-node1", "198.18.0.11")
	viaThird := agenttest.WaitServer(t, third.kubeconfig)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := viaThird.AppsV1().Deployments("default").Create(ctx, deployment("emb", 1, agenttest.Busybox("main", "sleep 3600")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var podUID string
	agenttest.Eventually(t, "the Deployment's pod running on the node", func() bool {
		pods, err := viaThird.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=emb"})
		if err != nil || len(pods.Items) != 1 || pods.Items[0].Status.Phase != corev1.PodRunning {
			return false
		}
		podUID = string(pods.Items[0].UID)
		return true
	})

	// The etcd leader's server goes second: the one killed.
	leader, _ := etcdLeader(t, members, addrs)
	servers[1], servers[leader] = servers[leader], servers[1]
	t.Logf("killing the server at %s, whose etcd member leads", strings.TrimPrefix(servers[1].url, "https://"))
	resumed := checkLinearizable(t, servers, 1, 3*time.Second, 20*time.Second)
	// Two election timeouts of the board settings (5 s each).
	if resumed > 10*time.Second {
		t.Errorf("writes resumed %s after the leader's kill; want within two election timeouts (10 s)", resumed)
	}

	// The cluster carries on with two servers: the node stays Ready, its
	// pod untouched, and a new one runs.
	alive := servers[0]
	if alive == servers[1] {
		alive = servers[2]
	}
	client := agenttest.WaitServer(t, alive.kubeconfig)
	c.kubeconfig = alive.kubeconfig
	c.mustKubectl("", "scale", "deployment", "emb", "--replicas=2")
	agenttest.EventuallyWithin(t, "two pods running, the first untouched", 2*time.Minute, func() bool {
		pods, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=emb"})
		if err != nil {
			return false
		}
		running, kept := 0, false
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				running++
				kept = kept || string(p.UID) == podUID
			}
		}
		return running == 2 && kept
	})
	n, err := client.CoreV1().Nodes().Get(ctx, "emb-node1", metav1.GetOptions{})
	if err != nil || !agenttest.NodeReady(n) {
		t.Fatalf("the node after the kill: %v %v", n, err)
	}
}
