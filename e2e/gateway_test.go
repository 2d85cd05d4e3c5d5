//go:build e2e

package e2e_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent/agenttest"
)

// gatewayRoutes put the apps of ingressApps behind two Gateways: edge, at
// its own cluster address, with HTTP and HTTPS (a certificate from a
// Secret), and lan, at an address the user names (node-a's), on 8080.
const gatewayRoutes = `apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge}
spec:
  gatewayClassName: orch
  listeners:
  - {name: http, port: 80, protocol: HTTP}
  - name: https
    port: 443
    protocol: HTTPS
    hostname: a.example
    tls: {certificateRefs: [{name: a-tls}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: lan}
spec:
  gatewayClassName: orch
  addresses: [{type: IPAddress, value: 198.18.0.91}]
  listeners:
  - {name: http, port: 8080, protocol: HTTP}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: site}
spec:
  parentRefs: [{name: edge}, {name: lan}]
  hostnames: [a.example, both.example]
  rules:
  - matches: [{path: {type: PathPrefix, value: /b.txt}}]
    backendRefs: [{name: b, port: 8000}]
  - matches: [{path: {type: PathPrefix, value: /cgi-bin}}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {set: [{name: X-Forwarded-For, value: from-the-route}]}
    backendRefs: [{name: a, port: 80}]
  - backendRefs: [{name: a, port: 80}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: broken}
spec:
  parentRefs: [{name: edge, sectionName: http}]
  hostnames: [broken.example]
  rules:
  - backendRefs: [{name: missing, port: 80}]
`

// TestGateway: the Gateway API as a user drives it with stock kubectl on
// a server and two agents: the server installs the definitions and the
// GatewayClass orch; a Gateway gets its own address and every node
// serves it (HTTP, and HTTPS with a Secret's certificate); a Gateway at
// an address the user names is reached there from outside the cluster;
// statuses say what is served (a route to a missing Service is accepted
// with ResolvedRefs False, and answers 500, as the spec says); an agent
// started again while the server is away serves what it kept.
func TestGateway(t *testing.T) {
	c := newCluster(t)
	nodes := map[string]string{"node-a": "198.18.0.91", "node-b": "198.18.0.92"}
	agents := map[string]*node{}
	for name, ip := range nodes {
		agents[name] = c.addNode(name, ip)
	}
	certFile, keyFile, _ := writeServingCert(t, "a.example")
	c.mustKubectl("", "create", "secret", "tls", "a-tls", "--cert", certFile, "--key", keyFile)
	apps := ingressApps[:strings.Index(ingressApps, "---\napiVersion: networking.k8s.io/v1")]
	c.mustKubectl(apps, "apply", "-f", "-")
	agenttest.Eventually(t, "the GatewayClass orch accepted", func() bool {
		out, err := c.kubectl("", "get", "gatewayclass", "orch", "-o", "jsonpath={.status.conditions[?(@.type==\"Accepted\")].status}")
		return err == nil && out == "True"
	})
	c.mustKubectl(gatewayRoutes, "apply", "-f", "-")
	c.mustKubectl("", "wait", "--for=condition=Available", "deployment", "--all", "--timeout=180s")
	c.mustKubectl("", "wait", "--for=condition=Programmed", "gateway", "--all", "--timeout=60s")
	edge := c.mustKubectl("", "get", "gateway", "edge", "-o", "jsonpath={.status.addresses[0].value}")
	svcIP := c.mustKubectl("", "get", "service", "edge-orch-gateway", "-o", "jsonpath={.spec.clusterIP}")
	if edge == "" || edge != svcIP {
		t.Fatalf("the Gateway's address %q, its Service's cluster IP %q", edge, svcIP)
	}
	if out := c.mustKubectl("", "get", "gateway", "lan"); !strings.Contains(out, "198.18.0.91") || !strings.Contains(out, "True") {
		t.Errorf("kubectl get gateway lan:\n%s", out)
	}
	parents := c.mustKubectl("", "get", "httproute", "site", "-o", "jsonpath={range .status.parents[*]}{.parentRef.name}={.conditions[?(@.type==\"Accepted\")].status},{end}")
	if parents != "edge=True,lan=True," {
		t.Errorf("the route's parents: %q", parents)
	}
	agenttest.Eventually(t, "the broken route's ResolvedRefs", func() bool {
		out, err := c.kubectl("", "get", "httproute", "broken", "-o", "jsonpath={.status.parents[0].conditions[?(@.type==\"ResolvedRefs\")].reason}")
		return err == nil && out == "BackendNotFound"
	})

	// From inside the cluster (a node), at the Gateway's own address.
	curl := func(n *node, args ...string) string {
		out, _ := n.in(append([]string{"curl", "-sS", "--max-time", "5", "-w", " %{http_code}"}, args...)...)
		return strings.TrimSpace(out)
	}
	for _, n := range agents {
		for _, tc := range []struct {
			args []string
			want string
		}{
			{[]string{"-H", "Host: a.example", "http://" + edge + "/"}, "a\n 200"},
			{[]string{"-H", "Host: both.example", "http://" + edge + "/b.txt"}, "b\n 200"},
			{[]string{"-H", "Host: other.example", "http://" + edge + "/"}, "404"},
			{[]string{"-H", "Host: broken.example", "http://" + edge + "/"}, "500"},
			{[]string{"--cacert", certFile, "--resolve", "a.example:443:" + edge, "https://a.example/"}, "a\n 200"},
		} {
			agenttest.Eventually(t, n.name+" "+strings.Join(tc.args, " "), func() bool {
				return strings.HasSuffix(curl(n, tc.args...), tc.want)
			})
		}
		if out := curl(n, "-H", "Host: a.example", "http://"+edge+"/cgi-bin/who"); !strings.Contains(out, "xff=from-the-route") {
			t.Errorf("the route's header filter on %s: %q", n.name, out)
		}
	}

	// From outside the cluster, at the address the user named.
	client := &http.Client{Timeout: 5 * time.Second}
	ask := func(url, host string) (int, error) {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Host = host
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		_ = resp.Body.Close()
		return resp.StatusCode, nil
	}
	agenttest.Eventually(t, "the lan Gateway from outside", func() bool {
		code, err := ask("http://198.18.0.91:8080/", "a.example")
		return err == nil && code == 200
	})
	// The edge Gateway's routes are not at the node's own address.
	if code, err := ask("http://198.18.0.92:80/", "a.example"); err != nil || code != 404 {
		t.Errorf("edge's route at a node's address: %d %v, want the Ingresses' 404", code, err)
	}

	// A Gateway deleted takes its Service along.
	c.mustKubectl("", "delete", "gateway", "lan")
	agenttest.Eventually(t, "the lan Gateway's Service gone", func() bool {
		_, err := c.kubectl("", "get", "service", "lan-orch-gateway")
		return err != nil
	})

	// The server away, node-b's agent started again: served as kept.
	_ = c.serverCmd.Process.Kill()
	_ = c.serverCmd.Wait()
	agents["node-b"].stop()
	agents["node-b"].start()
	agenttest.Eventually(t, "the kept Gateway served with the server away", func() bool {
		return strings.HasSuffix(curl(agents["node-b"], "-H", "Host: a.example", "http://"+edge+"/"), "a\n 200")
	})
}
