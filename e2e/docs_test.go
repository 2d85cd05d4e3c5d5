//go:build e2e

package e2e_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent/agenttest"
	"github.com/orch-dev/orch/internal/api/apitest"
)

// docBlock is one ```sh block of the documentation.
type docBlock struct {
	file   string
	line   int
	script string
	// skip is why it is not run (a <!-- docs-check: skip: why --> line
	// just before it), empty when it is.
	skip string
}

var skipMark = regexp.MustCompile(`^<!-- docs-check: skip: (.+) -->$`)

// docBlocks reads the shell blocks of README.md and docs/*.md.
func docBlocks(t *testing.T) []docBlock {
	files, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	var blocks []docBlock
	for _, name := range append([]string{"../README.md"}, files...) {
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		var cur *docBlock
		skip, n := "", 0
		for sc.Scan() {
			n++
			line := sc.Text()
			switch {
			case cur != nil && strings.HasPrefix(line, "```"):
				blocks = append(blocks, *cur)
				cur = nil
			case cur != nil:
				cur.script += line + "\n"
			case line == "```sh":
				cur = &docBlock{file: strings.TrimPrefix(name, "../"), line: n, skip: skip}
			case strings.TrimSpace(line) != "":
				skip = ""
				if m := skipMark.FindStringSubmatch(line); m != nil {
					skip = m[1]
				}
			}
		}
		_ = f.Close()
		if err := sc.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return blocks
}

// TestDocsCommands: every shell block of README.md and docs/ runs as
// written against a cluster of a server and one node, in order, each
// with bash -e; a block that cannot run here says why just before it
// (<!-- docs-check: skip: why -->). What the docs write for a real
// machine is filled from the test cluster: the paths /etc/orch/orch.yaml
// (the admin kubeconfig) and /var/lib/orch (the server's data dir, also
// ORCH_DATA_DIR), and the placeholders NODE and https://SERVER:6443.
func TestDocsCommands(t *testing.T) {
	c := newCluster(t)
	const nodeName = "docs-node"
	c.addNode(nodeName, "198.18.0.71")
	bin := t.TempDir()
	for name, target := range map[string]string{"orch": c.bin, "kubectl": apitest.KubectlBinary(t)} {
		if err := os.Symlink(target, filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	env := append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "KUBECONFIG="+c.kubeconfig, "ORCH_DATA_DIR="+c.dataDir)
	// The docs speak of a cluster that has been up a little and runs
	// something: its node Ready, a pod running, their first metrics read
	// (every 15 s).
	c.mustKubectl("", "run", "sleeper", "--image=busybox:test", "--restart=Never", "--command", "--", "sleep", "3600")
	agenttest.Eventually(t, "the node's and the pod's metrics served", func() bool {
		_, errNode := c.kubectl("", "top", "node", nodeName)
		_, errPod := c.kubectl("", "top", "pod", "sleeper")
		return errNode == nil && errPod == nil
	})
	fill := strings.NewReplacer("/etc/orch/orch.yaml", c.kubeconfig, "/var/lib/orch", c.dataDir,
		"https://SERVER:6443", c.url, "NODE", nodeName)
	ran := 0
	for _, b := range docBlocks(t) {
		if b.skip != "" {
			t.Logf("%s:%d not run: %s", b.file, b.line, b.skip)
			continue
		}
		cmd := exec.Command("bash", "-euo", "pipefail", "-c", fill.Replace(b.script))
		cmd.Dir, cmd.Env = t.TempDir(), env
		timer := time.AfterFunc(2*time.Minute, func() { _ = cmd.Process.Kill() })
		out, err := cmd.CombinedOutput()
		timer.Stop()
		if err != nil {
			t.Errorf("%s:%d: %v\n%s\n%s", b.file, b.line, err, b.script, out)
			continue
		}
		ran++
	}
	if ran < 5 {
		t.Fatalf("only %d blocks of the docs ran", ran)
	}
}
