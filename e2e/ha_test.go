//go:build e2e

package e2e_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/orch-dev/orch/internal/agent/agenttest"
	"github.com/orch-dev/orch/internal/store/etcdstore/etcdtest"
)

// haServer is one orch server process on the shared etcd.
type haServer struct {
	cmd        *exec.Cmd
	dir        string
	kubeconfig string
	url        string
	log        string
}

// startHAServer runs orch server as a user of an external etcd runs it:
// --datastore-endpoint and its TLS files, the cluster's --token.
func startHAServer(t *testing.T, bin, addr, token string, etcdArgs []string) *haServer {
	t.Helper()
	dir := t.TempDir()
	port := agenttest.FreePort(t)
	s := &haServer{dir: dir, kubeconfig: filepath.Join(dir, "admin.yaml"), url: fmt.Sprintf("https://%s:%d", addr, port), log: filepath.Join(dir, "server.log")}
	args := append([]string{"server", "--data-dir", dir, "--disable-agent", "--bind-address", addr, "--advertise-address", addr,
		"--https-listen-port", strconv.Itoa(port), "--write-kubeconfig", s.kubeconfig, "--token", token}, etcdArgs...)
	s.cmd = exec.Command(bin, args...)
	logFile, err := os.Create(s.log)
	if err != nil {
		t.Fatal(err)
	}
	s.cmd.Stdout, s.cmd.Stderr = logFile, logFile
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		_ = logFile.Close()
		if t.Failed() {
			out, _ := os.ReadFile(s.log)
			t.Logf("server %s's log, the end:\n%s", s.url, tail(string(out), 30))
		}
	})
	agenttest.WaitServer(t, s.kubeconfig)
	return s
}

// TestServersOnExternalEtcd: two servers on one etcd (a real etcd process,
// mutual TLS) are one cluster: a node joined to one runs what is created
// through the other; the loops run on one of them, and when that one is
// killed the other takes them over and the node's workload keeps being
// managed.
func TestServersOnExternalEtcd(t *testing.T) {
	c := newCluster(t) // the bridge and the first server's address; its own server is not used
	_ = c.serverCmd.Process.Kill()
	_ = c.serverCmd.Wait()

	etcdBin := filepath.Join(t.TempDir(), "etcd")
	if out, err := exec.Command("go", "build", "-o", etcdBin, "go.etcd.io/etcd/server/v3").CombinedOutput(); err != nil {
		t.Fatalf("build etcd: %v\n%s", err, out)
	}
	tlsDir := t.TempDir()
	caFile, certFile, keyFile, info, err := etcdtest.Certificates(tlsDir)
	if err != nil {
		t.Fatal(err)
	}
	clientPort, peerPort := agenttest.FreePort(t), agenttest.FreePort(t)
	endpoint := fmt.Sprintf("https://127.0.0.1:%d", clientPort)
	etcd := exec.Command(etcdBin, "--data-dir", filepath.Join(t.TempDir(), "etcd"), "--log-level", "error",
		"--listen-client-urls", endpoint, "--advertise-client-urls", endpoint,
		"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peerPort),
		"--initial-advertise-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peerPort),
		"--initial-cluster", fmt.Sprintf("default=http://127.0.0.1:%d", peerPort),
		"--cert-file", info.CertFile, "--key-file", info.KeyFile, "--trusted-ca-file", info.TrustedCAFile, "--client-cert-auth")
	if err := etcd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = etcd.Process.Kill(); _ = etcd.Wait() })
	etcdArgs := []string{"--datastore-endpoint", endpoint, "--datastore-cafile", caFile, "--datastore-certfile", certFile, "--datastore-keyfile", keyFile}

	const token = "e2e-ha-cluster-secret-0123456789"
	first := startHAServer(t, c.bin, c.server, token, etcdArgs)
	// kubectl -n kube-system get lease orch-controllers names the holder.
	waitLeader := func(s *haServer, not string) string {
		var holder string
		agenttest.Eventually(t, "a holder of the controllers' Lease", func() bool {
			c.kubeconfig = s.kubeconfig
			out, err := c.kubectl("", "-n", "kube-system", "get", "lease", "orch-controllers", "-o", "jsonpath={.spec.holderIdentity}")
			holder = strings.TrimSpace(out)
			return err == nil && holder != "" && holder != not
		})
		return holder
	}
	firstLeader := waitLeader(first, "")
	second := startHAServer(t, c.bin, c.server, token, etcdArgs)

	// The node joins the second server, with the token the servers share.
	c.url, c.token = second.url, token
	c.addNode("ha-node1", "198.18.0.11")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	viaFirst := agenttest.WaitServer(t, first.kubeconfig)
	agenttest.Eventually(t, "the node Ready as the first server sees it", func() bool {
		n, err := viaFirst.CoreV1().Nodes().Get(ctx, "ha-node1", metav1.GetOptions{})
		return err == nil && agenttest.NodeReady(n)
	})
	if _, err := viaFirst.AppsV1().Deployments("default").Create(ctx, deployment("ha", 1, agenttest.Busybox("main", "sleep 3600")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	running := func(want int) func() bool {
		return func() bool {
			pods, err := agenttest.WaitServer(t, second.kubeconfig).CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=ha"})
			if err != nil {
				return false
			}
			n := 0
			for _, p := range pods.Items {
				if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
					n++
				}
			}
			return n == want
		}
	}
	agenttest.Eventually(t, "the Deployment's pod running on the node", running(1))

	// Kill the server that runs the loops, as a board dies; the node's
	// server is the other one, which takes the loops over.
	killed := time.Now()
	_ = first.cmd.Process.Kill()
	viaSecond := agenttest.WaitServer(t, second.kubeconfig)
	c.kubeconfig = second.kubeconfig
	c.mustKubectl("", "scale", "deployment", "ha", "--replicas=2")
	agenttest.EventuallyWithin(t, "the second pod running, the loops on the surviving server", 2*time.Minute, running(2))
	t.Logf("the surviving server's loops ran the scale-up %s after the leader's kill", time.Since(killed).Round(100*time.Millisecond))
	waitLeader(second, firstLeader)
	n, err := viaSecond.CoreV1().Nodes().Get(ctx, "ha-node1", metav1.GetOptions{})
	if err != nil || !agenttest.NodeReady(n) {
		t.Fatalf("node after the failover: %v", err)
	}
}
