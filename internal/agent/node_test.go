package agent

import (
	"testing"

	"github.com/orch-dev/orch/internal/kubeversion"
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
