// Package kubeversion tells which Kubernetes release orch speaks for: the
// version of the k8s.io/api module it is built with, carrying orch's own
// version as semver build metadata (v1.37.2+orch.<version>), as k3s does.
// The API server's /version and every node's kubeletVersion report it, so
// version-skew checks and upgrade tools parse them as Kubernetes versions.
package kubeversion

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"k8s.io/apimachinery/pkg/version"
)

// Info is the /version answer of an orch built at orchVersion.
func Info(orchVersion string) version.Info {
	major, minor, patch := "1", "0", "0"
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range bi.Deps {
			if dep.Path == "k8s.io/api" {
				// k8s.io/api v0.X.Y ships with Kubernetes v1.X.Y.
				parts := strings.SplitN(strings.TrimPrefix(dep.Version, "v0."), ".", 2)
				if len(parts) == 2 {
					minor, patch = parts[0], strings.SplitN(parts[1], "-", 2)[0]
				}
			}
		}
	}
	return version.Info{
		Major: major, Minor: minor,
		GitVersion: fmt.Sprintf("v%s.%s.%s+orch.%s", major, minor, patch, buildMetadata(orchVersion)),
		GitCommit:  orchVersion, GitTreeState: "clean", GoVersion: runtime.Version(), Compiler: runtime.Compiler,
		Platform: runtime.GOOS + "/" + runtime.GOARCH,
	}
}

// buildMetadata is orchVersion as semver build metadata allows it:
// dot-separated identifiers of [0-9A-Za-z-].
func buildMetadata(orchVersion string) string {
	s := strings.Map(func(r rune) rune {
		switch {
		case r >= '0' && r <= '9', r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r == '-', r == '.':
			return r
		}
		return '-'
	}, strings.TrimPrefix(orchVersion, "v"))
	var ids []string
	for _, id := range strings.Split(s, ".") {
		if id != "" {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return "unknown"
	}
	return strings.Join(ids, ".")
}
