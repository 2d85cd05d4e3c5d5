//go:build e2e

package e2e_test

import (
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent/agenttest"
	"github.com/orch-dev/orch/internal/api/apitest"
)

// TestHelmChart: the chart `helm create` makes, installed with stock Helm 3
// on a two-node cluster, passes `helm test` (its test pod wgets the
// Service by name through the cluster DNS). No registry: the images the
// chart names are test images of those names (nginx's a busybox httpd
// on port 80). Then with its autoscaler and its Ingress turned on.
func TestHelmChart(t *testing.T) {
	helm := apitest.HelmBinary(t)
	c := newCluster(t)
	c.images = map[string]map[string][]byte{
		"docker.io/library/nginx:1.16.0":   {"/www/index.html": []byte("<h1>nginx, as tests have it</h1>\n")},
		"docker.io/library/busybox:latest": {},
	}
	c.imageCmds = map[string][]string{"docker.io/library/nginx:1.16.0": {"httpd", "-f", "-p", "80", "-h", "/www"}}
	for name, ip := range map[string]string{"node-a": "198.18.0.41", "node-b": "198.18.0.42"} {
		c.addNode(name, ip)
	}
	dir := t.TempDir()
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(helm, args...)
		cmd.Dir = dir
		cmd.Env = apitest.HelmEnv(dir, c.kubeconfig)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run("create", "demo")
	run("install", "demo", "./demo", "--wait", "--timeout", "3m")
	out := run("test", "demo", "--timeout", "2m")
	if !strings.Contains(out, "Phase:          Succeeded") {
		t.Errorf("helm test demo:\n%s", out)
	}
	// The same chart with its autoscaler (autoscaling/v2), as users turn it on.
	run("upgrade", "demo", "./demo", "--set", "autoscaling.enabled=true", "--wait", "--timeout", "3m")
	hpa, err := exec.Command(apitest.KubectlBinary(t), "--kubeconfig", c.kubeconfig, "get", "hpa", "demo", "-o",
		"jsonpath={.spec.scaleTargetRef.kind}/{.spec.scaleTargetRef.name} {.spec.minReplicas}-{.spec.maxReplicas}").CombinedOutput()
	if err != nil || string(hpa) != "Deployment/demo 1-100" {
		t.Errorf("the chart's autoscaler: %s, %v", hpa, err)
	}
	// And with its Ingress (class left empty: the default, orch's), which
	// serves the page on either node's port 80 by the chart's host.
	run("upgrade", "demo", "./demo", "--set", "ingress.enabled=true", "--wait", "--timeout", "3m")
	for _, ip := range []string{"198.18.0.41", "198.18.0.42"} {
		agenttest.Eventually(t, "the chart's page through its Ingress on "+ip, func() bool {
			req, _ := http.NewRequest(http.MethodGet, "http://"+ip+"/", nil)
			req.Host = "chart-example.local"
			resp, err := (&http.Client{Timeout: 3 * time.Second}).Do(req)
			if err != nil {
				return false
			}
			defer func() { _ = resp.Body.Close() }()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode == 200 && strings.Contains(string(b), "nginx, as tests have it")
		})
	}
}
