//go:build e2e

package e2e_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/orch-dev/orch/internal/agent/agenttest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// dnsManifest: a web Deployment and Service in default, another in
// namespace other, a headless Service over two pods with hostnames under
// it, an ExternalName Service, and client pods: one asking the cluster
// DNS, one with dnsPolicy Default.
const dnsManifest = `apiVersion: v1
kind: Namespace
metadata: {name: other}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - {name: web, image: busybox:test, command: [sh, -c, 'mkdir -p /www; echo web > /www/index.html; exec httpd -f -p 8080 -h /www']}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec: {selector: {app: web}, ports: [{name: http, port: 80, targetPort: 8080}]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: api, namespace: other}
spec:
  selector: {matchLabels: {app: api}}
  template:
    metadata: {labels: {app: api}}
    spec:
      containers:
      - {name: api, image: busybox:test, command: [sh, -c, 'mkdir -p /www; echo api > /www/index.html; exec httpd -f -p 8080 -h /www']}
---
apiVersion: v1
kind: Service
metadata: {name: api, namespace: other}
spec: {selector: {app: api}, ports: [{port: 80, targetPort: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: db}
spec: {clusterIP: None, selector: {app: db}, ports: [{name: pg, port: 5432}]}
---
apiVersion: v1
kind: Pod
metadata: {name: db-0, labels: {app: db}}
spec:
  hostname: db-0
  subdomain: db
  terminationGracePeriodSeconds: 0
  containers: [{name: db, image: busybox:test, command: [sleep, "3600"]}]
---
apiVersion: v1
kind: Pod
metadata: {name: db-1, labels: {app: db}}
spec:
  hostname: db-1
  subdomain: db
  terminationGracePeriodSeconds: 0
  containers: [{name: db, image: busybox:test, command: [sleep, "3600"]}]
---
apiVersion: v1
kind: Service
metadata: {name: search}
spec: {type: ExternalName, externalName: outside.example}
---
apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  terminationGracePeriodSeconds: 0
  containers: [{name: main, image: probe:test, command: [sleep, "3600"]}]
---
apiVersion: v1
kind: Pod
metadata: {name: client-default}
spec:
  dnsPolicy: Default
  terminationGracePeriodSeconds: 0
  containers: [{name: main, image: probe:test, command: [sleep, "3600"]}]
`

// TestClusterDNS: every node answers its pods' questions (the kube-dns
// Service, its endpoints the nodes), driven with stock kubectl and a Go
// program in a pod resolving as any Go client does: a Service by short
// name in its namespace and by name.namespace in another, and reached by
// those names; a headless Service's pods, each by hostname; SRV for a
// named port; an ExternalName followed outside; an outside name through
// the node's resolver (a fake one the test runs); a dnsPolicy Default pod
// gets the node's resolv.conf; names still resolve with the server
// stopped.
func TestClusterDNS(t *testing.T) {
	probe := goBinary(t, "./testdata/dnsprobe")
	c := newCluster(t)
	// The nodes' resolver: outside.example has an address, nothing else
	// exists.
	var asked atomic.Int32
	pc, err := net.ListenPacket("udp", c.server+":53")
	if err != nil {
		t.Fatal(err)
	}
	upstream := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		asked.Add(1)
		m := new(dns.Msg)
		m.SetReply(r)
		if q := r.Question[0]; strings.EqualFold(q.Name, "outside.example.") && q.Qtype == dns.TypeA {
			rr, _ := dns.NewRR("outside.example. 60 IN A 192.0.2.7")
			m.Answer = append(m.Answer, rr)
		} else {
			m.Rcode = dns.RcodeNameError
		}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = upstream.ActivateAndServe() }()
	t.Cleanup(func() { _ = upstream.Shutdown() })
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver "+c.server+"\nsearch lan.example\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.agentArgs = []string{"--resolv-conf", resolv}
	c.images = map[string]map[string][]byte{"docker.io/library/probe:test": {"/bin/dnsprobe": probe}}
	nodes := map[string]*node{}
	for name, ip := range map[string]string{"node-a": "198.18.0.31", "node-b": "198.18.0.32"} {
		nodes[name] = c.addNode(name, ip)
	}
	ctx := context.Background()
	agenttest.Eventually(t, "kube-dns's endpoints on both nodes", func() bool {
		s, err := c.client.DiscoveryV1().EndpointSlices("kube-system").Get(ctx, "kube-dns-nodes", metav1.GetOptions{})
		ready := 0
		if err == nil {
			for _, e := range s.Endpoints {
				if e.Conditions.Ready != nil && *e.Conditions.Ready {
					ready++
				}
			}
		}
		return ready == 2
	})
	c.mustKubectl(dnsManifest, "apply", "-f", "-")
	c.mustKubectl("", "wait", "--for=condition=Ready", "pod", "--all", "--all-namespaces", "--timeout=120s")
	ip := func(ns, name string) string {
		svc, err := c.client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return svc.Spec.ClusterIP
	}
	podIP := func(name string) string {
		p, err := c.client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p.Status.PodIP
	}
	probeIn := func(pod string, args ...string) string {
		out, err := c.kubectl("", append([]string{"exec", pod, "--", "/bin/dnsprobe"}, args...)...)
		if err != nil {
			t.Errorf("dnsprobe %s in %s: %v: %s", strings.Join(args, " "), pod, err, out)
		}
		return strings.TrimSpace(out)
	}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"host", "web"}, ip("default", "web")},
		{[]string{"get", "http://web/"}, "web"},
		{[]string{"host", "api.other"}, ip("other", "api")},
		{[]string{"get", "http://api.other/"}, "api"},
		{[]string{"host", "web.default.svc.cluster.local"}, ip("default", "web")},
		{[]string{"host", "db-0.db"}, podIP("db-0")},
		{[]string{"srv", "http", "tcp", "web.default.svc.cluster.local"}, "web.default.svc.cluster.local.:80"},
		{[]string{"cname", "search"}, "outside.example."},
		{[]string{"host", "search"}, "192.0.2.7"},
		{[]string{"host", "outside.example"}, "192.0.2.7"},
	}
	// A Service's rules reach a node's proxy a moment after its pods are
	// Ready (the EndpointSlice, then the proxy's sync), as on Kubernetes:
	// a request may be refused until then.
	probeUntil := func(want string, args ...string) string {
		deadline := time.Now().Add(15 * time.Second)
		for {
			out, err := c.kubectl("", append([]string{"exec", "client", "--", "/bin/dnsprobe"}, args...)...)
			if got := strings.TrimSpace(out); err == nil && got == want || time.Now().After(deadline) {
				if err != nil {
					t.Errorf("dnsprobe %s in client: %v: %s", strings.Join(args, " "), err, out)
				}
				return got
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	check := func(when string) {
		for _, tc := range cases {
			if got := probeUntil(tc.want, tc.args...); got != tc.want {
				t.Errorf("%s: dnsprobe %s = %q, want %q", when, strings.Join(tc.args, " "), got, tc.want)
			}
		}
		headless := probeIn("client", "host", "db")
		if want := []string{podIP("db-0"), podIP("db-1")}; !strings.Contains(headless, want[0]) || !strings.Contains(headless, want[1]) {
			t.Errorf("%s: the headless Service db resolved to %q, want both pods %v", when, headless, want)
		}
	}
	check("with the server up")
	podIP0 := podIP("db-0")
	if asked.Load() == 0 {
		t.Error("the node's resolver was never asked for outside.example")
	}
	out := c.mustKubectl("", "exec", "client-default", "--", "cat", "/etc/resolv.conf")
	if !strings.Contains(out, "nameserver "+c.server) || strings.Contains(out, "10.43.0.10") {
		t.Errorf("a dnsPolicy Default pod's resolv.conf:\n%s\nwant the node's", out)
	}

	// The server goes away: the nodes answer from what they hold. kubectl
	// exec needs the server, so the probe runs from the host, in the
	// client pod's network namespace, asking 10.43.0.10 as the pod does.
	webIP := ip("default", "web")
	client, err := c.client.CoreV1().Pods("default").Get(ctx, "client", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	podNetns := filepath.Join(nodes[client.Spec.NodeName].dir, "run", "netns", string(client.UID))
	probePath := filepath.Join(t.TempDir(), "dnsprobe")
	if err := os.WriteFile(probePath, probe, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := c.serverCmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = c.serverCmd.Wait()
	for _, name := range []string{"web.default.svc.cluster.local", "db-0.db.default.svc.cluster.local", "outside.example"} {
		cmd := exec.Command("nsenter", "--net="+podNetns, probePath, "host", name)
		cmd.Env = append(os.Environ(), "DNSPROBE_SERVER=10.43.0.10:53")
		out, err := cmd.CombinedOutput()
		want := map[string]string{"web.default.svc.cluster.local": webIP, "db-0.db.default.svc.cluster.local": podIP0, "outside.example": "192.0.2.7"}[name]
		if err != nil || strings.TrimSpace(string(out)) != want {
			t.Errorf("%s with the server down: %v %q, want %s", name, err, out, want)
		}
	}
}
