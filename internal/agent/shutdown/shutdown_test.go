package shutdown_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent/shutdown"
	"github.com/orch-dev/orch/internal/agent/shutdown/logindtest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// recordingPods records what the shutdown asks of the node's pods.
type recordingPods struct {
	mu    sync.Mutex
	steps []string
	pods  []*corev1.Pod
	// hold is how long each Terminate takes.
	hold time.Duration
}

func (r *recordingPods) SetShuttingDown(on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if on {
		r.steps = append(r.steps, "reject new pods")
	} else {
		r.steps = append(r.steps, "admit pods")
	}
}

func (r *recordingPods) Terminate(ctx context.Context, group func(*corev1.Pod) bool, grace time.Duration) {
	r.mu.Lock()
	var names []string
	for _, p := range r.pods {
		if group(p) {
			names = append(names, p.Name)
		}
	}
	r.steps = append(r.steps, "stop "+strings.Join(names, ",")+" within "+grace.String())
	r.mu.Unlock()
	time.Sleep(r.hold)
}

func (r *recordingPods) Steps() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.steps...)
}

func pod(name string, priority int32) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{Priority: ptr.To(priority)}}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestShutdown: the agent raises logind's InhibitDelayMaxSec (5 s by
// default) to its grace period with a drop-in and a reload, holds a delay
// lock, and on PrepareForShutdown(true) stops regular pods within the
// grace period less the critical pods' share, then the critical ones
// (priority of system-cluster-critical and above) within theirs, and only
// then lets the shutdown go on; a cancelled shutdown takes the lock again
// and admits pods. As the kubelet's shutdown manager.
func TestShutdown(t *testing.T) {
	logind := logindtest.Start(t, 5*time.Second)
	pods := &recordingPods{pods: []*corev1.Pod{pod("web", 0), pod("db", 1000), pod("dns", 2000000000), pod("proxy", 2000001000)}, hold: 300 * time.Millisecond}
	var notified []bool
	var mu sync.Mutex
	m := shutdown.New(shutdown.Config{GracePeriod: 30 * time.Second, CriticalPodsGracePeriod: 10 * time.Second, Bus: logind.Address, LogindConfDir: logind.ConfDir},
		pods, func(on bool) {
			mu.Lock()
			notified = append(notified, on)
			mu.Unlock()
		})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})

	eventually(t, "a delay lock held", func() bool { held, _ := logind.Held(); return held == 1 })
	if d := logind.Delay(); d != 30*time.Second || logind.Reloads() != 1 {
		t.Fatalf("logind's delay %v after %d reloads, want 30s after one", d, logind.Reloads())
	}
	body, err := os.ReadFile(filepath.Join(logind.ConfDir, shutdown.DropInName))
	if err != nil || !strings.Contains(string(body), "[Login]\nInhibitDelayMaxSec=30\n") {
		t.Fatalf("drop-in: %q %v", body, err)
	}
	if h := logind.Holders(); len(h) != 1 || !strings.HasPrefix(h[0], "orch: ") {
		t.Fatalf("lock holders %q", h)
	}

	logind.PrepareForShutdown(t, true)
	eventually(t, "the pods stopped", func() bool { return len(pods.Steps()) == 3 })
	// The lock is held while the pods stop, and released after.
	if held, _ := logind.Held(); held != 1 || !m.ShuttingDown() {
		t.Fatalf("during the shutdown: %d locks held, shutting down %v", held, m.ShuttingDown())
	}
	eventually(t, "the lock released", func() bool { held, _ := logind.Held(); return held == 0 })
	want := []string{"reject new pods", "stop web,db within 20s", "stop dns,proxy within 10s"}
	if got := pods.Steps(); strings.Join(got, "; ") != strings.Join(want, "; ") {
		t.Fatalf("shutdown steps %q, want %q", got, want)
	}

	logind.PrepareForShutdown(t, false)
	eventually(t, "the lock taken again", func() bool { held, taken := logind.Held(); return held == 1 && taken == 2 })
	eventually(t, "pods admitted again", func() bool { return len(pods.Steps()) == 4 && !m.ShuttingDown() })
	mu.Lock()
	defer mu.Unlock()
	if len(notified) != 2 || !notified[0] || notified[1] {
		t.Fatalf("notified %v, want [true false]", notified)
	}
}

// TestShutdownWithinLogindsDelay: when logind will not wait as long as
// the grace period (its configuration is elsewhere, or reloading did not
// take), the regular pods' share shrinks first and the critical pods keep
// theirs.
func TestShutdownWithinLogindsDelay(t *testing.T) {
	cfg := shutdown.Config{GracePeriod: 30 * time.Second, CriticalPodsGracePeriod: 10 * time.Second}
	for _, tc := range []struct {
		total             time.Duration
		regular, critical time.Duration
	}{
		{30 * time.Second, 20 * time.Second, 10 * time.Second},
		{15 * time.Second, 5 * time.Second, 10 * time.Second},
		{5 * time.Second, 0, 5 * time.Second},
	} {
		g := cfg.Groups(tc.total)
		if g[0].Grace != tc.regular || g[1].Grace != tc.critical {
			t.Errorf("total %v: regular %v critical %v, want %v %v", tc.total, g[0].Grace, g[1].Grace, tc.regular, tc.critical)
		}
		if !g[0].Pods(pod("web", 1999999999)) || g[0].Pods(pod("dns", 2000000000)) || !g[1].Pods(pod("node", 2000001000)) {
			t.Errorf("groups take the wrong pods")
		}
	}
}

// TestNoSystemBus: a machine without logind keeps running pods, without
// graceful shutdown: Run waits, quietly, until it ends.
func TestNoSystemBus(t *testing.T) {
	pods := &recordingPods{}
	m := shutdown.New(shutdown.Config{GracePeriod: 30 * time.Second, Bus: "unix:path=" + filepath.Join(t.TempDir(), "none")}, pods, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	m.Run(ctx)
	if len(pods.Steps()) != 0 || m.ShuttingDown() {
		t.Fatalf("without a bus: %q", pods.Steps())
	}
}
