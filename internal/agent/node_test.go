package agent

import (
	"errors"
	"strings"
	"testing"

	"github.com/orch-dev/orch/internal/kubeversion"
	corev1 "k8s.io/api/core/v1"
	utilversion "k8s.io/apimachinery/pkg/util/version"
)

// TestNodeReportsKubernetesVersion: a node's kubeletVersion is Kubernetes'
// version with orch's as build metadata, as the API server's /version and
// as k3s reports it, so `kubectl get nodes` and version-skew checks read a
// version (it was "orch-<commit>"). kubeProxyVersion stays empty: it is
// deprecated and Kubernetes' kubelet no longer sets it.
func TestNodeReportsKubernetesVersion(t *testing.T) {
	info := nodeStatus(Config{NodeName: "n1", Version: "e36f2dd", DataDir: t.TempDir()}, runtimeState{}).NodeInfo
	want := kubeversion.Info("e36f2dd").GitVersion
	if info.KubeletVersion != want {
		t.Fatalf("kubelet %q, want %q", info.KubeletVersion, want)
	}
	if _, err := utilversion.ParseSemantic(info.KubeletVersion); err != nil {
		t.Fatal(err)
	}
}

// TestNetworkPolicyCondition: the node says on itself whether it can
// enforce NetworkPolicies, and says nothing when it leaves them to
// another enforcer.
func TestNetworkPolicyCondition(t *testing.T) {
	if _, ok := networkPolicyCondition(Config{DisableNetworkPolicy: true}, func() error { return nil }); ok {
		t.Error("a node run with --disable-network-policy reports the condition")
	}
	c, ok := networkPolicyCondition(Config{}, func() error { return errors.New("the kernel has no ip sets") })
	if !ok || c.Status != corev1.ConditionTrue || c.Reason != "NetworkPolicyUnenforceable" || !strings.Contains(c.Message, "no ip sets") {
		t.Errorf("a kernel without ip sets: %+v", c)
	}
	if c, _ := networkPolicyCondition(Config{}, func() error { return nil }); c.Status != corev1.ConditionFalse {
		t.Errorf("a node that enforces: %+v", c)
	}
}
