//go:build e2e

package e2e_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent/agenttest"
	"github.com/orch-dev/orch/internal/api/apitest"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// kubectl runs stock kubectl against the cluster.
func (c *cluster) kubectl(stdin string, args ...string) (string, error) {
	cmd := exec.Command(apitest.KubectlBinary(c.t), append([]string{"--kubeconfig", c.kubeconfig}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (c *cluster) mustKubectl(stdin string, args ...string) string {
	c.t.Helper()
	out, err := c.kubectl(stdin, args...)
	if err != nil {
		c.t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// ask runs n requests from pod (kubectl exec, busybox wget: under
// timeout, as Debian's busybox wget crashes on its own -T) to url and
// returns the answers' lines.
func (c *cluster) ask(pod, url string, n int) []string {
	c.t.Helper()
	script := fmt.Sprintf(`i=0; while [ $i -lt %d ]; do timeout 3 wget -q -O - %s || echo failed; i=$((i+1)); done`, n, url)
	out := c.mustKubectl("", "exec", pod, "--", "sh", "-c", script)
	return strings.Split(strings.TrimSpace(out), "\n")
}

// answeredBy is the pods (the first word of whoAmI's answers) in lines.
func answeredBy(lines []string) map[string]int {
	by := map[string]int{}
	for _, l := range lines {
		by[strings.Fields(l + " ")[0]]++
	}
	return by
}

// webManifest is a Deployment of four whoAmI pods that keep serving for
// 30 s once told to stop (a preStop sleep), and the Services over them.
const webManifest = `apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 4
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 40
      containers:
      - name: web
        image: busybox:test
        command: [sh, -c, 'mkdir -p /www/cgi-bin; printf "#!/bin/sh\necho Content-Type: text/plain\necho\necho \"\$(hostname) \$REMOTE_ADDR\"\n" > /www/cgi-bin/who; chmod +x /www/cgi-bin/who; exec httpd -f -p 8080 -h /www']
        lifecycle: {preStop: {exec: {command: [sleep, "30"]}}}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec: {selector: {app: web}, ports: [{port: 80, targetPort: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: sticky}
spec: {selector: {app: web}, sessionAffinity: ClientIP, ports: [{port: 80, targetPort: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: local}
spec: {type: NodePort, externalTrafficPolicy: Local, selector: {app: web}, ports: [{port: 80, targetPort: 8080, nodePort: 30090}]}
---
apiVersion: v1
kind: Service
metadata: {name: lb}
spec: {type: LoadBalancer, selector: {app: web}, ports: [{port: 8081, targetPort: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: empty}
spec: {selector: {app: nothing}, ports: [{port: 80, targetPort: 8080}]}
`

// TestServices: Services on a two-node cluster (the VXLAN pod network),
// driven with stock kubectl as a user would: a ClusterIP spreads over all
// four pods from either node, ClientIP affinity sticks, a node port under
// externalTrafficPolicy Local keeps the client's address, a LoadBalancer
// gets the nodes' addresses and answers there, a Service with no
// endpoints refuses at once, a pod reaches itself through its Service, a
// pod reaches the API through the kubernetes Service, scaled-down pods
// that still run stop getting traffic within a second of leaving the
// endpoints, a stopped agent's node keeps its rules and routes, and a
// node deleted from the API leaves the others' routes. Bad input: a node
// port taken twice is refused, a loopback endpoint is refused, a Service
// sent to an address outside the cluster works and breaks no other.
// All of it in both of the service proxy's modes, nftables (the default
// here) and iptables.
func TestServices(t *testing.T) {
	for _, mode := range []string{"nftables", "iptables"} {
		t.Run(mode, func(t *testing.T) { testServices(t, mode) })
	}
}

func testServices(t *testing.T, mode string) {
	probeBin := goBinary(t, "./testdata/apiprobe")
	c := newCluster(t)
	c.agentArgs = []string{"--proxy-mode", mode}
	c.images = map[string]map[string][]byte{"docker.io/library/apiprobe:test": {"/bin/apiprobe": probeBin}}
	ips := map[string]string{"node-a": "198.18.0.21", "node-b": "198.18.0.22"}
	nodes := map[string]*node{}
	for name, ip := range ips {
		nodes[name] = c.addNode(name, ip)
	}
	ctx := context.Background()
	agenttest.Eventually(t, "both nodes Ready", func() bool {
		list, err := c.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil || len(list.Items) != 2 {
			return false
		}
		for _, n := range list.Items {
			if !agenttest.NodeReady(&n) || n.Annotations["flannel.alpha.coreos.com/public-ip"] != ips[n.Name] {
				return false
			}
		}
		return true
	})

	svcIP := func(name string) string {
		svc, err := c.client.CoreV1().Services("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return svc.Spec.ClusterIP
	}
	c.mustKubectl(webManifest, "apply", "-f", "-")
	for name := range ips {
		c.mustKubectl("", "run", "client-"+name, "--image=busybox:test", "--restart=Never", "--overrides",
			fmt.Sprintf(`{"spec":{"nodeName":%q,"terminationGracePeriodSeconds":0}}`, name), "--command", "--", "sleep", "3600")
	}
	ca, err := os.ReadFile(filepath.Join(filepath.Dir(c.kubeconfig), "server", "tls", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	c.mustKubectl("", "run", "apiprobe", "--image=apiprobe:test", "--restart=Never", "--env", "CA_PEM="+string(ca), "--command", "--", "/bin/apiprobe")
	c.mustKubectl(`{"apiVersion":"v1","kind":"Service","metadata":{"name":"hairpin"},"spec":{"selector":{"app":"hairpin"},"ports":[{"port":80,"targetPort":8080}]}}`, "create", "-f", "-")
	hairpinIP := svcIP("hairpin")
	c.mustKubectl(`apiVersion: v1
kind: Pod
metadata: {name: hairpin, labels: {app: hairpin}}
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: main
    image: busybox:test
    command: [sh, -c, 'mkdir -p /www; hostname > /www/name; httpd -p 8080 -h /www; while true; do echo "self $(timeout 2 wget -q -O - http://`+hairpinIP+`/name || echo failed)"; sleep 1; done']
`, "apply", "-f", "-")
	c.mustKubectl("", "wait", "--for=condition=Ready", "pod", "--all", "--timeout=120s")
	webPods := func() map[string]corev1.Pod {
		list, err := c.client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]corev1.Pod{}
		for _, p := range list.Items {
			out[p.Name] = p
		}
		return out
	}
	web := webPods()
	if len(web) != 4 {
		t.Fatalf("%d web pods, want 4", len(web))
	}

	t.Run("cluster IP spreads over every pod from either node", func(t *testing.T) {
		for name := range ips {
			// Pods Ready is not yet their endpoints in every node's rules
			// (the endpoints loop, then each proxy, a second or so later,
			// as in Kubernetes): up to five rounds of 40 requests.
			var seen map[string]int
			for round := 1; round <= 5; round++ {
				seen = answeredBy(c.ask("client-"+name, "http://"+svcIP("web")+"/cgi-bin/who", 40))
				if len(seen) >= len(web) {
					break
				}
				t.Logf("from %s, round %d of 40 requests reached %v", name, round, seen)
				time.Sleep(time.Second)
			}
			for pod := range web {
				if seen[pod] == 0 {
					t.Errorf("from %s, 40 requests never reached %s: %v", name, pod, seen)
				}
			}
		}
	})
	t.Run("ClientIP affinity sticks", func(t *testing.T) {
		if seen := answeredBy(c.ask("client-node-a", "http://"+svcIP("sticky")+"/cgi-bin/who", 20)); len(seen) != 1 {
			t.Errorf("20 requests with ClientIP affinity went to %v, want one pod", seen)
		}
	})
	t.Run("node port under externalTrafficPolicy Local keeps the client's address", func(t *testing.T) {
		for name, ip := range ips {
			var local []string
			for _, p := range web {
				if p.Spec.NodeName == name {
					local = append(local, p.Name)
				}
			}
			if len(local) == 0 {
				continue // this node drops them: no local endpoint
			}
			for range 5 {
				body := httpGet(t, "http://"+ip+":30090/cgi-bin/who")
				fields := strings.Fields(body)
				if len(fields) != 2 || !slices.Contains(local, fields[0]) || fields[1] != "[::ffff:"+c.server+"]" {
					t.Errorf("node port on %s answered %q, want one of its pods %v seeing the client %s", name, body, local, c.server)
				}
			}
		}
	})
	t.Run("LoadBalancer gets the nodes' addresses and answers there", func(t *testing.T) {
		var ingress []string
		agenttest.Eventually(t, "both nodes' addresses in the LoadBalancer's status", func() bool {
			svc, err := c.client.CoreV1().Services("default").Get(ctx, "lb", metav1.GetOptions{})
			ingress = ingress[:0]
			for _, in := range svc.Status.LoadBalancer.Ingress {
				ingress = append(ingress, in.IP)
			}
			slices.Sort(ingress)
			return err == nil && slices.Equal(ingress, []string{ips["node-a"], ips["node-b"]})
		})
		for _, ip := range ingress {
			if body := httpGet(t, "http://"+ip+":8081/cgi-bin/who"); !strings.HasPrefix(body, "web-") {
				t.Errorf("the load balancer's %s:8081 answered %q", ip, body)
			}
		}
	})
	t.Run("a Service with no endpoints refuses at once", func(t *testing.T) {
		start := time.Now()
		out, _ := c.kubectl("", "exec", "client-node-a", "--", "sh", "-c", "timeout 10 wget -q -O - http://"+svcIP("empty")+"/")
		if took := time.Since(start); !strings.Contains(out, "refused") || took > 5*time.Second {
			t.Errorf("after %v: %q, want connection refused at once", took, out)
		}
	})
	t.Run("a pod reaches itself through its Service", func(t *testing.T) {
		agenttest.Eventually(t, "the hairpin pod answered through its Service", func() bool {
			raw, err := c.client.CoreV1().Pods("default").GetLogs("hairpin", &corev1.PodLogOptions{}).DoRaw(ctx)
			return err == nil && strings.Contains(string(raw), "self hairpin\n")
		})
	})
	t.Run("a pod reaches the API through the kubernetes Service", func(t *testing.T) {
		agenttest.Eventually(t, "the probe's answer from the API server", func() bool {
			raw, err := c.client.CoreV1().Pods("default").GetLogs("apiprobe", &corev1.PodLogOptions{}).DoRaw(ctx)
			return err == nil && strings.Contains(string(raw), "status 200 from 10.43.0.1")
		})
	})
	t.Run("bad input", func(t *testing.T) {
		out, err := c.kubectl(`{"apiVersion":"v1","kind":"Service","metadata":{"name":"collide"},"spec":{"type":"NodePort","selector":{"app":"web"},"ports":[{"port":80,"nodePort":30090}]}}`, "create", "-f", "-")
		if err == nil || !strings.Contains(out, "provided port is already allocated") {
			t.Errorf("a node port taken twice: %v %s", err, out)
		}
		out, err = c.kubectl(`{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"loop","labels":{"kubernetes.io/service-name":"web"}},"addressType":"IPv4","endpoints":[{"addresses":["127.0.0.1"]}],"ports":[{"port":22,"protocol":"TCP"}]}`, "create", "-f", "-")
		if err == nil || !strings.Contains(out, "loopback") {
			t.Errorf("a loopback endpoint: %v %s", err, out)
		}
		// A Service without a selector, sent to an address outside the
		// cluster (a listener on the bridge's host), as users point
		// Services at a database elsewhere.
		l, err := net.Listen("tcp", c.server+":0")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = l.Close() }()
		go func() {
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				_, _ = fmt.Fprintf(conn, "HTTP/1.0 200 OK\r\nContent-Length: 8\r\n\r\nforeign\n")
				_ = conn.Close()
			}
		}()
		port := l.Addr().(*net.TCPAddr).Port
		c.mustKubectl(fmt.Sprintf(`{"apiVersion":"v1","kind":"Service","metadata":{"name":"foreign"},"spec":{"ports":[{"port":80,"targetPort":%d}]}}`, port), "create", "-f", "-")
		c.mustKubectl(fmt.Sprintf(`{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"foreign-1","labels":{"kubernetes.io/service-name":"foreign"}},"addressType":"IPv4","endpoints":[{"addresses":[%q]}],"ports":[{"port":%d,"protocol":"TCP"}]}`, c.server, port), "create", "-f", "-")
		agenttest.Eventually(t, "the foreign Service answering from a pod", func() bool {
			out, err := c.kubectl("", "exec", "client-node-b", "--", "sh", "-c", "timeout 2 wget -q -O - http://"+svcIP("foreign")+"/")
			return err == nil && strings.Contains(out, "foreign")
		})
		if seen := answeredBy(c.ask("client-node-b", "http://"+svcIP("web")+"/cgi-bin/who", 8)); seen["failed"] > 0 {
			t.Errorf("web after the bad input: %v", seen)
		}
	})

	t.Run("scaled-down pods stop getting traffic within a second", func(t *testing.T) {
		c.mustKubectl("", "scale", "deployment", "web", "--replicas=2")
		var leaving []string
		agenttest.Eventually(t, "two endpoints ready and two terminating", func() bool {
			leaving = leaving[:0]
			list, err := c.client.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=web"})
			if err != nil {
				return false
			}
			ready := 0
			for _, s := range list.Items {
				for _, e := range s.Endpoints {
					if ptr.Deref(e.Conditions.Ready, false) {
						ready++
					} else if ptr.Deref(e.Conditions.Terminating, false) && e.TargetRef != nil {
						leaving = append(leaving, e.TargetRef.Name)
					}
				}
			}
			return ready == 2 && len(leaving) == 2
		})
		time.Sleep(time.Second)
		seen := answeredBy(c.ask("client-node-a", "http://"+svcIP("web")+"/cgi-bin/who", 30))
		for _, pod := range leaving {
			if seen[pod] > 0 {
				t.Errorf("%s, leaving, answered %d of 30 requests a second after it left the endpoints: %v", pod, seen[pod], seen)
			}
		}
		if seen["failed"] > 0 || len(seen) != 2 {
			t.Errorf("after scaling down to 2: %v", seen)
		}
		// They still run (the preStop sleep): straight to one, it answers.
		if got := c.ask("client-node-a", "http://"+web[leaving[0]].Status.PodIP+":8080/cgi-bin/who", 1); !strings.HasPrefix(got[0], leaving[0]) {
			t.Errorf("%s, leaving, no longer answers by its address (%q): the test proves nothing", leaving[0], got)
		}
	})

	b := nodes["node-b"]
	onB := ""
	for _, p := range webPods() {
		if p.Spec.NodeName == "node-b" && p.DeletionTimestamp == nil {
			onB = p.Name
		}
	}
	t.Run("a stopped agent's node keeps its rules and routes", func(t *testing.T) {
		b.stop()
		// From a pod on node-a, through node-a's rules and the tunnel to
		// node-b's pods; and from node-b itself (its exec API is down
		// with the agent), through node-b's rules.
		if seen := answeredBy(c.ask("client-node-a", "http://"+svcIP("web")+"/cgi-bin/who", 16)); seen["failed"] > 0 || onB != "" && seen[onB] == 0 {
			t.Errorf("from node-a with node-b's agent stopped: %v, want node-b's %s among them", seen, onB)
		}
		fromB := func() map[string]int {
			var lines []string
			for range 8 {
				out, err := b.in("timeout", "3", "busybox", "wget", "-q", "-O", "-", "http://"+svcIP("web")+"/cgi-bin/who")
				if err != nil {
					t.Logf("from node-b: %v: %s", err, out)
					out = "failed"
				}
				lines = append(lines, strings.TrimSpace(out))
			}
			return answeredBy(lines)
		}
		if seen := fromB(); seen["failed"] > 0 {
			t.Errorf("from node-b with its agent stopped: %v", seen)
			out, _ := b.in("iptables-save", "-t", "nat")
			if mode == "nftables" {
				out, _ = b.in("nft", "list", "table", "ip", "kube-proxy")
			}
			routes, _ := b.in("ip", "route")
			t.Logf("node-b's service rules:\n%s\nroutes:\n%s", out, routes)
			for name, p := range webPods() {
				t.Logf("%s on %s at %s", name, p.Spec.NodeName, p.Status.PodIP)
			}
		}
		b.start()
		agenttest.Eventually(t, "node-b's agent back (its kubelet API answering exec)", func() bool {
			_, err := c.kubectl("", "exec", "client-node-b", "--", "true")
			return err == nil
		})
		if seen := answeredBy(c.ask("client-node-b", "http://"+svcIP("web")+"/cgi-bin/who", 16)); seen["failed"] > 0 {
			t.Errorf("from a pod on node-b after its agent restarted: %v", seen)
		}
	})
	t.Run("a node deleted from the API leaves the others' routes", func(t *testing.T) {
		b.stop()
		n, err := c.client.CoreV1().Nodes().Get(ctx, "node-b", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c.mustKubectl("", "delete", "node", "node-b", "--wait=false")
		a := nodes["node-a"]
		agenttest.Eventually(t, "node-b's route, ARP and forwarding entries gone from node-a", func() bool {
			routes, err1 := a.in("ip", "route", "show", n.Spec.PodCIDR)
			neigh, err2 := a.in("ip", "neigh", "show", "dev", "flannel.1")
			fdb, err3 := a.in("bridge", "fdb", "show", "dev", "flannel.1")
			return err1 == nil && err2 == nil && err3 == nil && strings.TrimSpace(routes) == "" &&
				!strings.Contains(neigh, "PERMANENT") && !strings.Contains(fdb, "dst "+ips["node-b"])
		})
	})
	t.Run("the agent restarted in the other mode takes over", func(t *testing.T) {
		a := nodes["node-a"]
		other := map[string]string{"nftables": "iptables", "iptables": "nftables"}[mode]
		a.stop()
		c.agentArgs = []string{"--proxy-mode", other}
		a.start()
		iptablesRules := func() bool { out, _ := a.in("iptables-save", "-t", "nat"); return strings.Contains(out, "KUBE-SVC-") }
		nftTable := func() bool { _, err := a.in("nft", "list", "table", "ip", "kube-proxy"); return err == nil }
		agenttest.Eventually(t, "only the "+other+" mode's rules on node-a", func() bool {
			return iptablesRules() == (other == "iptables") && nftTable() == (other == "nftables")
		})
		agenttest.Eventually(t, "node-a's agent back (its kubelet API answering exec)", func() bool {
			_, err := c.kubectl("", "exec", "client-node-a", "--", "true")
			return err == nil
		})
		// (node-b's pods leave the endpoints as they are collected.)
		agenttest.Eventually(t, "a pod on node-a reaching the Service in the "+other+" mode", func() bool {
			return answeredBy(c.ask("client-node-a", "http://"+svcIP("web")+"/cgi-bin/who", 8))["failed"] == 0
		})
	})
}

// goBinary builds the test program pkg, static, for a test image.
func goBinary(t *testing.T, pkg string) []byte {
	t.Helper()
	bin := filepath.Join(t.TempDir(), filepath.Base(pkg))
	build := exec.Command("go", "build", "-o", bin, pkg)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", pkg, err, out)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// httpGet is GET url's body from the test's host (outside the cluster's
// nodes), within 3 s a try, for up to a minute.
func httpGet(t *testing.T, url string) string {
	t.Helper()
	var body string
	agenttest.Eventually(t, "an answer from "+url, func() bool {
		resp, err := (&http.Client{Timeout: 3 * time.Second}).Get(url)
		if err != nil {
			return false
		}
		defer func() { _ = resp.Body.Close() }()
		b, err := io.ReadAll(bufio.NewReader(resp.Body))
		body = strings.TrimSpace(string(b))
		return err == nil
	})
	return body
}
