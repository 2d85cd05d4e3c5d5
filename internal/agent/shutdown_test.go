package agent_test

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
	"github.com/orch-dev/orch/internal/agent"
	"github.com/orch-dev/orch/internal/agent/agenttest"
	orchctr "github.com/orch-dev/orch/internal/agent/containerd"
	"github.com/orch-dev/orch/internal/agent/shutdown"
	"github.com/orch-dev/orch/internal/agent/shutdown/logindtest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestGracefulNodeShutdown: with a logind on the system bus, the agent
// holds a shutdown delay lock; when the machine begins to shut down it
// reports the node NotReady ("node is shutting down"), rejects new pods,
// stops the regular pods (preStop hook, then SIGTERM) before the critical
// ones, marks each as the kubelet does (Failed, reason Terminated,
// DisruptionTarget by TerminationByKubelet) and only then releases the
// lock. A cancelled shutdown takes the lock again and the node runs pods.
func TestGracefulNodeShutdown(t *testing.T) {
	logind := logindtest.Start(t, 5*time.Second)
	n := startNode(t, "shutting-node", func(c *agent.Config) {
		c.Shutdown = shutdown.Config{GracePeriod: 8 * time.Second, CriticalPodsGracePeriod: 3 * time.Second, Bus: logind.Address, LogindConfDir: logind.ConfDir}
	})
	n.Eventually("the delay lock taken", time.Minute, func(context.Context) (bool, error) {
		held, _ := logind.Held()
		return held == 1, nil
	})
	if logind.Delay() != 8*time.Second {
		t.Fatalf("logind's InhibitDelayMaxSec %v, want the grace period", logind.Delay())
	}
	shared := t.TempDir()
	record := filepath.Join(shared, "stops")
	stopper := func(name, class string) *corev1.Pod {
		c := agenttest.Busybox("main", "trap 'echo "+name+"-term >> /shared/stops; exit 0' TERM; echo up; while true; do sleep 0.2; done")
		c.Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c", "echo " + name + "-prestop >> /shared/stops"}}}}
		c.VolumeMounts = []corev1.VolumeMount{{Name: "shared", MountPath: "/shared"}}
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{
			PriorityClassName: class, TerminationGracePeriodSeconds: agenttest.PtrTo[int64](30), Containers: []corev1.Container{c},
			Volumes: []corev1.Volume{{Name: "shared", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: shared}}}}}}
	}
	n.create(t, stopper("web", ""))
	n.create(t, stopper("agent-critical", "system-node-critical"))
	for _, name := range []string{"web", "agent-critical"} {
		n.waitRunning(t, name)
		n.waitOutput(t, name, "main", "up")
	}

	logind.PrepareForShutdown(t, true)
	n.Eventually("the node NotReady for its shutdown", time.Minute, func(ctx context.Context) (bool, error) {
		node, err := n.Client.CoreV1().Nodes().Get(ctx, "shutting-node", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionFalse && c.Reason == "KubeletNotReady" && c.Message == "node is shutting down", nil
			}
		}
		return false, nil
	})
	for _, name := range []string{"web", "agent-critical"} {
		n.Eventually(name+" terminated for the shutdown", time.Minute, func(ctx context.Context) (bool, error) {
			return n.pod(ctx, name).Status.Phase == corev1.PodFailed, nil
		})
		p := n.pod(n.Ctx, name)
		var target *corev1.PodCondition
		for i, c := range p.Status.Conditions {
			if c.Type == corev1.DisruptionTarget {
				target = &p.Status.Conditions[i]
			}
		}
		if p.Status.Reason != "Terminated" || p.Status.Message != "Pod was terminated in response to imminent node shutdown." ||
			target == nil || target.Status != corev1.ConditionTrue || target.Reason != "TerminationByKubelet" {
			t.Errorf("%s: status %q %q, DisruptionTarget %+v", name, p.Status.Reason, p.Status.Message, target)
		}
	}
	n.Eventually("the delay lock released", time.Minute, func(context.Context) (bool, error) {
		held, _ := logind.Held()
		return held == 0, nil
	})
	stops, _ := os.ReadFile(record)
	if got := strings.Fields(string(stops)); strings.Join(got, " ") != "web-prestop web-term agent-critical-prestop agent-critical-term" {
		t.Errorf("stopped in the order %q, want the regular pod (preStop, then SIGTERM) before the critical one", got)
	}
	if ev := nodeEvents(n.Ctx, n.Client, "shutting-node")["Shutdown"]; ev != "Shutdown manager detected shutdown event" {
		t.Errorf("the node's Shutdown event: %q", ev)
	}
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "late"}, Spec: corev1.PodSpec{NodeName: "shutting-node", Containers: []corev1.Container{agenttest.Busybox("main", "sleep 3600")}}})
	n.Eventually("a pod arriving during the shutdown rejected", time.Minute, func(ctx context.Context) (bool, error) {
		p := n.pod(ctx, "late")
		return p.Status.Phase == corev1.PodFailed && p.Status.Reason == "NodeShutdown" &&
			p.Status.Message == "Pod was rejected: Pod was rejected as the node is shutting down.", nil
	})

	logind.PrepareForShutdown(t, false)
	n.Eventually("the lock taken again", time.Minute, func(context.Context) (bool, error) {
		held, taken := logind.Held()
		return held == 1 && taken == 2, nil
	})
	waitNodeReady(n.Cluster, "shutting-node")
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "after"}, Spec: corev1.PodSpec{Containers: []corev1.Container{agenttest.Busybox("main", "sleep 3600")}}})
	n.waitRunning(t, "after")
}

// TestGracefulShutdownOffline: a board that shuts down while its server is
// away stops its pods all the same, within the grace period (their
// reports cannot get through, and are not waited for long), and after it
// boots with the server still away it runs them again from its
// checkpoint: the pods were never ended as far as the cluster knows. A
// pod's service-account token, lost with the reboot, comes back with the
// server.
func TestGracefulShutdownOffline(t *testing.T) {
	logind := logindtest.Start(t, 5*time.Second)
	c, dir := prepareNode(t)
	server, _ := url.Parse(c.Server.URL())
	l := newLink(t, server.Host)
	start := func() (stop func()) {
		return agenttest.RunAgent(t, "https://"+l.addr, c.Server.Token(), dir, "edge", func(c *agent.Config) {
			c.Shutdown = shutdown.Config{GracePeriod: 6 * time.Second, CriticalPodsGracePeriod: 2 * time.Second, Bus: logind.Address, LogindConfDir: logind.ConfDir}
		})
	}
	stop := start()
	defer func() { stop() }()
	waitNodeReady(c, "edge")
	pods := c.Client.CoreV1().Pods("default")
	if _, err := pods.Create(c.Ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "keeper"}, Spec: corev1.PodSpec{TerminationGracePeriodSeconds: agenttest.PtrTo[int64](1),
		Containers: []corev1.Container{agenttest.Busybox("main", "sleep 3600")}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("keeper Running", time.Minute, func(ctx context.Context) (bool, error) {
		p, err := pods.Get(ctx, "keeper", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning, nil
	})
	keeper, _ := pods.Get(c.Ctx, "keeper", metav1.GetOptions{})
	c.Eventually("the delay lock taken", time.Minute, func(context.Context) (bool, error) {
		held, _ := logind.Held()
		return held == 1, nil
	})
	ctr := agenttest.ContainerdClient(t, dir)
	nsCtx := namespaces.WithNamespace(context.Background(), orchctr.Namespace)
	id := string(keeper.UID) + "-main"

	l.cut()
	began := time.Now()
	logind.PrepareForShutdown(t, true)
	c.Eventually("the delay lock released", time.Minute, func(context.Context) (bool, error) {
		held, _ := logind.Held()
		return held == 0, nil
	})
	// Within the grace period and a report's time, not a client's
	// timeouts against a server that is away.
	if took := time.Since(began); took > 15*time.Second {
		t.Errorf("the shutdown took %v offline", took)
	}
	if _, err := agenttest.LoadTask(nsCtx, ctr, id); err == nil {
		t.Fatal("keeper still runs after the shutdown")
	}

	// The machine boots with the server still away.
	stop()
	stop = start()
	c.Eventually("keeper running again from the checkpoint", time.Minute, func(context.Context) (bool, error) {
		ctrAfter, err := containerd.New(filepath.Join(dir, "agent", "containerd", "containerd.sock"))
		if err != nil {
			return false, nil
		}
		defer func() { _ = ctrAfter.Close() }()
		return agenttest.TaskRunning(nsCtx, ctrAfter, id), nil
	})
	// Its service-account token, which no reboot keeps (tokens never touch
	// the disk) and no server could give, is empty until the server is
	// back, then comes.
	var volume string
	for _, v := range keeper.Spec.Volumes {
		if strings.HasPrefix(v.Name, "kube-api-access-") {
			volume = v.Name
		}
	}
	token := filepath.Join(dir, "agent", "pods", string(keeper.UID), "volumes", volume, "token")
	if b, err := os.ReadFile(token); err != nil || len(b) != 0 {
		t.Errorf("the token offline: %q %v, want an empty file", b, err)
	}
	l.restore(t)
	waitNodeReady(c, "edge")
	c.Eventually("keeper Ready on the server, the same pod", time.Minute, func(ctx context.Context) (bool, error) {
		p, err := pods.Get(ctx, "keeper", metav1.GetOptions{})
		return err == nil && p.UID == keeper.UID && p.Status.Phase == corev1.PodRunning && hasCondition(p, corev1.PodReady), nil
	})
	c.Eventually("the token once the server is back", time.Minute, func(context.Context) (bool, error) {
		b, err := os.ReadFile(token)
		return err == nil && strings.Count(string(b), ".") == 2, nil // a JWT
	})
}
