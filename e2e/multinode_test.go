//go:build e2e

package e2e_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/orch-dev/orch/internal/agent/agenttest"
	"github.com/orch-dev/orch/internal/agent/testimage"
	"k8s.io/utils/ptr"
)

// cluster is orch server on a bridge of its own and agents in network
// namespaces on that bridge, as design.md's test environment lays out:
// one segment, one address each, their own data dirs and containerds.
type cluster struct {
	t *testing.T
	// images are more test images each node gets (by reference, the
	// executables beside busybox).
	images map[string]map[string][]byte
	// imageCmds are those images' commands (default sh).
	imageCmds map[string][]string
	// kubeconfig is the admin's.
	kubeconfig string
	// agentArgs are more flags for every agent.
	agentArgs []string
	// agentEnv are more environment variables for the named node's agent.
	agentEnv map[string][]string
	// supervised names the nodes whose agents run as systemd runs them
	// (node.launch).
	supervised map[string]bool
	// serverCmd is the server's process.
	serverCmd *exec.Cmd
	// podNetwork is the agents' --pod-network (empty: the default).
	podNetwork string
	id         string
	bin        string
	bridge     string
	server     string // the server's address on the bridge
	url        string
	token      string
	client     kubernetes.Interface
	// dataDir is the server's; local-path volumes go under its storage/.
	dataDir string
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

// clusters counts the clusters this test process has made.
var clusters atomic.Int32

// newCluster starts the server (no agent of its own) on 198.18.0.1, an
// address of the benchmarking range no real network uses.
func newCluster(t *testing.T) *cluster {
	return newClusterOf(t, agenttest.BuildOrch(t))
}

// newClusterOf is newCluster running the orch binary bin.
func newClusterOf(t *testing.T, bin string) *cluster {
	// Names unique to this cluster: a namespace deleted by the test
	// before takes its veth with it only a moment later (the kernel
	// cleans namespaces up asynchronously).
	c := &cluster{t: t, id: fmt.Sprintf("%d%d", os.Getpid()%10000, clusters.Add(1)%10), bin: bin, server: "198.18.0.1"}
	c.bridge = "e2ebr" + c.id
	run(t, "ip", "link", "add", c.bridge, "type", "bridge")
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", c.bridge).Run() })
	run(t, "ip", "addr", "add", c.server+"/24", "dev", c.bridge)
	run(t, "ip", "link", "set", c.bridge, "up")
	dir := t.TempDir()
	port := agenttest.FreePort(t)
	cmd := exec.Command(c.bin, "server", "--data-dir", dir, "--disable-agent", "--bind-address", c.server,
		"--advertise-address", c.server, "--https-listen-port", strconv.Itoa(port), "--write-kubeconfig", filepath.Join(dir, "admin.yaml"))
	logPath := filepath.Join(t.TempDir(), "server.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c.serverCmd = cmd
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = logFile.Close()
		if t.Failed() {
			out, _ := os.ReadFile(logPath)
			t.Logf("the server's log, its warnings and errors, the end:\n%s", tail(warnings(string(out)), 40))
		}
	})
	// What the cluster held when the test failed, while it still runs
	// (cleanups run last added first).
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, args := range [][]string{{"get", "pods", "-A", "-o", "wide"}, {"get", "events", "-A", "--sort-by=.lastTimestamp"}} {
			out, err := c.kubectl("", args...)
			t.Logf("kubectl %s (%v):\n%s", strings.Join(args, " "), err, tail(out, 40))
		}
	})
	c.kubeconfig, c.dataDir = filepath.Join(dir, "admin.yaml"), dir
	c.client = agenttest.WaitServer(t, c.kubeconfig)
	token, err := os.ReadFile(filepath.Join(dir, "server", "token"))
	if err != nil {
		t.Fatal(err)
	}
	c.url, c.token = fmt.Sprintf("https://%s:%d", c.server, port), strings.TrimSpace(string(token))
	return c
}

// node is an agent as a process in a network namespace of its own on the
// cluster's bridge, with its own data dir and containerd.
type node struct {
	c                 *cluster
	name, ip, ns, dir string
	// bin is the node's own orch binary (default the cluster's).
	bin     string
	logPath string
	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{} // closed once cmd has ended
	// starts counts the agent's starts (by the test or its supervisor).
	starts int
}

// supervisorRestartDelay is install.sh's unit's RestartSec.
const supervisorRestartDelay = 5 * time.Second

// addNode starts an agent at ip on the cluster's bridge; the test's end
// stops it.
func (c *cluster) addNode(name, ip string) *node {
	return c.addNodeOf(name, ip, c.bin)
}

// addNodeOf is addNode running the orch binary at bin.
func (c *cluster) addNodeOf(name, ip, bin string) *node {
	t := c.t
	n := &node{c: c, name: name, ip: ip, ns: c.netns(name, ip), dir: agenttest.NodeDataDir(t), bin: bin}
	// nsenter, not ip netns exec, which remounts /sys and leaves runc no
	// cgroup mount (design.md).
	run(t, "nsenter", "--net=/run/netns/"+n.ns, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward")
	for ref, files := range c.images {
		if err := testimage.Write(filepath.Join(n.dir, "agent", "images", strings.NewReplacer("/", "_", ":", "_").Replace(ref)+".tar"), ref,
			testimage.Config{Cmd: c.imageCmds[ref], Files: files}); err != nil {
			t.Fatal(err)
		}
	}
	n.logPath = filepath.Join(t.TempDir(), name+".log")
	n.start()
	t.Cleanup(func() {
		n.stop()
		if t.Failed() {
			out, _ := os.ReadFile(n.logPath)
			t.Logf("%s's log, the end:\n%s", name, tail(string(out), 40))
		}
	})
	return n
}

// netns makes a network namespace for a machine named name (its last
// character tells the veths of one cluster apart) at ip on the cluster's
// bridge, routed through the first server's address; the test's end
// removes it.
func (c *cluster) netns(name, ip string) string {
	t := c.t
	ns := name + "-" + c.id
	run(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	host := "e2e" + c.id + name[len(name)-1:]
	run(t, "ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", host).Run() })
	run(t, "ip", "link", "set", host, "master", c.bridge, "up")
	run(t, "ip", "-n", ns, "addr", "add", ip+"/24", "dev", "eth0")
	run(t, "ip", "-n", ns, "link", "set", "eth0", "up")
	run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	run(t, "ip", "-n", ns, "route", "add", "default", "via", c.server)
	return ns
}

// start runs the node's agent (again).
func (n *node) start() {
	if err := n.launch(); err != nil {
		n.c.t.Fatal(err)
	}
}

// launch starts the agent. A node the cluster supervises is started
// again supervisorRestartDelay after it ends, with INVOCATION_ID set, as
// systemd runs the unit install.sh writes (Restart=always), until the
// test stops it.
func (n *node) launch() error {
	args := []string{"--net=/run/netns/" + n.ns, n.bin, "agent", "--server", n.c.url, "--token", n.c.token,
		"--data-dir", n.dir, "--runtime-dir", filepath.Join(n.dir, "run"), "--node-name", n.name, "--node-ip", n.ip, "--kubelet-port", "10250"}
	if n.c.podNetwork != "" {
		args = append(args, "--pod-network", n.c.podNetwork)
	}
	args = append(args, n.c.agentArgs...)
	cmd := exec.Command("nsenter", args...)
	supervised := n.c.supervised[n.name]
	if env := n.c.agentEnv[n.name]; len(env) > 0 || supervised {
		cmd.Env = append(os.Environ(), env...)
		if supervised {
			cmd.Env = append(cmd.Env, "INVOCATION_ID=e2e"+n.name)
		}
	}
	log, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer func() { _ = log.Close() }()
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	n.mu.Lock()
	n.cmd, n.exited = cmd, exited
	n.starts++
	n.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		close(exited)
		if !supervised {
			return
		}
		time.Sleep(supervisorRestartDelay)
		n.mu.Lock()
		again := n.cmd == cmd // not stopped by the test meanwhile
		n.mu.Unlock()
		if again {
			if err := n.launch(); err != nil {
				n.c.t.Errorf("the supervisor could not start %s again: %v", n.name, err)
			}
		}
	}()
	return nil
}

// kill ends the agent with SIGKILL, as a power cut does, and waits for
// it to end; a supervised node is started again.
func (n *node) kill() {
	n.mu.Lock()
	cmd, exited := n.cmd, n.exited
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-exited
}

// stop stops the node's agent, if it runs, and its supervision: its pods,
// rules and routes stay, as when a real agent restarts.
func (n *node) stop() {
	n.mu.Lock()
	cmd, exited := n.cmd, n.exited
	n.cmd = nil
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(os.Interrupt)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// in runs a command in the node's network namespace.
func (n *node) in(args ...string) (string, error) {
	out, err := exec.Command("nsenter", append([]string{"--net=/run/netns/" + n.ns}, args...)...).CombinedOutput()
	return string(out), err
}

// warnings are a log's lines of level WARN and ERROR.
func warnings(log string) string {
	var out []string
	for line := range strings.SplitSeq(log, "\n") {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

func tail(s string, lines int) string {
	all := strings.Split(s, "\n")
	return strings.Join(all[max(0, len(all)-lines):], "\n")
}

// whoAmI answers /cgi-bin/who with the pod's name and the client address
// it sees, and /big with a megabyte.
func whoAmI() corev1.Container {
	c := agenttest.Busybox("web", `mkdir -p /www/cgi-bin; dd if=/dev/zero of=/www/big bs=1024 count=1024 2>/dev/null; printf '#!/bin/sh\necho Content-Type: text/plain\necho\necho "$(hostname) $REMOTE_ADDR"\n' > /www/cgi-bin/who
chmod +x /www/cgi-bin/who; httpd -f -p 8080 -h /www`)
	return c
}

// TestTwoNodes: a server and two agents on one segment, driven through
// the API as kubectl would, with each pod network backend (VXLAN, the
// default, and host-gw). Pods on different nodes reach each other by
// address and see each other's own (no NAT between pods); a Service's
// ClusterIP, from a pod on either node, reaches the pods of both; its
// node port answers on both nodes' addresses from outside the cluster.
func TestTwoNodes(t *testing.T) {
	for _, backend := range []string{"", "host-gw"} {
		name := backend
		if name == "" {
			name = "default"
		}
		t.Run(name, func(t *testing.T) { testTwoNodes(t, backend) })
	}
}

func testTwoNodes(t *testing.T, podNetwork string) {
	c := newCluster(t)
	c.podNetwork = podNetwork
	nodes := map[string]string{"node-a": "198.18.0.11", "node-b": "198.18.0.12"}
	added := map[string]*node{}
	for name, ip := range nodes {
		added[name] = c.addNode(name, ip)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	agenttest.Eventually(t, "both nodes Ready with a pod network", func() bool {
		list, err := c.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil || len(list.Items) != 2 {
			return false
		}
		for _, n := range list.Items {
			if !agenttest.NodeReady(&n) || n.Spec.PodCIDR == "" {
				return false
			}
			// VXLAN's tunnel ends are published on the Nodes, as flannel's.
			if podNetwork == "" && n.Annotations["flannel.alpha.coreos.com/public-ip"] != nodes[n.Name] {
				return false
			}
		}
		return true
	})

	labels := map[string]string{"app": "web"}
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: appsv1.DaemonSetSpec{
		Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](0), Containers: []corev1.Container{whoAmI()}}}}}
	if _, err := c.client.AppsV1().DaemonSets("default").Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: labels,
		Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080), NodePort: 30088}}}}
	created, err := c.client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	webs := map[string]corev1.Pod{} // by node
	agenttest.Eventually(t, "a web pod Running on each node", func() bool {
		list, err := c.client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return false
		}
		for _, p := range list.Items {
			if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
				webs[p.Spec.NodeName] = p
			}
		}
		return len(webs) == 2
	})

	// A client on each node asks the other node's pod directly, then the
	// ClusterIP twenty times.
	for name := range nodes {
		other := webs["node-a"]
		if name == "node-a" {
			other = webs["node-b"]
		}
		// Each try within 3 s: a first SYN sent before the node's proxy
		// had the Service's rules is remembered by conntrack un-NATed,
		// and its retransmissions go nowhere (as on any kube-proxy node);
		// a new connection is NATed. The twenty counted requests start
		// once the ClusterIP has reached the other node's pod: a pod
		// Running is behind the Service only after the endpoints loop and
		// this node's proxy have seen it ready, a second or so later.
		script := fmt.Sprintf(`until timeout 3 wget -q -O /tmp/direct http://%s:8080/cgi-bin/who; do sleep 0.3; done; echo "direct $(cat /tmp/direct)"
until timeout 3 wget -q -O - http://%[2]s/cgi-bin/who | grep -q %[3]s; do sleep 0.3; done
n=0; while [ $n -lt 20 ]; do if out=$(timeout 3 wget -q -O - http://%[2]s/cgi-bin/who); then echo "service $out"; n=$((n+1)); fi; done
timeout 10 wget -q -O /tmp/big http://%[1]s:8080/big; echo "big $(wc -c < /tmp/big)"; echo "mtu $(cat /sys/class/net/eth0/mtu)"; sleep 3600`, other.Status.PodIP, created.Spec.ClusterIP, other.Name)
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "client-" + name}, Spec: corev1.PodSpec{NodeName: name,
			TerminationGracePeriodSeconds: ptr.To[int64](0), Containers: []corev1.Container{agenttest.Busybox("main", script)}}}
		if _, err := c.client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for name := range nodes {
		other := "node-b"
		if name == "node-b" {
			other = "node-a"
		}
		var out string
		agenttest.Eventually(t, "client-"+name+" done asking", func() bool {
			raw, err := c.client.CoreV1().Pods("default").GetLogs("client-"+name, &corev1.PodLogOptions{}).DoRaw(ctx)
			out = string(raw)
			return err == nil && strings.Count(out, "service ") == 20 && strings.Contains(out, "mtu ")
		})
		client, err := c.client.CoreV1().Pods("default").Get(ctx, "client-"+name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// busybox httpd names IPv4 peers as IPv4-mapped IPv6.
		if want := "direct " + webs[other].Name + " [::ffff:" + client.Status.PodIP + "]"; !strings.Contains(out, want+"\n") {
			t.Errorf("client-%s asking %s's pod directly:\n%s\nwant the line %q (its own address, no NAT)", name, other, out, want)
		}
		// A megabyte from the other node's pod: the pods' MTU fits the
		// tunnel, or the transfer stalls.
		if !strings.Contains(out, "big 1048576\n") {
			t.Errorf("client-%s fetching a megabyte from %s's pod:\n%s", name, other, out)
		}
		wantMTU := "mtu 1450\n" // the bridge's 1500 less VXLAN's 50
		if podNetwork == "host-gw" {
			wantMTU = "mtu 1500\n"
		}
		if !strings.Contains(out, wantMTU) {
			t.Errorf("client-%s's interface: want %q:\n%s", name, wantMTU, out)
		}
		for _, w := range webs {
			if !strings.Contains(out, "service "+w.Name+" ") {
				t.Errorf("client-%s's twenty requests to the ClusterIP never reached %s on %s:\n%s", name, w.Name, w.Spec.NodeName, out)
			}
		}
	}

	// From outside the cluster (the bridge's host), the node port on each
	// node's address.
	for name, ip := range nodes {
		agenttest.Eventually(t, "the node port on "+name, func() bool {
			hc := &http.Client{Timeout: 3 * time.Second}
			resp, err := hc.Get("http://" + ip + ":30088/cgi-bin/who")
			if err != nil {
				return false
			}
			defer func() { _ = resp.Body.Close() }()
			body, err := io.ReadAll(resp.Body)
			return err == nil && strings.HasPrefix(string(body), "web-")
		})
	}

	// Uninstalling: once node-a's agent has stopped, orch agent --cleanup
	// leaves its network namespace with nothing of orch's.
	a := added["node-a"]
	a.stop()
	if out, err := a.in(c.bin, "agent", "--cleanup"); err != nil {
		t.Fatalf("orch agent --cleanup: %v\n%s", err, out)
	}
	for _, check := range [][]string{{"iptables-save"}, {"nft", "list", "ruleset"}, {"ip", "-d", "link"}, {"ip", "route", "show", "proto", "0x4f"}} {
		out, err := a.in(check...)
		if err != nil {
			t.Fatalf("%s: %v\n%s", check, err, out)
		}
		for _, left := range []string{"KUBE-", "kube-proxy", "CNI-", "orch", "flannel", "vxlan", "10.42."} {
			if strings.Contains(string(out), left) {
				t.Errorf("after orch agent --cleanup, %s shows %q:\n%s", strings.Join(check, " "), left, out)
			}
		}
	}
}
