package agent_test

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
	"github.com/orch-dev/orch/internal/agent/agenttest"
	orchctr "github.com/orch-dev/orch/internal/agent/containerd"
	"github.com/orch-dev/orch/internal/loops/loopstest"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
)

// TestPodRunsInContainerd is the end of the seed articles' flow on a real
// node: a pod created through the API is scheduled to the agent's node,
// runs in containerd with an address from the node's pod network, and is
// stopped and cleaned up when deleted.
func TestPodRunsInContainerd(t *testing.T) {
	c, dir := prepareNode(t)
	startAgent := func() (stop func()) { return agenttest.RunAgent(t, c.Server.URL(), c.Server.Token(), dir, "box-1") }

	stopAgent := startAgent()
	defer func() { stopAgent() }()
	waitNodeReady(c, "box-1")
	// What `kubectl describe node` lists of a kubelet that started.
	c.Eventually("the node's events", 10*time.Second, func(ctx context.Context) (bool, error) {
		events := nodeEvents(ctx, c.Client, "box-1")
		for _, reason := range []string{"Starting", "NodeHasSufficientMemory", "NodeHasNoDiskPressure", "NodeHasSufficientPID", "NodeReady"} {
			if _, ok := events[reason]; !ok {
				return false, nil
			}
		}
		return events["NodeReady"] == "Node box-1 status is now: NodeReady", nil
	})
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "sleeper"},
		Spec: corev1.PodSpec{TerminationGracePeriodSeconds: agenttest.PtrTo[int64](2),
			Containers: []corev1.Container{{Name: "main", Image: "busybox:test", Command: []string{"sh", "-c", "while true; do echo tick; sleep 0.1; done"}}}},
	}
	if _, err := c.Client.CoreV1().Pods("default").Create(c.Ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var running *corev1.Pod
	c.Eventually("the pod Running with an address", time.Minute, func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods("default").Get(ctx, "sleeper", metav1.GetOptions{})
		running = p
		return err == nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "", nil
	})
	node, _ := c.Client.CoreV1().Nodes().Get(c.Ctx, "box-1", metav1.GetOptions{})
	if cidr := netip.MustParsePrefix(node.Spec.PodCIDR); !cidr.Contains(netip.MustParseAddr(running.Status.PodIP)) {
		t.Errorf("pod IP %s outside the node's %s", running.Status.PodIP, cidr)
	}
	ctr, err := containerd.New(filepath.Join(dir, "agent", "containerd", "containerd.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ctr.Close() }()
	nsCtx := namespaces.WithNamespace(c.Ctx, orchctr.Namespace)
	task, err := agenttest.LoadTask(nsCtx, ctr, string(running.UID)+"-main")
	if err != nil {
		t.Fatal(err)
	}
	if st, err := task.Status(nsCtx); err != nil || st.Status != containerd.Running {
		t.Fatalf("container status %v %v", st, err)
	}
	pid := task.Pid()

	// A restarted agent adopts the running container: nothing restarts,
	// and its output goes on into the same log.
	stopAgent()
	logged := func() int {
		data, _ := os.ReadFile(filepath.Join(dir, "agent", "pods", string(running.UID), "logs", "main", "0.log"))
		return strings.Count(string(data), " stdout F tick\n")
	}
	linesBefore := logged()
	stopAgent = startAgent()
	c.Eventually("the restarted agent's containerd serving", time.Minute, func(ctx context.Context) (bool, error) {
		c2, err := containerd.New(filepath.Join(dir, "agent", "containerd", "containerd.sock"), containerd.WithTimeout(time.Second))
		if err != nil {
			return false, nil
		}
		defer func() { _ = c2.Close() }()
		ok, _ := c2.IsServing(ctx)
		return ok, nil
	})
	_ = ctr.Close()
	if ctr, err = containerd.New(filepath.Join(dir, "agent", "containerd", "containerd.sock")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the new agent syncs the pod
	task, err = agenttest.LoadTask(nsCtx, ctr, string(running.UID)+"-main")
	if err != nil {
		t.Fatalf("after an agent restart the container is gone: %v", err)
	}
	if task.Pid() != pid {
		t.Fatalf("after an agent restart the container runs as pid %d, was %d", task.Pid(), pid)
	}
	if p, err := c.Client.CoreV1().Pods("default").Get(c.Ctx, "sleeper", metav1.GetOptions{}); err != nil ||
		p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].RestartCount != 0 || p.Status.PodIP != running.Status.PodIP {
		t.Fatalf("after an agent restart: %+v %v", p.Status, err)
	}
	c.Eventually("the adopted container's output logged", time.Minute, func(context.Context) (bool, error) {
		return logged() > linesBefore+5, nil
	})

	// Exits follow the restart policy, as the kubelet's do.
	for _, p := range []struct {
		name, script string
		policy       corev1.RestartPolicy
	}{{"fails", "exit 3", corev1.RestartPolicyNever}, {"done", "exit 0", corev1.RestartPolicyOnFailure}, {"crashes", "sleep 0.2; exit 1", corev1.RestartPolicyAlways}} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.name}, Spec: corev1.PodSpec{RestartPolicy: p.policy, TerminationGracePeriodSeconds: agenttest.PtrTo[int64](1),
			Containers: []corev1.Container{{Name: "main", Image: "busybox:test", Command: []string{"sh", "-c", p.script}}}}}
		if _, err := c.Client.CoreV1().Pods("default").Create(c.Ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	status := func(name string) func(ctx context.Context) (*corev1.Pod, error) {
		return func(ctx context.Context) (*corev1.Pod, error) {
			return c.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		}
	}
	c.Eventually("restartPolicy Never: Failed with exit code 3", time.Minute, func(ctx context.Context) (bool, error) {
		p, err := status("fails")(ctx)
		if err != nil || p.Status.Phase != corev1.PodFailed || len(p.Status.ContainerStatuses) != 1 {
			return false, nil
		}
		term := p.Status.ContainerStatuses[0].State.Terminated
		return term != nil && term.ExitCode == 3 && term.Reason == "Error" && p.Status.ContainerStatuses[0].RestartCount == 0, nil
	})
	c.Eventually("restartPolicy OnFailure, exit 0: Succeeded", time.Minute, func(ctx context.Context) (bool, error) {
		p, err := status("done")(ctx)
		return err == nil && p.Status.Phase == corev1.PodSucceeded, nil
	})
	c.Eventually("restartPolicy Always: restarted, then backing off", time.Minute, func(ctx context.Context) (bool, error) {
		p, err := status("crashes")(ctx)
		if err != nil || len(p.Status.ContainerStatuses) != 1 {
			return false, nil
		}
		cs := p.Status.ContainerStatuses[0]
		last := cs.LastTerminationState.Terminated
		return p.Status.Phase == corev1.PodRunning && cs.RestartCount >= 1 && last != nil && last.ExitCode == 1 &&
			cs.State.Waiting != nil && cs.State.Waiting.Reason == "CrashLoopBackOff", nil
	})
	// An image not on the node: the container waits, saying so.
	missing := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "missing"}, Spec: corev1.PodSpec{TerminationGracePeriodSeconds: agenttest.PtrTo[int64](0),
		Containers: []corev1.Container{{Name: "main", Image: "busybox:test", Command: []string{"sleep", "3600"}}, {Name: "side", Image: "example.com/absent:1"}}}}
	if _, err := c.Client.CoreV1().Pods("default").Create(c.Ctx, missing, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("a missing image reported as ErrImagePull", time.Minute, func(ctx context.Context) (bool, error) {
		p, err := status("missing")(ctx)
		if err != nil || p.Status.Phase != corev1.PodPending || len(p.Status.ContainerStatuses) != 1 {
			return false, nil
		}
		cs := p.Status.ContainerStatuses[0]
		return cs.Name == "side" && cs.Image == "example.com/absent:1" && cs.State.Waiting != nil && cs.State.Waiting.Reason == "ErrImagePull", nil
	})
	// A RuntimeClass whose handler the node has (runc) runs; another's pod
	// stays Pending, its sandbox refused, as a kubelet refuses it.
	for _, rc := range []nodev1.RuntimeClass{{ObjectMeta: metav1.ObjectMeta{Name: "runc"}, Handler: "runc"}, {ObjectMeta: metav1.ObjectMeta{Name: "kata"}, Handler: "kata"}} {
		if _, err := c.Client.NodeV1().RuntimeClasses().Create(c.Ctx, &rc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "class-" + rc.Name}, Spec: corev1.PodSpec{RuntimeClassName: &rc.Name, TerminationGracePeriodSeconds: agenttest.PtrTo[int64](0),
			Containers: []corev1.Container{{Name: "main", Image: "busybox:test", Command: []string{"sleep", "3600"}}}}}
		if _, err := c.Client.CoreV1().Pods("default").Create(c.Ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// A pod bound to the node by its author (never meeting the scheduler)
	// whose host port is taken there is rejected, as a kubelet rejects it.
	port := []corev1.ContainerPort{{ContainerPort: 21017, HostPort: 21017}}
	for _, name := range []string{"port-owner", "port-clash"} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{NodeName: "box-1", TerminationGracePeriodSeconds: agenttest.PtrTo[int64](0),
			Containers: []corev1.Container{{Name: "main", Image: "busybox:test", Command: []string{"sleep", "3600"}, Ports: port}}}}
		if _, err := c.Client.CoreV1().Pods("default").Create(c.Ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if name == "port-owner" {
			c.Eventually("the port's owner running", time.Minute, func(ctx context.Context) (bool, error) {
				p, err := status(name)(ctx)
				return err == nil && p.Status.Phase == corev1.PodRunning, nil
			})
		}
	}
	c.Eventually("the clashing pod rejected", time.Minute, func(ctx context.Context) (bool, error) {
		p, err := status("port-clash")(ctx)
		return err == nil && p.Status.Phase == corev1.PodFailed && p.Status.Reason == "NodePorts" && strings.HasPrefix(p.Status.Message, "Pod was rejected: "), nil
	})
	for _, name := range []string{"port-owner", "port-clash"} {
		if err := c.Client.CoreV1().Pods("default").Delete(c.Ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// activeDeadlineSeconds, lowered on a running pod, ends it as a kubelet
	// does: Failed, DeadlineExceeded, not restarted.
	deadline := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "deadline"}, Spec: corev1.PodSpec{ActiveDeadlineSeconds: agenttest.PtrTo[int64](3600),
		TerminationGracePeriodSeconds: agenttest.PtrTo[int64](0), Containers: []corev1.Container{{Name: "main", Image: "busybox:test", Command: []string{"sleep", "3600"}}}}}
	if _, err := c.Client.CoreV1().Pods("default").Create(c.Ctx, deadline, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("the pod with a deadline running", time.Minute, func(ctx context.Context) (bool, error) {
		p, err := status("deadline")(ctx)
		return err == nil && p.Status.Phase == corev1.PodRunning, nil
	})
	if _, err := c.Client.CoreV1().Pods("default").Patch(c.Ctx, "deadline", types.StrategicMergePatchType, []byte(`{"spec":{"activeDeadlineSeconds":2}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("the pod ended at its deadline", time.Minute, func(ctx context.Context) (bool, error) {
		p, err := status("deadline")(ctx)
		return err == nil && p.Status.Phase == corev1.PodFailed && p.Status.Reason == "DeadlineExceeded", nil
	})
	if err := c.Client.CoreV1().Pods("default").Delete(c.Ctx, "deadline", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// A container name of Kubernetes' full 63 characters fits containerd.
	long := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "long-name"}, Spec: corev1.PodSpec{TerminationGracePeriodSeconds: agenttest.PtrTo[int64](0),
		Containers: []corev1.Container{{Name: strings.Repeat("c", 63), Image: "busybox:test", Command: []string{"sleep", "3600"}}}}}
	if _, err := c.Client.CoreV1().Pods("default").Create(c.Ctx, long, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("the pod with a 63-character container name running", time.Minute, func(ctx context.Context) (bool, error) {
		p, err := status("long-name")(ctx)
		return err == nil && p.Status.Phase == corev1.PodRunning, nil
	})
	c.Eventually("the runc class's pod running", time.Minute, func(ctx context.Context) (bool, error) {
		p, err := status("class-runc")(ctx)
		return err == nil && p.Status.Phase == corev1.PodRunning, nil
	})
	c.Eventually("the kata class's sandbox refused", time.Minute, func(ctx context.Context) (bool, error) {
		events, err := c.Client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=class-kata,reason=FailedCreatePodSandBox"})
		return err == nil && len(events.Items) > 0 && strings.Contains(events.Items[0].Message, `no runtime for "kata" is configured`), nil
	})
	if p, err := status("class-kata")(c.Ctx); err != nil || p.Status.Phase != corev1.PodPending {
		t.Fatalf("the kata class's pod: %v %v", p.Status.Phase, err)
	}
	for _, name := range []string{"class-runc", "class-kata", "long-name"} {
		if err := c.Client.CoreV1().Pods("default").Delete(c.Ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// A deleted pod's last status is terminal before it goes, as a
	// kubelet writes it (a Job's pod failure policy judges it): Succeeded
	// when its containers exit 0 on SIGTERM, Failed when they are killed.
	// A finalizer keeps the pods to be read.
	for name, script := range map[string]string{"stops-clean": "trap 'exit 0' TERM; while true; do sleep 0.1; done", "stops-killed": "trap '' TERM; while true; do sleep 0.1; done"} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Finalizers: []string{"orch.dev/test-keep"}},
			Spec: corev1.PodSpec{TerminationGracePeriodSeconds: agenttest.PtrTo[int64](1),
				Containers: []corev1.Container{{Name: "main", Image: "busybox:test", Command: []string{"sh", "-c", script}}}}}
		if _, err := c.Client.CoreV1().Pods("default").Create(c.Ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		c.Eventually(name+" running", time.Minute, func(ctx context.Context) (bool, error) {
			p, err := status(name)(ctx)
			return err == nil && p.Status.Phase == corev1.PodRunning, nil
		})
		if err := c.Client.CoreV1().Pods("default").Delete(c.Ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for name, want := range map[string]struct {
		phase corev1.PodPhase
		code  int32
	}{"stops-clean": {corev1.PodSucceeded, 0}, "stops-killed": {corev1.PodFailed, 137}} {
		c.Eventually(name+": deleted, terminal, not ready", time.Minute, func(ctx context.Context) (bool, error) {
			p, err := status(name)(ctx)
			if err != nil || p.Status.Phase != want.phase || len(p.Status.ContainerStatuses) != 1 {
				return false, nil
			}
			term := p.Status.ContainerStatuses[0].State.Terminated
			return term != nil && term.ExitCode == want.code && !conditionTrue(p, corev1.PodReady), nil
		})
		patch := []byte(`{"metadata":{"finalizers":null}}`)
		if _, err := c.Client.CoreV1().Pods("default").Patch(c.Ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"fails", "done", "crashes", "missing"} {
		if err := c.Client.CoreV1().Pods("default").Delete(c.Ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	c.Eventually("the other pods gone", time.Minute, func(ctx context.Context) (bool, error) {
		pods, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		return err == nil && len(pods.Items) == 1, nil
	})
	// A pod deleted while its node's agent is down (force-deleted, as
	// kubectl delete --force does) is cleaned up when the agent returns:
	// nothing of it keeps running.
	stopAgent()
	if err := c.Client.CoreV1().Pods("default").Delete(c.Ctx, "sleeper", metav1.DeleteOptions{GracePeriodSeconds: agenttest.PtrTo[int64](0)}); err != nil {
		t.Fatal(err)
	}
	stopAgent = startAgent()
	c.Eventually("the deleted pod's container removed", time.Minute, func(ctx context.Context) (bool, error) {
		c2, err := containerd.New(filepath.Join(dir, "agent", "containerd", "containerd.sock"), containerd.WithTimeout(time.Second))
		if err != nil {
			return false, nil
		}
		defer func() { _ = c2.Close() }()
		containers, err := c2.Containers(nsCtx)
		return err == nil && len(containers) == 0, nil
	})
	_ = ctr.Close()
	if ctr, err = containerd.New(filepath.Join(dir, "agent", "containerd", "containerd.sock")); err != nil {
		t.Fatal(err)
	}
	if containers, _ := ctr.Containers(nsCtx); len(containers) != 0 {
		t.Errorf("containers left after the pod's deletion: %d", len(containers))
	}
	c.Eventually("the deleted pod's network and directory removed", time.Minute, func(ctx context.Context) (bool, error) {
		_, nsErr := os.Stat(filepath.Join(dir, "agent", "run", "netns", string(running.UID)))
		_, dirErr := os.Stat(filepath.Join(dir, "agent", "pods", string(running.UID)))
		return os.IsNotExist(nsErr) && os.IsNotExist(dirErr), nil
	})
}

// conditionTrue reports whether the pod's condition t is True.
func conditionTrue(p *corev1.Pod, t corev1.PodConditionType) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == t {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podsRunning is a condition for Eventually: want of the pods are Running.
func podsRunning(pods typedcorev1.PodInterface, want int) func(context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		l, err := pods.List(ctx, metav1.ListOptions{})
		running := 0
		for _, p := range l.Items {
			if p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		return err == nil && running == want, nil
	}
}

// waitNodeReady waits for the agent's node to report Ready.
func waitNodeReady(c *loopstest.Cluster, name string) {
	c.Eventually("node "+name+" Ready", time.Minute, func(ctx context.Context) (bool, error) {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
}

// nodeEvents are the notes of the events about node, by reason.
func nodeEvents(ctx context.Context, client kubernetes.Interface, node string) map[string]string {
	out := map[string]string{}
	l, err := client.EventsV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
	if err != nil {
		return out
	}
	for _, e := range l.Items {
		if e.Regarding.Kind == "Node" && e.Regarding.Name == node {
			out[e.Reason] = e.Note
		}
	}
	return out
}
