package agent_test

import (
	"bufio"
	"context"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/snapshots"
	"github.com/orch-dev/orch/internal/agent/agenttest"
	"github.com/orch-dev/orch/internal/api/apitest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestKubectlDebug: `kubectl debug` on a real node, as users debug a pod
// whose image has no shell or tools: an ephemeral container with
// --target sees the target's processes (its PID 1 is the target's
// process), its output is `kubectl logs -c`, it ends for good without
// touching the pod; `kubectl debug -i` attaches to a new one's stdin;
// `kubectl describe` lists them; and one added while an init container
// still runs starts at once, to debug a pod stuck there.
func TestKubectlDebug(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kubectl")
	}
	n := startNode(t, "debug-node")
	k := apitest.NewKubectl(t, n.Server.Kubeconfig)
	target := corev1.Container{Name: "main", Image: "busybox:test", Command: []string{"sleep", "3600"}}
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "app"}, Spec: corev1.PodSpec{Containers: []corev1.Container{target}}})
	n.waitRunning(t, "app")

	k.Run("debug", "app", "--image=busybox:test", "--target=main", "-c", "ps", "--", "ps", "-o", "pid,args")
	n.Eventually("the debug container done", time.Minute, func(ctx context.Context) (bool, error) {
		p := n.pod(ctx, "app")
		return len(p.Status.EphemeralContainerStatuses) == 1 && p.Status.EphemeralContainerStatuses[0].State.Terminated != nil, nil
	})
	out := k.Run("logs", "app", "-c", "ps")
	if !regexp.MustCompile(`(?m)^\s*1 sleep 3600$`).MatchString(out) {
		t.Errorf("ps in the target's process namespace:\n%s", out)
	}
	p := n.pod(n.Ctx, "app")
	if ec := p.Status.EphemeralContainerStatuses[0]; ec.State.Terminated.ExitCode != 0 || ec.RestartCount != 0 || ec.Ready {
		t.Errorf("the ended debug container: %+v", ec)
	}
	if p.Status.Phase != corev1.PodRunning || p.Status.ContainerStatuses[0].RestartCount != 0 || p.Status.ContainerStatuses[0].State.Running == nil {
		t.Errorf("the pod after its debug container ended: %s, %+v", p.Status.Phase, p.Status.ContainerStatuses[0])
	}

	// Interactive, as `kubectl debug -it` without the terminal.
	debug := k.Command(n.Ctx, nil, "debug", "-i", "app", "--image=busybox:test", "--target=main", "-c", "shell", "--", "sh")
	stdin, err := debug.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := debug.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := debug.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(stdin, "echo in $(hostname) with $(pidof sleep)\n"); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	for lines.Scan() && !strings.HasPrefix(lines.Text(), "in ") {
	}
	if lines.Text() != "in app with 1" {
		t.Errorf("kubectl debug -i: %q", lines.Text())
	}
	_, _ = io.WriteString(stdin, "exit\n")
	_ = stdin.Close()
	_, _ = io.Copy(io.Discard, stdout)
	if err := debug.Wait(); err != nil {
		t.Errorf("kubectl debug -i: %v", err)
	}
	if out := k.Run("describe", "pod", "app"); !strings.Contains(out, "Ephemeral Containers:") || !strings.Contains(out, "  shell:") ||
		!strings.Contains(out, "spec.ephemeralContainers{shell}: Started container shell") {
		t.Errorf("kubectl describe pod with ephemeral containers:\n%s", out)
	}

	// A pod stuck in its init container: a debug container runs beside it.
	stuck := agenttest.Busybox("wait", "until [ -e /tmp/go ]; do sleep 0.2; done")
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "stuck"}, Spec: corev1.PodSpec{InitContainers: []corev1.Container{stuck}, Containers: []corev1.Container{target}}})
	n.Eventually("the init container running", time.Minute, func(ctx context.Context) (bool, error) {
		p := n.pod(ctx, "stuck")
		return len(p.Status.InitContainerStatuses) == 1 && p.Status.InitContainerStatuses[0].State.Running != nil, nil
	})
	k.Run("debug", "stuck", "--image=busybox:test", "--target=wait", "-c", "look", "--", "sh", "-c", "ps -o args; sleep 3600")
	n.waitOutput(t, "stuck", "look", "until [ -e /tmp/go ]")
	n.Eventually("the debug container of the pod stuck in init reported", time.Minute, func(ctx context.Context) (bool, error) {
		p := n.pod(ctx, "stuck")
		return len(p.Status.EphemeralContainerStatuses) == 1 && p.Status.EphemeralContainerStatuses[0].State.Running != nil, nil
	})
	if p := n.pod(n.Ctx, "stuck"); p.Status.Phase != corev1.PodPending {
		t.Errorf("debugging a pod stuck in init: %s", p.Status.Phase)
	}
}

// TestImageVolume: an image volume on a real node, as Kubernetes'
// conformance suite tries it: the image's files, read only, in the
// container (pull policy Always, the node air-gapped: its copy); gone,
// view and all, with the pod.
func TestImageVolume(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kubectl")
	}
	n := startNode(t, "image-volume-node")
	k := apitest.NewKubectl(t, n.Server.Kubeconfig)
	main := agenttest.Busybox("main", "sleep 3600")
	main.VolumeMounts = []corev1.VolumeMount{{Name: "tools", MountPath: "/tools"}}
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "reader"}, Spec: corev1.PodSpec{Containers: []corev1.Container{main},
		Volumes: []corev1.Volume{{Name: "tools", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: "busybox:test", PullPolicy: corev1.PullAlways}}}}}})
	n.waitRunning(t, "reader")
	if out := k.Run("exec", "reader", "--", "/tools/bin/busybox", "echo", "from the volume"); out != "from the volume\n" {
		t.Errorf("a program of the image volume: %q", out)
	}
	if out, err := k.Try("exec", "reader", "--", "touch", "/tools/x"); err == nil || !strings.Contains(out, "Read-only file system") {
		t.Errorf("writing to the image volume: %v %s", err, out)
	}
	ctr := agenttest.ContainerdClient(t, n.dir)
	views := func() int {
		count := 0
		ctx := namespaces.WithNamespace(n.Ctx, "orch")
		_ = ctr.SnapshotService("overlayfs").Walk(ctx, func(_ context.Context, info snapshots.Info) error {
			if strings.HasPrefix(info.Name, "image-volume-") {
				count++
			}
			return nil
		})
		return count
	}
	if got := views(); got != 1 {
		t.Errorf("image views while the pod runs: %d", got)
	}
	k.Run("delete", "pod", "reader", "--wait")
	if got := views(); got != 0 {
		t.Errorf("image views after the pod: %d", got)
	}
}
