//go:build e2e

package e2e_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent/agenttest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// netpolManifest: web pods on both nodes behind a Service in np-web, a
// friend (namespace labelled team=friends) and a stranger, and np-web's
// policies: nothing in but the friends' namespace, on 8080.
const netpolManifest = `apiVersion: v1
kind: Namespace
metadata: {name: np-web}
---
apiVersion: v1
kind: Namespace
metadata: {name: np-friends, labels: {team: friends}}
---
apiVersion: v1
kind: Namespace
metadata: {name: np-others}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: default-deny, namespace: np-web}
spec: {podSelector: {}, policyTypes: [Ingress]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-friends, namespace: np-web}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {team: friends}}}]
    ports: [{port: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: np-web}
spec: {selector: {app: web}, ports: [{port: 80, targetPort: 8080}]}
`

// netpolPod is a busybox pod on a node running script.
func netpolPod(ns, name, node, labels, script string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s, labels: {%s}}
spec:
  nodeName: %s
  terminationGracePeriodSeconds: 0
  containers:
  - name: main
    image: busybox:test
    command: [sh, -c, %q]
`, name, ns, labels, node, script)
}

const webScript = `mkdir -p /www; hostname > /www/name; exec httpd -f -p 8080 -h /www`

// TestNetworkPolicy: NetworkPolicies on a server and two agents, driven
// with stock kubectl. A default-deny namespace admits, by namespace
// label, a friend's pod on either node, by pod address and through the
// Service, and refuses a stranger's, same node and across; an egress
// policy lets the friend reach its web pods and one port of a host
// outside the cluster, nothing else; a pod started in a namespace whose
// policy denies egress is denied from its first command (a pod in a
// namespace without one reaches the same host at once: the control);
// with an agent stopped its node keeps enforcing, and a deleted policy
// stops being enforced; with the server away, an agent started again
// polices its pods from the state it kept.
func TestNetworkPolicy(t *testing.T) {
	c := newCluster(t)
	nodeA := c.addNode("node-a", "198.18.0.101")
	nodeB := c.addNode("node-b", "198.18.0.102")
	ctx := context.Background()
	agenttest.Eventually(t, "both nodes Ready", func() bool {
		list, err := c.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil || len(list.Items) != 2 {
			return false
		}
		for _, n := range list.Items {
			if !agenttest.NodeReady(&n) {
				return false
			}
		}
		return true
	})
	// Each node says it enforces them (a kernel without ip sets would say
	// why not).
	nodes, err := c.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		found := false
		for _, cond := range n.Status.Conditions {
			if cond.Type == "NetworkPolicyUnavailable" {
				found = cond.Status == corev1.ConditionFalse
			}
		}
		if !found {
			t.Errorf("node %s does not say it enforces NetworkPolicies: %+v", n.Name, n.Status.Conditions)
		}
	}
	// A host outside the cluster: two ports of the server's address.
	outside := map[string]string{}
	for _, name := range []string{"allowed", "other"} {
		l, err := net.Listen("tcp", c.server+":0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = fmt.Fprintln(w, "outside-"+name) })}
		go func() { _ = srv.Serve(l) }()
		t.Cleanup(func() { _ = srv.Close() })
		outside[name] = l.Addr().String()
	}

	c.mustKubectl(netpolManifest, "apply", "-f", "-")
	c.mustKubectl(netpolPod("np-web", "web-a", "node-a", "app: web", webScript)+"---\n"+
		netpolPod("np-web", "web-b", "node-b", "app: web", webScript)+"---\n"+
		netpolPod("np-friends", "friend", "node-b", "app: friend", "sleep 3600")+"---\n"+
		netpolPod("np-others", "stranger", "node-a", "app: stranger", "sleep 3600"), "apply", "-f", "-")
	for _, ns := range []string{"np-web", "np-friends", "np-others"} {
		c.mustKubectl("", "wait", "-n", ns, "--for=condition=Ready", "pod", "--all", "--timeout=120s")
	}
	podIP := func(ns, name string) string {
		p, err := c.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p.Status.PodIP
	}
	svc, err := c.client.CoreV1().Services("np-web").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]string{"web-a": podIP("np-web", "web-a") + ":8080", "web-b": podIP("np-web", "web-b") + ":8080",
		"service": svc.Spec.ClusterIP + ":80", "outside": outside["allowed"], "outside-other": outside["other"]}
	// reaches says whether from (namespace/pod) gets an answer from
	// target's /name (or /) within two seconds.
	reaches := func(from, target string) bool {
		ns, pod, _ := strings.Cut(from, "/")
		path := "/name"
		if strings.HasPrefix(target, "outside") {
			path = "/"
		}
		out, err := c.kubectl("", "exec", "-n", ns, pod, "--", "sh", "-c", "timeout 2 wget -q -O - http://"+targets[target]+path)
		return err == nil && strings.TrimSpace(out) != ""
	}
	expect := func(step string, want map[[2]string]bool) {
		t.Helper()
		// Policies take effect within a sync of the change (a second):
		// a pair is checked again until it says what it should, for a
		// while, then reported.
		for pair, allowed := range want {
			deadline := time.Now().Add(10 * time.Second)
			for reaches(pair[0], pair[1]) != allowed {
				if time.Now().After(deadline) {
					t.Errorf("%s: %s -> %s answered %v, want %v", step, pair[0], pair[1], !allowed, allowed)
					break
				}
				time.Sleep(500 * time.Millisecond)
			}
		}
	}
	friend, stranger := "np-friends/friend", "np-others/stranger"
	expect("ingress", map[[2]string]bool{
		{friend, "web-a"}: true, {friend, "web-b"}: true, {friend, "service"}: true,
		{stranger, "web-a"}: false, {stranger, "web-b"}: false, {stranger, "service"}: false,
		{stranger, "outside"}: true})

	c.mustKubectl(fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: egress, namespace: np-friends}
spec:
  podSelector: {}
  policyTypes: [Egress]
  egress:
  - to: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: np-web}}}]
  - to: [{ipBlock: {cidr: %s/32}}]
    ports: [{port: %s}]
`, c.server, strings.Split(outside["allowed"], ":")[1]), "apply", "-f", "-")
	expect("egress", map[[2]string]bool{{friend, "web-a"}: true, {friend, "service"}: true, {friend, "outside"}: true, {friend, "outside-other"}: false})

	t.Run("isolated from the first command", func(t *testing.T) {
		c.mustKubectl(`apiVersion: v1
kind: Namespace
metadata: {name: np-locked}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: no-egress, namespace: np-locked}
spec: {podSelector: {}, policyTypes: [Egress]}
`, "apply", "-f", "-")
		time.Sleep(2 * time.Second) // the nodes see the policy before the pods exist
		script := "if timeout 2 wget -q -O - http://" + outside["allowed"] + "/; then echo REACHED; else echo BLOCKED; fi; sleep 3600"
		for _, ns := range []string{"np-locked", "np-others"} {
			for _, node := range []string{"node-a", "node-b"} {
				c.mustKubectl(netpolPod(ns, "early-"+node, node, "app: early", script), "apply", "-f", "-")
			}
		}
		for _, ns := range []string{"np-locked", "np-others"} {
			for _, node := range []string{"node-a", "node-b"} {
				want := map[string]string{"np-locked": "BLOCKED", "np-others": "outside-allowed"}[ns]
				var logs string
				agenttest.Eventually(t, ns+"/early-"+node+"'s first try", func() bool {
					logs, _ = c.kubectl("", "logs", "-n", ns, "early-"+node)
					return strings.Contains(logs, "BLOCKED") || strings.Contains(logs, "REACHED")
				})
				if !strings.Contains(logs, want) {
					t.Errorf("%s/early-%s's first command: %q, want %s", ns, node, logs, want)
				}
			}
		}
	})

	t.Run("a stopped agent's node keeps enforcing", func(t *testing.T) {
		nodeA.stop()
		expect("agent stopped", map[[2]string]bool{{stranger, "web-a"}: false, {friend, "web-a"}: true})
		nodeA.start()
	})

	c.mustKubectl("", "delete", "-n", "np-web", "networkpolicy", "default-deny", "from-friends")
	expect("policies deleted", map[[2]string]bool{{stranger, "web-a"}: true, {stranger, "web-b"}: true})
	out, _ := nodeA.in("iptables-save", "-t", "filter")
	if strings.Contains(out, "policy np-web/") {
		t.Errorf("node-a keeps the deleted policies' rules:\n%s", out)
	}

	t.Run("the server away, the agent started again", func(t *testing.T) {
		// node-b's own address (its VXLAN end) is no friend of np-web:
		// probed from node-b's network namespace, as kubectl exec needs
		// the server.
		fromNodeB := func() bool {
			out, err := nodeB.in("curl", "-s", "-m", "2", "http://"+targets["web-a"]+"/name")
			return err == nil && strings.TrimSpace(out) == "web-a"
		}
		if !fromNodeB() {
			t.Fatal("node-b does not reach web-a with no policy")
		}
		c.mustKubectl(netpolManifest, "apply", "-f", "-")
		agenttest.Eventually(t, "web-a's policies refusing node-b", func() bool { return !fromNodeB() })
		_ = c.serverCmd.Process.Kill()
		_ = c.serverCmd.Wait()
		nodeA.stop()
		nodeA.start()
		agenttest.Eventually(t, "node-a policing from the state it kept", func() bool {
			log, _ := os.ReadFile(nodeA.logPath)
			return strings.Contains(string(log), "policing pods as the kept state says")
		})
		time.Sleep(2 * time.Second) // its first sync from that state
		if fromNodeB() {
			t.Error("with the server away and node-a's agent started again, web-a's policies are not enforced")
		}
	})
}
