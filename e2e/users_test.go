//go:build e2e

package e2e_test

import (
	"encoding/base64"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestUserFromCertificateRequest is Kubernetes' documented way of giving a
// second person access, with openssl and stock kubectl only: she makes a
// key and a request, the admin creates the CertificateSigningRequest and
// approves it, and the kubeconfig made from the issued certificate works
// as her CN, allowed what a RoleBinding gives her and no more. A node's
// request for its own client certificate is approved without anyone; a
// request for system:masters is refused.
func TestUserFromCertificateRequest(t *testing.T) {
	c := newCluster(t)
	dir := t.TempDir()
	openssl := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("openssl", args...).CombinedOutput(); err != nil {
			t.Fatalf("openssl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	request := func(name, subject string) string {
		t.Helper()
		key, csr := filepath.Join(dir, name+".key"), filepath.Join(dir, name+".csr")
		openssl("genrsa", "-out", key, "2048")
		openssl("req", "-new", "-key", key, "-out", csr, "-subj", subject)
		data, err := os.ReadFile(csr)
		if err != nil {
			t.Fatal(err)
		}
		return base64.StdEncoding.EncodeToString(data)
	}
	manifest := func(name, signer, request string, usages ...string) string {
		return "apiVersion: certificates.k8s.io/v1\nkind: CertificateSigningRequest\nmetadata:\n  name: " + name +
			"\nspec:\n  request: " + request + "\n  signerName: " + signer + "\n  expirationSeconds: 86400\n  usages: [" + strings.Join(usages, ", ") + "]\n"
	}

	c.mustKubectl(manifest("jane", "kubernetes.io/kube-apiserver-client", request("jane", "/CN=jane/O=developers"), "client auth"), "apply", "-f", "-")
	if out := c.mustKubectl("", "get", "csr", "jane"); !strings.Contains(out, "kubernetes.io/kube-apiserver-client") || !strings.Contains(out, "Pending") || !strings.Contains(out, "24h") {
		t.Errorf("kubectl get csr before approval:\n%s", out)
	}
	c.mustKubectl("", "certificate", "approve", "jane")
	var cert string
	deadline := time.Now().Add(20 * time.Second)
	for cert == "" && time.Now().Before(deadline) {
		cert = strings.TrimSpace(c.mustKubectl("", "get", "csr", "jane", "-o", "jsonpath={.status.certificate}"))
		time.Sleep(200 * time.Millisecond)
	}
	if cert == "" {
		t.Fatalf("no certificate issued:\n%s", c.mustKubectl("", "get", "csr", "jane", "-o", "yaml"))
	}
	if out := c.mustKubectl("", "get", "csr", "jane"); !strings.Contains(out, "Approved,Issued") {
		t.Errorf("kubectl get csr after approval:\n%s", out)
	}
	pemCert, err := base64.StdEncoding.DecodeString(cert)
	if err != nil {
		t.Fatal(err)
	}
	certFile := filepath.Join(dir, "jane.crt")
	if err := os.WriteFile(certFile, pemCert, 0o600); err != nil {
		t.Fatal(err)
	}
	// Her kubeconfig: the cluster of the admin's, her credentials.
	admin, err := os.ReadFile(c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	jane := &cluster{t: t, kubeconfig: filepath.Join(dir, "jane.yaml")}
	if err := os.WriteFile(jane.kubeconfig, admin, 0o600); err != nil {
		t.Fatal(err)
	}
	jane.mustKubectl("", "config", "set-credentials", "jane", "--client-key", filepath.Join(dir, "jane.key"), "--client-certificate", certFile, "--embed-certs=true")
	jane.mustKubectl("", "config", "set-context", "--current", "--user", "jane")
	if out := jane.mustKubectl("", "auth", "whoami"); !strings.Contains(out, "jane") || !strings.Contains(out, "developers") {
		t.Errorf("kubectl auth whoami with the new kubeconfig:\n%s", out)
	}
	c.mustKubectl("", "create", "namespace", "team")
	if out, err := jane.kubectl("", "get", "pods", "-n", "team"); err == nil || !strings.Contains(out, `User "jane" cannot list resource "pods"`) {
		t.Errorf("before any binding: %v\n%s", err, out)
	}
	c.mustKubectl("", "create", "rolebinding", "jane-edit", "--clusterrole", "edit", "--user", "jane", "-n", "team")
	deadline = time.Now().Add(10 * time.Second)
	for {
		out, err := jane.kubectl("", "create", "configmap", "notes", "-n", "team", "--from-literal", "a=b")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("with the RoleBinding: %v\n%s", err, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, args := range [][]string{{"get", "pods", "-n", "default"}, {"get", "secrets", "-n", "kube-system"}, {"get", "nodes"}, {"certificate", "approve", "jane"}} {
		if out, err := jane.kubectl("", args...); err == nil || !strings.Contains(out, "Forbidden") && !strings.Contains(out, "forbidden") {
			t.Errorf("jane: kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}

	// A node renewing its own client certificate: approved and issued by
	// the server alone.
	c.mustKubectl(manifest("node-edge1", "kubernetes.io/kube-apiserver-client-kubelet", request("edge1", "/CN=system:node:edge1/O=system:nodes"),
		"digital signature", "key encipherment", "client auth"), "--as", "system:node:edge1", "--as-group", "system:nodes", "--as-group", "system:authenticated", "create", "-f", "-")
	deadline = time.Now().Add(20 * time.Second)
	for {
		out := c.mustKubectl("", "get", "csr", "node-edge1")
		if strings.Contains(out, "Approved,Issued") && strings.Contains(out, "system:node:edge1") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a node's own request not approved:\n%s", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Another person's request for system:masters: refused at the door.
	out, err := c.kubectl(manifest("mallory", "kubernetes.io/kube-apiserver-client", request("mallory", "/CN=mallory/O=system:masters"), "client auth"), "create", "-f", "-")
	if err == nil || !strings.Contains(out, "system:masters group is not allowed") {
		t.Errorf("a request for system:masters: %v\n%s", err, out)
	}
}
