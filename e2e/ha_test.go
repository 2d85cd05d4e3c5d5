//go:build e2e

package e2e_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

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
	bin        string
	args       []string
	netns      string // "" for the test's own network namespace
}

// startHAServer runs orch server as a user of several servers runs it,
// with the flags of its datastore (--datastore-endpoint and its TLS files,
// or --cluster-init, or --server) and its --token.
func startHAServer(t *testing.T, bin, addr string, port int, haArgs []string) *haServer {
	return startHAServerIn(t, "", bin, addr, port, haArgs)
}

// startHAServerIn runs the server in a network namespace (one of
// cluster.netns's) when netns is not "", as on a machine of its own.
func startHAServerIn(t *testing.T, netns, bin, addr string, port int, haArgs []string) *haServer {
	t.Helper()
	return launchHAServer(t, netns, bin, t.TempDir(), addr, port, append([]string{"--disable-agent"}, haArgs...))
}

// startServerNode runs a server with its own node (the default, and how
// k3s users build HA: every server also runs pods) named name in netns,
// its data dir holding the test images.
func startServerNode(t *testing.T, netns, bin, name, addr string, port int, haArgs []string) *haServer {
	t.Helper()
	dir := agenttest.NodeDataDir(t)
	return launchHAServer(t, netns, bin, dir, addr, port, append([]string{"--node-name", name, "--node-ip", addr,
		"--runtime-dir", filepath.Join(dir, "run"), "--kubelet-port", "10250", "--disable-snapshots"}, haArgs...))
}

func launchHAServer(t *testing.T, netns, bin, dir, addr string, port int, args []string) *haServer {
	t.Helper()
	s := &haServer{dir: dir, kubeconfig: filepath.Join(dir, "admin.yaml"), url: fmt.Sprintf("https://%s:%d", addr, port), log: filepath.Join(dir, "server.log"),
		bin: bin, netns: netns}
	s.args = append([]string{"server", "--data-dir", dir, "--bind-address", addr, "--advertise-address", addr,
		"--https-listen-port", strconv.Itoa(port), "--write-kubeconfig", s.kubeconfig}, args...)
	t.Cleanup(func() {
		s.kill()
		if t.Failed() {
			out, _ := os.ReadFile(s.log)
			t.Logf("server %s's log, the end:\n%s", s.url, tail(string(out), 30))
		}
	})
	s.start(t)
	agenttest.WaitServer(t, s.kubeconfig)
	return s
}

// client reaches the server alone, without waiting for it to be ready;
// every request gives up after timeout.
func (s *haServer) client(t *testing.T, timeout time.Duration) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", s.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst, cfg.Timeout = -1, 0, timeout
	return kubernetes.NewForConfigOrDie(cfg)
}

// command is orch with args, in the server's network namespace.
func (s *haServer) command(args ...string) *exec.Cmd {
	if s.netns == "" {
		return exec.Command(s.bin, args...)
	}
	// nsenter execs orch: the process is orch's, for signals.
	return exec.Command("nsenter", append([]string{"--net=/run/netns/" + s.netns, s.bin}, args...)...)
}

// start runs the server (again), its log appended to.
func (s *haServer) start(t *testing.T) {
	t.Helper()
	s.cmd = s.command(s.args...)
	logFile, err := os.OpenFile(s.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = logFile.Close() }()
	s.cmd.Stdout, s.cmd.Stderr = logFile, logFile
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
}

// kill stops the server as a board dies (-9), if it runs.
func (s *haServer) kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// stop stops the server as systemd does: SIGTERM, then SIGKILL.
func (s *haServer) stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
	}
	s.cmd = nil
}

// startEtcdProcess runs a real etcd (built from the module orch's client
// is written against: go.etcd.io/etcd/server/v3 is its main package) with
// mutual TLS, as a user's external etcd; it returns the server flags that
// reach it.
func startEtcdProcess(t *testing.T) []string {
	t.Helper()
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
	return []string{"--datastore-endpoint", endpoint, "--datastore-cafile", caFile, "--datastore-certfile", certFile, "--datastore-keyfile", keyFile}
}

// TestServersOnExternalEtcd: two servers on one etcd (a real etcd process,
// mutual TLS) are one cluster: a node joined to one runs what is created
// through the other. The first server, which runs the loops and which the
// node joined, is killed as a board dies: the other takes the loops over,
// the node's load balancer moves it to the other (learnt from the
// kubernetes Service), and the node stays Ready and runs new pods.
func TestServersOnExternalEtcd(t *testing.T) {
	c := newCluster(t) // the bridge and the first server's address; its own server is not used
	_ = c.serverCmd.Process.Kill()
	_ = c.serverCmd.Wait()
	const secondAddr = "198.18.0.2"
	run(t, "ip", "addr", "add", secondAddr+"/24", "dev", c.bridge)

	etcdArgs := startEtcdProcess(t)

	// Every server listens on the same port, as the kubernetes Service
	// assumes (as in Kubernetes).
	const token = "e2e-ha-cluster-secret-0123456789"
	port := agenttest.FreePort(t)
	first := startHAServer(t, c.bin, c.server, port, append([]string{"--token", token}, etcdArgs...))
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
	second := startHAServer(t, c.bin, secondAddr, port, append([]string{"--token", token}, etcdArgs...))
	viaSecond := agenttest.WaitServer(t, second.kubeconfig)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	agenttest.Eventually(t, "both servers in the kubernetes Service", func() bool {
		c.kubeconfig = second.kubeconfig
		out, err := c.kubectl("", "get", "endpoints", "kubernetes", "-o", "jsonpath={.subsets[0].addresses[*].ip}")
		return err == nil && strings.TrimSpace(out) == c.server+" "+secondAddr
	})
	// A release staged on one server is served by the other, which
	// fetches it first: a node may ask either.
	if out, err := first.command("upgrade", "stage", "--data-dir", first.dir).CombinedOutput(); err != nil {
		t.Fatalf("orch upgrade stage on the first server: %v: %s", err, out)
	}
	said, err := first.command("version").Output()
	if err != nil {
		t.Fatal(err)
	}
	version := strings.Fields(strings.TrimPrefix(string(said), "orch version "))[0]
	c.kubeconfig = second.kubeconfig
	platform := "linux/" + runtime.GOARCH
	got, err := c.kubectl("", "get", "--raw", "/orch/releases/"+version+"/"+platform)
	if err != nil {
		t.Fatalf("the release from the second server: %v", err)
	}
	if want, _ := os.ReadFile(c.bin); got != string(want) {
		t.Fatalf("the second server served %d bytes, not the staged binary's %d", len(got), len(want))
	}

	// The node joins the first server, with the token the servers share.
	c.url, c.token = first.url, token
	node := c.addNode("ha-node1", "198.18.0.11")
	agenttest.Eventually(t, "the node Ready as the second server sees it", func() bool {
		n, err := viaSecond.CoreV1().Nodes().Get(ctx, "ha-node1", metav1.GetOptions{})
		return err == nil && agenttest.NodeReady(n)
	})
	if _, err := viaSecond.AppsV1().Deployments("default").Create(ctx, deployment("ha", 1, agenttest.Busybox("main", "sleep 3600")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	running := func(want int) func() bool {
		return func() bool {
			pods, err := viaSecond.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=ha"})
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

	killed := time.Now()
	first.kill()
	c.kubeconfig = second.kubeconfig
	c.mustKubectl("", "scale", "deployment", "ha", "--replicas=2")
	agenttest.EventuallyWithin(t, "the second pod running: the loops on the surviving server, the node talking to it", 2*time.Minute, running(2))
	t.Logf("the surviving server's loops and the node ran the scale-up %s after the kill", time.Since(killed).Round(100*time.Millisecond))
	waitLeader(second, firstLeader)
	// The node's heartbeat goes on through the second server: its Lease
	// is renewed after the kill.
	agenttest.Eventually(t, "the node's Lease renewed through the surviving server", func() bool {
		l, err := viaSecond.CoordinationV1().Leases("kube-node-lease").Get(ctx, "ha-node1", metav1.GetOptions{})
		return err == nil && l.Spec.RenewTime != nil && l.Spec.RenewTime.After(killed.Add(time.Second))
	})
	// The dead server leaves the kubernetes Service once its key is not
	// renewed for 25 s (the survivor judges by its own clock).
	agenttest.Eventually(t, "the killed server out of the kubernetes Service", func() bool {
		out, err := c.kubectl("", "get", "endpoints", "kubernetes", "-o", "jsonpath={.subsets[0].addresses[*].ip}")
		return err == nil && strings.TrimSpace(out) == secondAddr
	})
	t.Logf("the killed server left the kubernetes Service %s after the kill", time.Since(killed).Round(time.Second))
	if out, _ := os.ReadFile(node.logPath); !strings.Contains(string(out), "move to another API server") {
		t.Errorf("the node's log does not say it moved:\n%s", tail(string(out), 30))
	}
}
