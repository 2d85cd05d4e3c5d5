package agent_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent/agenttest"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// outside is a machine beyond the node, as a LAN host or the internet is
// to a pod: a network namespace behind a veth pair, the node's end
// 198.51.100.1, its own 198.51.100.2, routed to by the node and by nothing
// else on this machine.
type outside struct {
	netns           string
	nodeIP, ownIP   string
	nodeEnd, farEnd string
}

func newOutside(t *testing.T) *outside {
	t.Helper()
	o := &outside{netns: fmt.Sprintf("orch-outside-%d", os.Getpid()), nodeIP: "198.51.100.1", ownIP: "198.51.100.2",
		nodeEnd: fmt.Sprintf("oo%dn", os.Getpid()%100000), farEnd: fmt.Sprintf("oo%df", os.Getpid()%100000)}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	run("ip", "netns", "add", o.netns)
	t.Cleanup(func() {
		_ = exec.Command("ip", "link", "del", o.nodeEnd).Run()
		_ = exec.Command("ip", "netns", "del", o.netns).Run()
	})
	run("ip", "link", "add", o.nodeEnd, "type", "veth", "peer", "name", o.farEnd, "netns", o.netns)
	run("ip", "addr", "add", o.nodeIP+"/24", "dev", o.nodeEnd)
	run("ip", "link", "set", o.nodeEnd, "up")
	run("ip", "-n", o.netns, "addr", "add", o.ownIP+"/24", "dev", o.farEnd)
	run("ip", "-n", o.netns, "link", "set", o.farEnd, "up")
	run("ip", "-n", o.netns, "link", "set", "lo", "up")
	return o
}

// listen opens a TCP listener inside the outside namespace.
func (o *outside) listen(t *testing.T, port int) net.Listener {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = self.Close() }()
	target, err := os.Open("/run/netns/" + o.netns)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = target.Close() }()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		t.Fatal(err)
	}
	ln, lnErr := net.Listen("tcp", fmt.Sprintf("%s:%d", o.ownIP, port))
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		panic(err) // this thread must not go back to the scheduler in the wrong namespace
	}
	if lnErr != nil {
		t.Fatal(lnErr)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln
}

// fetch gets url from inside the outside namespace, as a LAN client.
func (o *outside) fetch(url string) (string, error) {
	// Not wget -T: Debian's busybox crashes with it.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "nsenter", "--net=/run/netns/"+o.netns, "busybox", "wget", "-q", "-O", "-", url).CombinedOutput()
	return string(out), err
}

// whoAmI serves, at /cgi-bin/ip on port 8080, the address a request came
// from: busybox httpd with a CGI script.
func whoAmI(name string) corev1.Container {
	c := agenttest.Busybox(name, `mkdir -p /www/cgi-bin; printf '#!/bin/sh\necho Content-Type: text/plain\necho\necho "$REMOTE_ADDR"\n' > /www/cgi-bin/ip
chmod +x /www/cgi-bin/ip; httpd -f -p 8080 -h /www`)
	return c
}

// TestPodNetwork is the pod network as Kubernetes' model gives it: a pod
// reaches addresses outside the cluster through its default route,
// masqueraded as the node; pod-to-pod traffic keeps the pod's address; a
// hostPort publishes a pod on the node's address (before, any pod with a
// hostPort killed the whole orch process).
func TestPodNetwork(t *testing.T) {
	n := startNode(t, "net-node")
	far := newOutside(t)

	// Something outside the cluster answering with the caller's address.
	ln := far.listen(t, 9000)
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		_, _ = io.WriteString(w, host+"\n")
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	web := whoAmI("web")
	web.Ports = []corev1.ContainerPort{{ContainerPort: 8080, HostPort: 18080, Protocol: corev1.ProtocolTCP}}
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: corev1.PodSpec{Containers: []corev1.Container{web}}})
	webIP := n.waitRunning(t, "web").Status.PodIP

	client := agenttest.Busybox("main", fmt.Sprintf(`until wget -q -O /tmp/peer http://%[1]s:8080/cgi-bin/ip; do sleep 0.2; done; echo "pod saw $(cat /tmp/peer)"
until wget -q -O /tmp/far http://%[2]s:9000/; do sleep 0.2; done; echo "outside saw $(cat /tmp/far)"; sleep 3600`, webIP, far.ownIP))
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "client"}, Spec: corev1.PodSpec{Containers: []corev1.Container{client}}})
	clientIP := n.waitRunning(t, "client").Status.PodIP
	defer func() {
		if t.Failed() {
			t.Logf("web printed %q, client %q", n.output(n.Ctx, "web", "web"), n.output(n.Ctx, "client", "main"))
		}
	}()
	// busybox httpd listens on IPv6 and names IPv4 peers as mapped ones.
	n.waitOutput(t, "client", "main", "pod saw [::ffff:"+clientIP+"]\n", "outside saw "+far.nodeIP+"\n")

	// A LAN client reaches the hostPort on the node's address, and the pod
	// sees the client's own address (portmap does not masquerade it).
	var got string
	n.Eventually("the hostPort answering from outside", 30*time.Second, func(context.Context) (bool, error) {
		var err error
		got, err = far.fetch("http://" + far.nodeIP + ":18080/cgi-bin/ip")
		return err == nil, nil
	})
	if strings.TrimSpace(got) != "[::ffff:"+far.ownIP+"]" {
		t.Errorf("through the hostPort the pod saw %q, want the client's %s", got, far.ownIP)
	}

	// Traffic to other nodes' pods (the cluster CIDR) is not masqueraded.
	rules, err := exec.Command("iptables", "-w", "-t", "nat", "-S", "POSTROUTING").CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(rules), "! -d 10.42.0.0/16") {
		t.Errorf("the masquerade rule does not spare the cluster CIDR:\n%s", rules)
	}
}
