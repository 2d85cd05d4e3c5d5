package agent_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent/agenttest"
	"github.com/orch-dev/orch/internal/api/apitest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestNativeSidecars: an init container with restartPolicy Always is a
// sidecar, as in Kubernetes: the next init container starts once it runs
// and passed its startup probe, it runs beside the pod's containers and
// counts in the pod's readiness, it is restarted when it exits whatever
// the pod's restart policy, and once the containers of a pod that does
// not restart them have ended it is stopped, so that the pod succeeds.
// Its startup probe, `cat`, writes to its stdout: exec probes' output is
// read, as the kubelet reads it (Kubernetes' docs' `cat /tmp/healthy`
// probe failed on orch before).
func TestNativeSidecars(t *testing.T) {
	if testing.Short() {
		t.Skip("runs pods")
	}
	n := startNode(t, "sidecar-node")
	always := corev1.ContainerRestartPolicyAlways
	sidecar := withMount(agenttest.Busybox("sidecar", "echo up > /work/sidecar; trap 'exit 0' TERM; while true; do sleep 1; done"), "work", "/work")
	sidecar.RestartPolicy = &always
	sidecar.StartupProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"cat", "/work/sidecar"}}}, PeriodSeconds: 1}
	sidecar.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}, PeriodSeconds: 1}
	work := []corev1.Volume{{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "served"}, Spec: corev1.PodSpec{Volumes: work,
		InitContainers: []corev1.Container{sidecar, withMount(agenttest.Busybox("after", "test -f /work/sidecar"), "work", "/work")},
		Containers:     []corev1.Container{agenttest.Busybox("app", "sleep 3600")}}})
	var last *corev1.Pod
	defer func() {
		if t.Failed() && last != nil {
			t.Logf("the pod's status: %+v", last.Status)
		}
	}()
	n.Eventually("the pod Ready with its sidecar running", time.Minute, func(ctx context.Context) (bool, error) {
		p := n.pod(ctx, "served")
		last = p
		if len(p.Status.InitContainerStatuses) != 2 || !podReady(p) {
			return false, nil
		}
		side, after := p.Status.InitContainerStatuses[0], p.Status.InitContainerStatuses[1]
		return side.State.Running != nil && side.Ready && side.Started != nil && *side.Started &&
			after.State.Terminated != nil && after.State.Terminated.ExitCode == 0, nil
	})
	k := apitest.NewKubectl(t, n.Server.Kubeconfig)
	k.Run("exec", "served", "-c", "sidecar", "--", "sh", "-c", "kill 1")
	n.Eventually("the sidecar restarted", time.Minute, func(ctx context.Context) (bool, error) {
		p := n.pod(ctx, "served")
		side := p.Status.InitContainerStatuses[0]
		return side.RestartCount >= 1 && side.State.Running != nil && p.Status.Phase == corev1.PodRunning, nil
	})

	// Deleted, the pod's container stops first, then its sidecar.
	out := t.TempDir()
	stopsLast := withMount(agenttest.Busybox("sidecar", "trap 'echo sidecar >> /out/order; exit 0' TERM; while true; do sleep 1; done"), "out", "/out")
	stopsLast.RestartPolicy = &always
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "ordered"}, Spec: corev1.PodSpec{TerminationGracePeriodSeconds: agenttest.PtrTo[int64](20),
		Volumes:        []corev1.Volume{{Name: "out", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: out}}}},
		InitContainers: []corev1.Container{stopsLast},
		Containers:     []corev1.Container{withMount(agenttest.Busybox("app", "trap 'echo app >> /out/order; exit 0' TERM; while true; do sleep 1; done"), "out", "/out")}}})
	n.Eventually("the ordered pod Running", time.Minute, func(ctx context.Context) (bool, error) {
		return podReady(n.pod(ctx, "ordered")), nil
	})
	if err := n.Client.CoreV1().Pods("default").Delete(n.Ctx, "ordered", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	n.Eventually("the ordered pod gone", time.Minute, func(ctx context.Context) (bool, error) {
		_, err := n.Client.CoreV1().Pods("default").Get(ctx, "ordered", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if order, err := os.ReadFile(filepath.Join(out, "order")); err != nil || string(order) != "app\nsidecar\n" {
		t.Errorf("the order the pod's containers stopped in: %v %q", err, order)
	}

	job := sidecar.DeepCopy()
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "job"}, Spec: corev1.PodSpec{Volumes: work, RestartPolicy: corev1.RestartPolicyNever,
		InitContainers: []corev1.Container{*job},
		Containers:     []corev1.Container{agenttest.Busybox("app", "sleep 1")}}})
	n.Eventually("the job-like pod Succeeded, its sidecar stopped", time.Minute, func(ctx context.Context) (bool, error) {
		p := n.pod(ctx, "job")
		return p.Status.Phase == corev1.PodSucceeded && len(p.Status.InitContainerStatuses) == 1 &&
			p.Status.InitContainerStatuses[0].State.Terminated != nil, nil
	})
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
