package kubeversion

import (
	"strings"
	"testing"

	utilversion "k8s.io/apimachinery/pkg/util/version"
)

// TestGitVersionIsSemver: what nodes and /version report parses as the
// Kubernetes release it speaks for, whatever orch's own version string is
// (kubectl, Helm's kubeVersion and upgrade tools parse it so).
func TestGitVersionIsSemver(t *testing.T) {
	for _, orch := range []string{"v0.0.0-dev", "v1.2.3", "e36f2dd", "v1.2.3-4-gabc+dirty", "", "..", "v1.0/x y"} {
		info := Info(orch)
		v, err := utilversion.ParseSemantic(info.GitVersion)
		if err != nil {
			t.Fatalf("orch %q: %s is not semver: %v", orch, info.GitVersion, err)
		}
		if v.Major() != 1 || !strings.Contains(info.GitVersion, "+orch.") {
			t.Fatalf("orch %q: %s", orch, info.GitVersion)
		}
		if info.Major != "1" || info.Minor != "37" && info.Minor != "0" {
			t.Fatalf("orch %q: major %q minor %q", orch, info.Major, info.Minor)
		}
	}
}
