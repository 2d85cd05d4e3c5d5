package apitest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// KubectlBinary builds stock kubectl from scripts/kubectl (the
// k8s.io/kubectl module at the release its go.mod pins) into .cache/ at
// the repository root, once per release: later runs reuse it.
func KubectlBinary(t testing.TB) string {
	t.Helper()
	return toolBinary(t, "kubectl", `k8s\.io/kubectl v0\.(\d+\.\d+)`, func(m string) string { return "v1." + m }, ".",
		"-X k8s.io/client-go/pkg/version.gitVersion=%[1]s -X k8s.io/component-base/version.gitVersion=%[1]s")
}

// HelmBinary builds stock Helm 3 from scripts/helm (the helm.sh/helm/v3
// module at the release its go.mod pins, as a tool) into .cache/, once
// per release.
func HelmBinary(t testing.TB) string {
	t.Helper()
	return toolBinary(t, "helm", `helm\.sh/helm/v3 v(\d+\.\d+\.\d+)`, func(m string) string { return "v" + m }, "helm.sh/helm/v3/cmd/helm",
		"-X helm.sh/helm/v3/internal/version.version=%[1]s")
}

// Helm4Binary builds stock Helm 4 (server-side apply by default) from
// scripts/helm4 into .cache/, once per release.
func Helm4Binary(t testing.TB) string {
	t.Helper()
	return toolBinary(t, "helm4", `helm\.sh/helm/v4 v(\d+\.\d+\.\d+)`, func(m string) string { return "v" + m }, "helm.sh/helm/v4/cmd/helm",
		"-X helm.sh/helm/v4/internal/version.version=%[1]s")
}

// HelmEnv is the environment of a Helm command against kubeconfig with
// its cache, config and data kept in home, so tests share nothing.
func HelmEnv(home, kubeconfig string) []string {
	return append(os.Environ(), "HOME="+home, "KUBECONFIG="+kubeconfig, "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_DATA_HOME="+filepath.Join(home, "data"))
}

// toolBinary builds the tool name from scripts/<name>, whose go.mod pins
// its release (found by pattern, made a version by release), into
// .cache/<name>-<release>, with ldflags (%[1]s is the release) naming
// its version; later runs reuse it.
func toolBinary(t testing.TB, name, pattern string, release func(string) string, pkg, ldflags string) string {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(root, "scripts", name)
	mod, err := os.ReadFile(filepath.Join(src, "go.mod"))
	if err != nil {
		t.Fatalf("%s's module: %v", name, err)
	}
	m := regexp.MustCompile(pattern).FindSubmatch(mod)
	if m == nil {
		t.Fatalf("scripts/%s/go.mod does not pin %s", name, name)
	}
	version := release(string(m[1]))
	bin := filepath.Join(root, ".cache", name+"-"+version)
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("building %s needs the go tool: %v", name, err)
	}
	tmp := fmt.Sprintf("%s.building-%d", bin, os.Getpid())
	build := exec.Command(goTool, "build", "-trimpath", "-ldflags", "-s -w "+fmt.Sprintf(ldflags, version), "-o", tmp, pkg)
	build.Dir = src
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	t.Logf("building %s %s into %s (once)", name, version, bin)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", name, err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		t.Fatal(err)
	}
	return bin
}

// repoRoot is the nearest directory up from here holding orch's go.mod.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.HasPrefix(string(data), "module github.com/orch-dev/orch\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no orch go.mod above the working directory")
		}
		dir = parent
	}
}

// Kubectl runs the real kubectl against one server, with its own HOME so
// its discovery and OpenAPI caches start empty.
type Kubectl struct {
	t   testing.TB
	Bin string
	env []string
}

// NewKubectl gives a kubectl for the admin kubeconfig at kubeconfig.
func NewKubectl(t testing.TB, kubeconfig string) *Kubectl {
	return &Kubectl{t: t, Bin: KubectlBinary(t), env: append(os.Environ(), "HOME="+t.TempDir(), "KUBECONFIG="+kubeconfig)}
}

// For is k reporting failures to t: a subtest's, so that a failure ends
// the subtest and not its parent.
func (k *Kubectl) For(t testing.TB) *Kubectl {
	c := *k
	c.t = t
	return &c
}

// Command prepares a kubectl run with extra environment variables.
func (k *Kubectl) Command(ctx context.Context, extraEnv []string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, k.Bin, args...)
	cmd.Env = append(append([]string{}, k.env...), extraEnv...)
	return cmd
}

// TryEnv runs kubectl and returns its combined output.
func (k *Kubectl) TryEnv(env []string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := k.Command(ctx, env, args...).CombinedOutput()
	return string(out), err
}

// Try runs kubectl and returns its combined output.
func (k *Kubectl) Try(args ...string) (string, error) { return k.TryEnv(nil, args...) }

// Run runs kubectl and fails the test if it fails.
func (k *Kubectl) Run(args ...string) string {
	k.t.Helper()
	out, err := k.Try(args...)
	if err != nil {
		k.t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}
