package agent_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestPodsShareShims: a node's pods run in a few containerd shims, not one
// each (30 shims cost a board 88 MB), and a pod's containers in the same
// one, as the CRI plugin runs a pod's.
func TestPodsShareShims(t *testing.T) {
	n := startNode(t, "shims")
	const pods = 10
	for i := range pods {
		containers := []corev1.Container{{Name: "main", Image: "busybox:test", Command: []string{"sleep", fmt.Sprint(424200 + i)}}}
		if i == 0 {
			containers = append(containers, corev1.Container{Name: "second", Image: "busybox:test", Command: []string{"sleep", "424199"}})
		}
		n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", i)}, Spec: corev1.PodSpec{Containers: containers}})
	}
	n.Eventually("the pods Running", 2*time.Minute, podsRunning(n.Client.CoreV1().Pods("default"), pods))
	// The node's shims name its containerd's socket, under its data dir.
	out, _ := exec.Command("pgrep", "-f", "containerd-shim-runc-v2 .*"+filepath.Join(n.dir, "agent")).Output()
	shims := strings.Fields(string(out))
	if len(shims) == 0 || len(shims) > 4 {
		t.Fatalf("%d pods run in %d shims, want 1 to 4", pods, len(shims))
	}
	parent := func(command string) string {
		out, err := exec.Command("pgrep", "-f", "^"+command+"$").Output()
		pids := strings.Fields(string(out))
		if err != nil || len(pids) != 1 {
			t.Fatalf("pgrep %q: %v %v", command, pids, err)
		}
		status, err := os.ReadFile(filepath.Join("/proc", pids[0], "status"))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(status), "\n") {
			if ppid, ok := strings.CutPrefix(line, "PPid:"); ok {
				return strings.TrimSpace(ppid)
			}
		}
		t.Fatalf("no PPid in /proc/%s/status", pids[0])
		return ""
	}
	if main, second := parent("sleep 424200"), parent("sleep 424199"); main != second {
		t.Errorf("one pod's containers in two shims: pids %s and %s", main, second)
	} else if !slices.Contains(shims, main) {
		t.Errorf("the pod's containers' parent %s is none of the node's shims %v", main, shims)
	}
}
