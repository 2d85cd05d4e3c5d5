//go:build e2e

package e2e_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent/agenttest"
	"github.com/orch-dev/orch/internal/api/apitest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestInClusterClients: a client-go program in a pod (rest.InClusterConfig,
// unchanged) reaches the API with its pod's own token: refused (403) as
// an account no Role names, allowed once installed by Helm from a chart
// with its own ServiceAccount, Role and RoleBinding; a pod with
// automountServiceAccountToken: false has no credentials; a token taken
// from a pod is refused once the pod is deleted.
func TestInClusterClients(t *testing.T) {
	helm := apitest.HelmBinary(t)
	lister := goBinary(t, "./testdata/podlister")
	chart, err := filepath.Abs("testdata/charts/podlister")
	if err != nil {
		t.Fatal(err)
	}
	c := newCluster(t)
	c.images = map[string]map[string][]byte{"docker.io/library/podlister:test": {"/bin/podlister": lister}}
	c.imageCmds = map[string][]string{"docker.io/library/podlister:test": {"/bin/podlister"}}
	c.addNode("node-a", "198.18.0.51")
	agenttest.Eventually(t, "node-a Ready", func() bool {
		n, err := c.client.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
		return err == nil && agenttest.NodeReady(n)
	})

	c.mustKubectl("", "run", "unbound", "--image=podlister:test", "--restart=Never", "--overrides", `{"spec":{"terminationGracePeriodSeconds":0}}`)
	c.mustKubectl("", "run", "tokenless", "--image=podlister:test", "--restart=Never", "--overrides",
		`{"spec":{"automountServiceAccountToken":false,"terminationGracePeriodSeconds":0}}`)
	dir := t.TempDir()
	install := exec.Command(helm, "install", "lister", chart, "--wait", "--timeout", "2m")
	install.Env = apitest.HelmEnv(dir, c.kubeconfig)
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	logsSay := func(what, selector, want string) {
		t.Helper()
		var out string
		agenttest.Eventually(t, what, func() bool {
			out, _ = c.kubectl("", "logs", selector, "--tail=3")
			return strings.Contains(out, want)
		})
	}
	logsSay("the chart's client lists pods with its Role", "deployment/lister", "status 200 pods ")
	logsSay("a pod of an account no Role names refused", "pod/unbound", "status 403")
	logsSay("a pod without automounted credentials has none", "pod/tokenless",
		"no credentials: open /var/run/secrets/kubernetes.io/serviceaccount/token: no such file or directory")

	token := strings.TrimSpace(c.mustKubectl("", "exec", "unbound", "--", "cat", "/var/run/secrets/kubernetes.io/serviceaccount/token"))
	ca, err := os.ReadFile(filepath.Join(filepath.Dir(c.kubeconfig), "server", "tls", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	status := func() int {
		req, _ := http.NewRequest("GET", c.url+"/apis/authentication.k8s.io/v1", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			return 0
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	if got := status(); got != 200 {
		t.Fatalf("the pod's token from outside while it runs: %d", got)
	}
	c.mustKubectl("", "delete", "pod", "unbound", "--wait=true")
	agenttest.Eventually(t, "the deleted pod's token refused", func() bool { return status() == 401 })
}
