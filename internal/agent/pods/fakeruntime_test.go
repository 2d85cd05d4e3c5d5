package pods

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	orchctr "github.com/orch-dev/orch/internal/agent/containerd"
	"github.com/orch-dev/orch/internal/agent/logs"
	"github.com/orch-dev/orch/internal/iptables"
	"github.com/orch-dev/orch/internal/loops/controllertest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// The tests in this file run the pod manager on a fake container runtime
// and a fake API: no root, no containerd, milliseconds a step. The
// agent's tests run the same paths on real containerd and runc.

const fakeImage = "docker.io/library/busybox:test"

var podsGVR = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

// fakePod is a pod these tests can run without root: on the node's
// network and IPC namespace, so that no namespace is made.
func fakePod(name string, containers ...string) *corev1.Pod {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name + "-uid")},
		Spec: corev1.PodSpec{NodeName: "n1", HostNetwork: true, HostIPC: true, TerminationGracePeriodSeconds: ptr.To[int64](1)}}
	for _, c := range containers {
		pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: c, Image: "busybox:test", ImagePullPolicy: corev1.PullIfNotPresent})
	}
	return pod
}

type fakeNode struct {
	api *controllertest.Fake
	rt  *orchctr.Fake
	m   *Manager
	ctx context.Context
}

// newFakeNode is a Manager for node n1 on a fake runtime that has the
// test image, serving objs; run starts it.
func newFakeNode(t *testing.T, objs ...*corev1.Pod) *fakeNode {
	t.Helper()
	var stored []runtime.Object
	for _, o := range objs {
		stored = append(stored, o)
	}
	api := controllertest.New(t, stored...)
	rt := orchctr.NewFake()
	t.Cleanup(rt.Close) // after the manager has stopped
	rt.AddImage(fakeImage)
	m, err := New(Config{API: api.Client, Runtime: rt, Node: "n1", NodeIP: "192.0.2.10", NodeHostname: "n1",
		PodCIDR: "10.42.0.0/24", DataDir: t.TempDir(), Events: api.Events, IPTables: iptables.NewFake()})
	if err != nil {
		t.Fatal(err)
	}
	return &fakeNode{api: api, rt: rt, m: m}
}

// run runs the manager until the test ends.
func (n *fakeNode) run(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.m.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	n.ctx = ctx
}

func (n *fakeNode) pod(name string) *corev1.Pod {
	obj := n.api.Get(podsGVR, "default", name)
	if obj == nil {
		return nil
	}
	return obj.(*corev1.Pod)
}

// eventually polls cond every 10 ms for up to 10 s (the fakes answer in
// microseconds: a step that takes longer is a failure).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func statusOf(p *corev1.Pod, name string) *corev1.ContainerStatus {
	if p == nil {
		return nil
	}
	for i := range p.Status.ContainerStatuses {
		if p.Status.ContainerStatuses[i].Name == name {
			return &p.Status.ContainerStatuses[i]
		}
	}
	return nil
}

// TestRunContainerOnFakeRuntime: a pod's container is created from its
// image and started, its output goes to its log, the pod is reported
// Running and Ready; an exit restarts it (Always, the first restart at
// once, as the kubelet's back-off starts after it), with the exit as its
// last state and the restart counted.
func TestRunContainerOnFakeRuntime(t *testing.T) {
	n := newFakeNode(t, fakePod("web", "app"))
	n.run(t)
	id := "web-uid-app"
	eventually(t, "the container running", func() bool { return n.rt.Running(id) })
	eventually(t, "the pod Running and Ready", func() bool {
		p := n.pod("web")
		cs := statusOf(p, "app")
		return p.Status.Phase == corev1.PodRunning && cs != nil && cs.Ready && cs.State.Running != nil &&
			cs.ContainerID == "containerd://"+id && cs.ImageID == "docker.io/library/busybox@"+fakeDigestOf(n, fakeImage)
	})
	c, err := n.rt.Container(context.Background(), id)
	if err != nil || c.Labels[podUIDLabel] != "web-uid" || c.Image != fakeImage {
		t.Fatalf("container %+v, %v: want labelled with its pod's UID, from %s", c, err, fakeImage)
	}

	if err := n.rt.Output(id, "hello from app\n"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the output in the container's log", func() bool {
		var out bytes.Buffer
		err := n.m.ContainerLog(context.Background(), LogRequest{Namespace: "default", Pod: "web", Container: "app", Options: logs.Options{Tail: -1}}, &out)
		return err == nil && out.String() == "hello from app\n"
	})

	if err := n.rt.Exit(id, 3); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the container restarted, its exit its last state", func() bool {
		cs := statusOf(n.pod("web"), "app")
		return cs != nil && cs.RestartCount == 1 && cs.State.Running != nil &&
			cs.LastTerminationState.Terminated != nil && cs.LastTerminationState.Terminated.ExitCode == 3 &&
			cs.LastTerminationState.Terminated.Reason == "Error"
	})
	if !n.rt.Running(id) {
		t.Error("the restarted container is not running")
	}
	for _, want := range []string{"Normal Pulled", "Normal Created", "Normal Started"} {
		if !hasEvent(n.api.Events.List(), want) {
			t.Errorf("no %q event in %q", want, n.api.Events.List())
		}
	}
}

func fakeDigestOf(n *fakeNode, ref string) string {
	img, err := n.rt.Image(context.Background(), ref)
	if err != nil {
		return ""
	}
	return img.Target().Digest.String()
}

func hasEvent(events []string, prefix string) bool {
	for _, e := range events {
		if strings.HasPrefix(e, prefix) {
			return true
		}
	}
	return false
}

// TestStartErrorOnFakeRuntime: a process that cannot start (here the
// runtime refuses it, as runc refuses a missing binary) is reported as
// the kubelet reports it: terminated, StartError, exit code 128 and the
// runtime's message, a Warning event; with restartPolicy Never the pod
// fails.
func TestStartErrorOnFakeRuntime(t *testing.T) {
	pod := fakePod("job", "main")
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	n := newFakeNode(t, pod, fakePod("always", "main"))
	n.rt.StartError = func(string) error {
		return errors.New(`exec: "/no/such/binary": stat /no/such/binary: no such file or directory`)
	}
	n.run(t)
	eventually(t, "the pod Failed with a StartError", func() bool {
		p := n.pod("job")
		cs := statusOf(p, "main")
		return p.Status.Phase == corev1.PodFailed && cs != nil && cs.State.Terminated != nil &&
			cs.State.Terminated.Reason == "StartError" && cs.State.Terminated.ExitCode == 128 &&
			strings.Contains(cs.State.Terminated.Message, "/no/such/binary")
	})
	if !hasEvent(n.api.Events.List(), "Warning Failed") {
		t.Errorf("no Warning Failed event in %q", n.api.Events.List())
	}
	// With Always it starts again, under the crash-loop back-off: once at
	// once, then not for 10 s.
	eventually(t, "the Always pod backing off", func() bool {
		cs := statusOf(n.pod("always"), "main")
		return cs != nil && cs.RestartCount == 1 && hasEvent(n.api.Events.List(), "Warning BackOff Back-off restarting failed container main in pod always")
	})
	if cs := statusOf(n.pod("always"), "main"); cs.RestartCount != 1 {
		t.Errorf("restarted %d times within the first back-off", cs.RestartCount)
	}
}

// TestAdoptOnFakeRuntime: an agent that starts while its pods' containers
// run (they outlived the last agent in their shims) takes them over: it
// creates and starts nothing, keeps the restart count the API has, and
// handles a later exit like any other.
func TestAdoptOnFakeRuntime(t *testing.T) {
	pod := fakePod("kept", "app")
	startedAt := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, StartTime: &startedAt,
		Conditions: []corev1.PodCondition{{Type: corev1.PodInitialized, Status: corev1.ConditionTrue}},
		ContainerStatuses: []corev1.ContainerStatus{{Name: "app", Ready: true, RestartCount: 2, Image: "busybox:test",
			ContainerID: "containerd://kept-uid-app", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: startedAt}}}}}
	n := newFakeNode(t, pod)
	// What the last agent left: the container and its running task.
	ctx := context.Background()
	img, err := n.rt.Image(ctx, fakeImage)
	if err != nil {
		t.Fatal(err)
	}
	id := "kept-uid-app"
	if err := n.rt.Create(ctx, id, img, nil, map[string]string{podUIDLabel: "kept-uid"}); err != nil {
		t.Fatal(err)
	}
	fifoDir := n.m.fifoDirUID("kept-uid")
	logPath := n.m.logPath("kept-uid", "app", 2)
	for _, dir := range []string{fifoDir, filepath.Dir(logPath)} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	lastAgentsLog, err := logs.NewWriter(logPath, maxLogSize)
	if err != nil {
		t.Fatal(err)
	}
	task, err := n.rt.NewTask(ctx, id, newContainerIO(fifoDir, lastAgentsLog, streams{}))
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Start(ctx); err != nil {
		t.Fatal(err)
	}
	task.IO().(*containerIO).detach() // the last agent exits; the shim keeps the FIFOs
	_ = lastAgentsLog.Close()
	n.api.Writes()
	n.run(t)
	eventually(t, "the pod adopted and reported", func() bool {
		n.m.mu.Lock()
		_, adopted := n.m.running["kept-uid"]
		n.m.mu.Unlock()
		return adopted && len(controllertest.Only(n.api.Writes(), "update", "pods")) > 0
	})
	cs := statusOf(n.pod("kept"), "app")
	if cs == nil || cs.RestartCount != 2 || cs.State.Running == nil || !cs.State.Running.StartedAt.Equal(&startedAt) || !cs.Ready {
		t.Fatalf("adopted container's status %+v: want running since %v, ready, restarted twice", cs, startedAt)
	}
	// Its output goes on to the same log, through the FIFOs it kept.
	if err := n.rt.Output(id, "still here\n"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the adopted container's output in its log", func() bool {
		var out bytes.Buffer
		err := n.m.ContainerLog(context.Background(), LogRequest{Namespace: "default", Pod: "kept", Container: "app", Options: logs.Options{Tail: -1}}, &out)
		return err == nil && out.String() == "still here\n"
	})
	if hasEvent(n.api.Events.List(), "Normal Created") || hasEvent(n.api.Events.List(), "Normal Started") {
		t.Errorf("adoption created or started a container: %q", n.api.Events.List())
	}

	if err := n.rt.Exit(id, 1); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the adopted container restarted after its exit", func() bool {
		cs := statusOf(n.pod("kept"), "app")
		return cs != nil && cs.RestartCount == 3 && cs.State.Running != nil && cs.LastTerminationState.Terminated != nil &&
			cs.LastTerminationState.Terminated.ExitCode == 1
	})
}

// TestDeletedPodOnFakeRuntime: a pod being deleted has its containers
// stopped (SIGTERM first) and removed, then its deletion confirmed.
func TestDeletedPodOnFakeRuntime(t *testing.T) {
	n := newFakeNode(t, fakePod("gone", "app"))
	n.run(t)
	id := "gone-uid-app"
	eventually(t, "the container running", func() bool { return n.rt.Running(id) })
	if err := n.api.Client.Pods("default").Delete(context.Background(), "gone", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the pod's deletion confirmed", func() bool { return n.pod("gone") == nil })
	if _, err := n.rt.Container(context.Background(), id); err == nil {
		t.Error("the deleted pod's container is still there")
	}
	if !hasEvent(n.api.Events.List(), "Normal Killing") {
		t.Errorf("no Killing event in %q", n.api.Events.List())
	}
}

// TestContainerdAwayOnFakeRuntime: containerd going away cuts the waits on
// the containers, which run on in their shims; that is no exit. An exit
// while it is away is taken once it is back, as the container's own.
func TestContainerdAwayOnFakeRuntime(t *testing.T) {
	n := newFakeNode(t, fakePod("steady", "app", "other"))
	n.run(t)
	app, other := "steady-uid-app", "steady-uid-other"
	eventually(t, "both containers running", func() bool { return n.rt.Running(app) && n.rt.Running(other) })
	n.rt.Down()
	if err := n.rt.Exit(app, 4); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the manager tries to reach it meanwhile
	n.rt.Up()
	eventually(t, "app's exit while containerd was away taken, app restarted", func() bool {
		cs := statusOf(n.pod("steady"), "app")
		return cs != nil && cs.RestartCount == 1 && cs.LastTerminationState.Terminated != nil &&
			cs.LastTerminationState.Terminated.ExitCode == 4 && cs.State.Running != nil
	})
	if cs := statusOf(n.pod("steady"), "other"); cs == nil || cs.RestartCount != 0 || cs.State.Running == nil || !n.rt.Running(other) {
		t.Errorf("other, which ran on, was taken for exited: %+v", cs)
	}
}
