//go:build e2e

package e2e_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent/agenttest"
)

// servingPair is a CA and a serving certificate it signed for names,
// written as PEM files; it returns their paths and the CA's PEM.
func servingPair(t *testing.T, names ...string) (certFile, keyFile string, caPEM []byte) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "demo-ca"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
}

// TestAggregatedAPI: an extension API server run as a pod, registered
// with an APIService as on Kubernetes (its serving CA in caBundle, a
// RoleBinding to read extension-apiserver-authentication), serves its
// group through orch: kubectl finds it in discovery, lists and gets its
// objects, and the server sees who asked through the front proxy; orch
// authorizes first (a user without rights is refused before the
// proxy). Scaled to zero, the APIService is reported unavailable and its
// clients get 503; one naming a missing Service says so.
func TestAggregatedAPI(t *testing.T) {
	bin := goBinary(t, "./testdata/aggregated")
	c := newCluster(t)
	c.images = map[string]map[string][]byte{"docker.io/library/aggregated:test": {"/bin/aggregated": bin}}
	c.imageCmds = map[string][]string{"docker.io/library/aggregated:test": {"/bin/aggregated"}}
	c.addNode("node-a", "198.18.0.121")

	certFile, keyFile, caPEM := servingPair(t, "demo-api.demo.svc")
	c.mustKubectl("", "create", "namespace", "demo")
	c.mustKubectl("", "create", "secret", "tls", "demo-tls", "-n", "demo", "--cert", certFile, "--key", keyFile)
	c.mustKubectl(`apiVersion: v1
kind: ServiceAccount
metadata: {name: demo-api, namespace: demo}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: demo-api-auth-reader, namespace: kube-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: extension-apiserver-authentication-reader}
subjects: [{kind: ServiceAccount, name: demo-api, namespace: demo}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: demo-api, namespace: demo}
spec:
  selector: {matchLabels: {app: demo-api}}
  template:
    metadata: {labels: {app: demo-api}}
    spec:
      serviceAccountName: demo-api
      terminationGracePeriodSeconds: 0
      containers:
      - {name: api, image: aggregated:test, ports: [{containerPort: 8443}], volumeMounts: [{name: tls, mountPath: /tls}]}
      volumes: [{name: tls, secret: {secretName: demo-tls}}]
---
apiVersion: v1
kind: Service
metadata: {name: demo-api, namespace: demo}
spec:
  selector: {app: demo-api}
  ports: [{port: 443, targetPort: 8443}]
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: v1.demo.orch.test}
spec:
  group: demo.orch.test
  version: v1
  groupPriorityMinimum: 1000
  versionPriority: 15
  service: {namespace: demo, name: demo-api}
  caBundle: `+base64.StdEncoding.EncodeToString(caPEM)+"\n", "apply", "-f", "-")

	c.mustKubectl("", "wait", "--for=condition=Available", "apiservice/v1.demo.orch.test", "--timeout=180s")
	out := c.mustKubectl("", "get", "apiservices")
	for _, want := range []string{"v1.demo.orch.test", "demo/demo-api", "v1.apps ", "Local", "v1.certificates.k8s.io"} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl get apiservices lacks %q:\n%s", want, out)
		}
	}
	// kubectl learns the group from orch's discovery.
	agenttest.Eventually(t, "widgets in kubectl's discovery", func() bool {
		out, _ := c.kubectl("", "api-resources", "--api-group=demo.orch.test")
		return strings.Contains(out, "widgets") && strings.Contains(out, "Widget")
	})
	out = c.mustKubectl("", "get", "widgets", "-n", "demo")
	if !strings.Contains(out, "first") || !strings.Contains(out, "second") {
		t.Errorf("kubectl get widgets:\n%s", out)
	}
	if got := c.mustKubectl("", "get", "widget", "first", "-n", "demo", "-o", "jsonpath={.spec.caller} {.spec.callerGroups}"); !strings.Contains(got, "system:admin") || !strings.Contains(got, "system:masters") {
		t.Errorf("the extension server saw the caller as %q", got)
	}
	out, err := c.kubectl("", "get", "widgets", "-n", "demo", "--as", "jane")
	if err == nil || !strings.Contains(out, `User "jane" cannot list resource "widgets" in API group "demo.orch.test"`) {
		t.Errorf("a user without rights: %v\n%s", err, out)
	}

	// Its pods gone: unavailable, and its clients told so.
	c.mustKubectl("", "scale", "deployment", "demo-api", "-n", "demo", "--replicas=0")
	c.mustKubectl("", "wait", "--for=condition=Available=False", "apiservice/v1.demo.orch.test", "--timeout=120s")
	if reason := c.mustKubectl("", "get", "apiservice", "v1.demo.orch.test", "-o", `jsonpath={.status.conditions[?(@.type=="Available")].reason}`); reason != "MissingEndpoints" {
		t.Errorf("unavailable for reason %q, want MissingEndpoints", reason)
	}
	out, err = c.kubectl("", "get", "--raw", "/apis/demo.orch.test/v1/namespaces/demo/widgets")
	if err == nil || !strings.Contains(out, "ServiceUnavailable") && !strings.Contains(out, "service unavailable") && !strings.Contains(out, "unable to handle the request") {
		t.Errorf("a request to the unavailable group: %v\n%s", err, out)
	}

	// Bad input: a Service that does not exist; a name that is not <version>.<group>.
	c.mustKubectl(`apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: v1.missing.orch.test}
spec: {group: missing.orch.test, version: v1, groupPriorityMinimum: 1000, versionPriority: 15, service: {namespace: demo, name: nowhere}, insecureSkipTLSVerify: true}
`, "apply", "-f", "-")
	agenttest.Eventually(t, "a missing Service reported", func() bool {
		out, _ := c.kubectl("", "get", "apiservice", "v1.missing.orch.test")
		return strings.Contains(out, "False (ServiceNotFound)")
	})
	out, err = c.kubectl(`apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: demo}
spec: {group: demo.orch.test, version: v2, groupPriorityMinimum: 1000, versionPriority: 15, service: {namespace: demo, name: demo-api}}
`, "apply", "-f", "-")
	if err == nil || !strings.Contains(out, "must be `spec.version+\".\"+spec.group`: \"v2.demo.orch.test\"") {
		t.Errorf("a misnamed APIService: %v\n%s", err, out)
	}
}
