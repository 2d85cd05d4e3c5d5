package agent_test

import (
	"context"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
	"github.com/orch-dev/orch/internal/agent/agenttest"
	orchctr "github.com/orch-dev/orch/internal/agent/containerd"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// link is a TCP forwarder from the agent to the API server that the test
// can cut (the network or the server going away) and restore.
type link struct {
	addr, target string
	mu           sync.Mutex
	ln           net.Listener
	conns        []net.Conn
}

func newLink(t *testing.T, target string) *link {
	l := &link{target: target}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l.addr = ln.Addr().String()
	l.serve(ln)
	t.Cleanup(l.cut)
	return l
}

func (l *link) serve(ln net.Listener) {
	l.mu.Lock()
	l.ln = ln
	l.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", l.target)
			if err != nil {
				_ = c.Close()
				continue
			}
			l.mu.Lock()
			l.conns = append(l.conns, c, s)
			l.mu.Unlock()
			go func() { _, _ = io.Copy(s, c); _ = s.Close() }()
			go func() { _, _ = io.Copy(c, s); _ = c.Close() }()
		}
	}()
}

func (l *link) cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ln != nil {
		_ = l.ln.Close()
		l.ln = nil
	}
	for _, c := range l.conns {
		_ = c.Close()
	}
	l.conns = nil
}

func (l *link) restore(t *testing.T) {
	ln, err := net.Listen("tcp", l.addr)
	if err != nil {
		t.Fatal(err)
	}
	l.serve(ln)
}

// TestOffline: pods keep running and restarting while the server is
// unreachable and their status catches up when it returns; after a
// reboot with the server still unreachable, the agent starts them again
// from its checkpoint.
func TestOffline(t *testing.T) {
	c, dir := prepareNode(t)
	server, _ := url.Parse(c.Server.URL())
	l := newLink(t, server.Host)
	start := func() (stop func()) { return agenttest.RunAgent(t, "https://"+l.addr, c.Server.Token(), dir, "edge") }

	stop := start()
	defer func() { stop() }()
	waitNodeReady(c, "edge")
	pods := c.Client.CoreV1().Pods("default")
	for _, p := range []*corev1.Pod{
		{ObjectMeta: metav1.ObjectMeta{Name: "keeper"}, Spec: corev1.PodSpec{TerminationGracePeriodSeconds: agenttest.PtrTo[int64](0),
			Containers: []corev1.Container{agenttest.Busybox("main", "sleep 3600")}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "flaky"}, Spec: corev1.PodSpec{TerminationGracePeriodSeconds: agenttest.PtrTo[int64](0),
			Containers: []corev1.Container{agenttest.Busybox("main", "sleep 1; exit 1")}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "scratch"}, Spec: corev1.PodSpec{TerminationGracePeriodSeconds: agenttest.PtrTo[int64](0),
			Volumes:    []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: agenttest.PtrTo(resource.MustParse("1Mi"))}}}},
			Containers: []corev1.Container{withMount(agenttest.Busybox("main", "sleep 3600"), "scratch", "/scratch")}}},
	} {
		if _, err := pods.Create(c.Ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	c.Eventually("the pods Running", time.Minute, podsRunning(pods, 3))
	keeper, _ := pods.Get(c.Ctx, "keeper", metav1.GetOptions{})
	flaky, _ := pods.Get(c.Ctx, "flaky", metav1.GetOptions{})
	scratch, _ := pods.Get(c.Ctx, "scratch", metav1.GetOptions{})

	ctr := agenttest.ContainerdClient(t, dir)
	nsCtx := namespaces.WithNamespace(context.Background(), orchctr.Namespace)
	task, err := agenttest.LoadTask(nsCtx, ctr, string(keeper.UID)+"-main")
	if err != nil {
		t.Fatal(err)
	}
	pid := task.Pid()

	// The server goes away: the pods run on, the flaky one is restarted
	// by the agent alone, the one whose emptyDir outgrows its limit is
	// evicted, and the status catches up when it is back.
	l.cut()
	if err := os.WriteFile(filepath.Join(dir, "agent", "pods", string(scratch.UID), "volumes", "scratch", "fill"), make([]byte, 2<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	runs := func() int {
		entries, _ := os.ReadDir(filepath.Join(dir, "agent", "pods", string(flaky.UID), "logs", "main"))
		return len(entries)
	}
	before := runs()
	c.Eventually("the flaky container restarted offline", time.Minute, func(ctx context.Context) (bool, error) {
		return runs() >= before+1, nil
	})
	// Long enough for the server to give the node up (Unknown after the
	// 40 s grace period), as in an outage of a minute.
	c.Eventually("the node Unknown on the server", 2*time.Minute, func(ctx context.Context) (bool, error) {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, "edge", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status == corev1.ConditionUnknown, nil
			}
		}
		return false, nil
	})
	if task, err := agenttest.LoadTask(nsCtx, ctr, string(keeper.UID)+"-main"); err != nil {
		t.Errorf("keeper while offline: %v", err)
	} else if task.Pid() != pid {
		t.Errorf("keeper while offline runs as pid %d, was %d", task.Pid(), pid)
	}
	c.Eventually("the pod over its emptyDir limit stopped offline", time.Minute, func(ctx context.Context) (bool, error) {
		_, err := agenttest.LoadTask(nsCtx, ctr, string(scratch.UID)+"-main")
		return err != nil, nil
	})
	// The agent restarts before the server is back: the eviction the API
	// has not heard of yet holds, and the evicted pod is not run again.
	stop()
	stop = start()
	time.Sleep(10 * time.Second) // past the wait for the server, into running the checkpoint's pods
	ctrAfter, err := containerd.New(filepath.Join(dir, "agent", "containerd", "containerd.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ctrAfter.Close() }()
	if _, err := ctrAfter.LoadContainer(nsCtx, string(scratch.UID)+"-main"); err == nil {
		t.Error("the agent restarted offline ran the evicted pod again")
	}
	offlineRuns := runs()
	l.restore(t)
	waitNodeReady(c, "edge")
	c.Eventually("keeper Ready again, same container, nothing lost", time.Minute, func(ctx context.Context) (bool, error) {
		p, err := pods.Get(ctx, "keeper", metav1.GetOptions{})
		return err == nil && p.UID == keeper.UID && hasCondition(p, corev1.PodReady) && p.Status.ContainerStatuses[0].RestartCount == 0, nil
	})
	c.Eventually("the restarts reported once the server is back", time.Minute, func(ctx context.Context) (bool, error) {
		p, err := pods.Get(ctx, "flaky", metav1.GetOptions{})
		return err == nil && len(p.Status.ContainerStatuses) == 1 && int(p.Status.ContainerStatuses[0].RestartCount) >= offlineRuns-1, nil
	})
	c.Eventually("the offline eviction reported once the server is back", time.Minute, func(ctx context.Context) (bool, error) {
		p, err := pods.Get(ctx, "scratch", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodFailed && p.Status.Reason == "Evicted", nil
	})

	// The node reboots while the server is unreachable: the agent and
	// every container process stop, the pods' network namespaces are
	// gone and so is the runtime directory (a tmpfs: containerd's state,
	// the pods' network and sandbox files); the agent comes back and
	// starts the pods from its checkpoint, which is on disk.
	stop()
	out, _ := exec.Command("pgrep", "-f", dir).Output()
	for _, f := range strings.Fields(string(out)) {
		if p, err := strconv.Atoi(f); err == nil {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
	}
	_ = syscall.Kill(int(pid), syscall.SIGKILL)
	runDir := filepath.Join(dir, "agent", "run")
	agenttest.UnmountUnder(runDir)
	if err := os.RemoveAll(runDir); err != nil {
		t.Fatalf("wiping the runtime dir as a reboot does: %v", err)
	}
	l.cut()
	stop = start()
	c.Eventually("keeper running again from the checkpoint, offline", time.Minute, func(ctx context.Context) (bool, error) {
		ctr2, err := containerd.New(filepath.Join(dir, "agent", "containerd", "containerd.sock"), containerd.WithTimeout(time.Second))
		if err != nil {
			return false, nil
		}
		defer func() { _ = ctr2.Close() }()
		task, err := agenttest.LoadTask(nsCtx, ctr2, string(keeper.UID)+"-main")
		if err != nil {
			return false, nil
		}
		st, err := task.Status(nsCtx)
		return err == nil && st.Status == containerd.Running && task.Pid() != pid, nil
	})
	l.restore(t)
	// Two minutes: the agent's informers have backed off (up to 30 s
	// between tries, client-go's reflector) through the outage, and they
	// are more now (the service proxy's and pod network's); one full
	// CI run under load took longer than a minute.
	c.Eventually("keeper Running in the API with its new start", 2*time.Minute, func(ctx context.Context) (bool, error) {
		p, err := pods.Get(ctx, "keeper", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" &&
			p.Status.ContainerStatuses[0].State.Running != nil && p.Status.ContainerStatuses[0].State.Running.StartedAt.After(keeper.Status.StartTime.Time), nil
	})
	// Deleting through the API stops them and empties the checkpoint.
	if err := pods.DeleteCollection(c.Ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("pods cleaned up on the node", time.Minute, func(ctx context.Context) (bool, error) {
		left, _ := os.ReadDir(filepath.Join(dir, "agent", "pods"))
		return len(left) == 0, nil
	})
}
