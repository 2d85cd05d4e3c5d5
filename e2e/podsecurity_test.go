//go:build e2e

package e2e_test

import (
	"strings"
	"testing"
)

// TestPodSecurityOnARealNode: Pod Security Admission with stock kubectl
// and a real node. A namespace labelled restricted refuses a privileged
// pod and one with the node's root filesystem and network, with
// Kubernetes' messages, and runs a compliant one; labelling a namespace
// tells which of its running pods the new level would refuse; a
// Deployment whose pods would be refused is applied with kubectl's
// "Warning:" line.
func TestPodSecurityOnARealNode(t *testing.T) {
	c := newCluster(t)
	c.addNode("node-a", "198.18.0.111")
	c.mustKubectl("", "create", "namespace", "apps")
	c.mustKubectl("", "label", "namespace", "apps", "pod-security.kubernetes.io/enforce=restricted")

	out, err := c.kubectl("", "run", "priv", "-n", "apps", "--image=busybox:test", "--privileged", "--", "sleep", "3600")
	if err == nil || !strings.Contains(out, `pods "priv" is forbidden: violates PodSecurity "restricted:latest"`) || !strings.Contains(out, "privileged (container \"priv\" must not set securityContext.privileged=true)") {
		t.Errorf("a privileged pod in a restricted namespace: %v\n%s", err, out)
	}
	hostRoot := `apiVersion: v1
kind: Pod
metadata: {name: hostroot, namespace: apps}
spec:
  hostNetwork: true
  containers: [{name: sh, image: busybox:test, command: [sleep, "3600"], volumeMounts: [{name: root, mountPath: /host}]}]
  volumes: [{name: root, hostPath: {path: /}}]
`
	out, err = c.kubectl(hostRoot, "apply", "-f", "-")
	if err == nil || !strings.Contains(out, "host namespaces (hostNetwork=true)") || !strings.Contains(out, `volume "root" uses restricted volume type "hostPath"`) {
		t.Errorf("the node's root filesystem in a restricted namespace: %v\n%s", err, out)
	}
	compliant := `apiVersion: v1
kind: Pod
metadata: {name: ok, namespace: apps}
spec:
  securityContext: {runAsNonRoot: true, runAsUser: 1000, seccompProfile: {type: RuntimeDefault}}
  containers:
  - name: sh
    image: busybox:test
    command: [sh, -c, 'id -u; sleep 3600']
    securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
`
	c.mustKubectl(compliant, "apply", "-f", "-")
	c.mustKubectl("", "wait", "-n", "apps", "--for=condition=Ready", "pod/ok", "--timeout=120s")
	if out := strings.TrimSpace(c.mustKubectl("", "logs", "-n", "apps", "ok")); out != "1000" {
		t.Errorf("the compliant pod runs as %q, want 1000", out)
	}

	// A namespace with a pod already running, locked down afterwards.
	c.mustKubectl("", "create", "namespace", "legacy")
	c.mustKubectl(strings.ReplaceAll(hostRoot, "namespace: apps", "namespace: legacy"), "apply", "-f", "-")
	out = c.mustKubectl("", "label", "namespace", "legacy", "pod-security.kubernetes.io/enforce=baseline")
	if !strings.Contains(out, `Warning: existing pods in namespace "legacy" violate the new PodSecurity enforce level "baseline:latest"`) ||
		!strings.Contains(out, "Warning: hostroot: host namespaces, hostPath volumes") {
		t.Errorf("labelling a namespace with a pod it would refuse:\n%s", out)
	}
	deployment := `apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: legacy}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      hostPID: true
      containers: [{name: web, image: busybox:test, command: [sleep, "3600"]}]
`
	out = c.mustKubectl(deployment, "apply", "-f", "-")
	if !strings.Contains(out, `Warning: would violate PodSecurity "baseline:latest": host namespaces (hostPID=true)`) || !strings.Contains(out, "deployment.apps/web created") {
		t.Errorf("a Deployment whose pods the namespace refuses:\n%s", out)
	}
}
