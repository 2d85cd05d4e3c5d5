package apitest

import "testing"

// TestBuildTools builds the stock tools the tests drive (kubectl, Helm 3
// and 4) into .cache/ when they are not there yet. scripts/test.sh runs it
// alone before the suite: built there once, not by several test packages
// at the same time, each spending its tests' deadlines on the build.
func TestBuildTools(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kubectl and Helm: not in the unit tier")
	}
	for name, build := range map[string]func(testing.TB) string{"kubectl": KubectlBinary, "helm": HelmBinary, "helm4": Helm4Binary} {
		if bin := build(t); bin == "" {
			t.Errorf("no %s binary", name)
		}
	}
}
