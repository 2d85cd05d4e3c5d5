//go:build e2e

package e2e_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/orch-dev/orch/internal/agent/agenttest"
	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/upgradeapi"
)

// TestServersUpgradeOneAtATime: three servers on their embedded etcd,
// each with its own node (k3s users' HA), all on v0.9.0. The next
// release is staged on one of them and one plan upgrades the three, one
// at a time, each in place (the same PID), the next only once the last
// is back; writes through the servers keep being taken (at most an
// etcd election without one), the servers' pods run on, untouched, and
// the etcd cluster ends with its three voting members.
func TestServersUpgradeOneAtATime(t *testing.T) {
	next := buildStamped(t, "github.com/orch-dev/orch", "v0.9.1")
	current := buildStamped(t, "github.com/orch-dev/orch", "v0.9.0")
	c := newCluster(t) // the bridge; its own server is not used
	_ = c.serverCmd.Process.Kill()
	_ = c.serverCmd.Wait()
	names := []string{"uphs1", "uphs2", "uphs3"}
	addrs := []string{"198.18.0.31", "198.18.0.32", "198.18.0.33"}
	port := agenttest.FreePort(t)
	var servers []*haServer
	var serverToken string
	for i, name := range names {
		ns := c.netns(name, addrs[i])
		run(t, "nsenter", "--net=/run/netns/"+ns, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward")
		join := []string{"--cluster-init", "--token", "e2e-upgrade-ha-agents-0123456789"}
		if i > 0 {
			join = []string{"--server", servers[0].url, "--token", serverToken}
		}
		servers = append(servers, startServerNode(t, ns, copyBinary(t, current), name, addrs[i], port, join))
		if i == 0 {
			raw, err := os.ReadFile(filepath.Join(servers[0].dir, "server", "server-token"))
			if err != nil {
				t.Fatal(err)
			}
			serverToken = strings.TrimSpace(string(raw))
		}
	}
	members := etcdClient(t, servers[0], etcdEndpoint(addrs[0]))
	agenttest.EventuallyWithin(t, "three voting members", time.Minute, func() bool {
		v, l := membership(t, members)
		return v == 3 && l == 0
	})
	clients := make([]kubernetes.Interface, len(servers))
	plans := make([]*kube.Client, len(servers))
	for i, s := range servers {
		cfg, err := clientcmd.BuildConfigFromFlags("", s.kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Timeout = 3 * time.Second
		clients[i] = kubernetes.NewForConfigOrDie(cfg)
		if plans[i], err = kube.NewForConfig(cfg); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	agenttest.EventuallyWithin(t, "three control-plane nodes Ready on v0.9.0", 2*time.Minute, func() bool {
		list, err := clients[0].CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil || len(list.Items) != 3 {
			return false
		}
		for _, n := range list.Items {
			if !agenttest.NodeReady(&n) || n.Annotations[upgradeapi.VersionAnnotation] != "v0.9.0" || n.Labels[upgradeapi.ControlPlaneLabel] != "true" {
				return false
			}
		}
		return true
	})

	// A pod on every server's node.
	uids := map[string]string{}
	for _, name := range names {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "on-" + name}, Spec: corev1.PodSpec{NodeName: name,
			TerminationGracePeriodSeconds: ptr.To[int64](0), Containers: []corev1.Container{agenttest.Busybox("main", "sleep 3600")}}}
		if _, err := clients[0].CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	agenttest.EventuallyWithin(t, "the servers' pods running", 2*time.Minute, func() bool {
		for _, name := range names {
			p, err := clients[0].CoreV1().Pods("default").Get(ctx, "on-"+name, metav1.GetOptions{})
			if err != nil || p.Status.Phase != corev1.PodRunning {
				return false
			}
			uids[name] = string(p.UID)
		}
		return true
	})
	pids := map[string]int{}
	for i, s := range servers {
		pids[names[i]] = s.cmd.Process.Pid
	}

	// Writes, through each server in turn, all along.
	var mu sync.Mutex
	var lastWrite time.Time
	var longestGap time.Duration
	var writes, failed int
	beat := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "beat"}, Data: map[string]string{"n": "0"}}
	if _, err := clients[0].CoreV1().ConfigMaps("default").Create(ctx, beat, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	writing, stopWriting := context.WithCancel(ctx)
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		for i := 0; writing.Err() == nil; i++ {
			cl := clients[i%len(clients)]
			_, err := cl.CoreV1().ConfigMaps("default").Patch(writing, "beat", "application/merge-patch+json",
				fmt.Appendf(nil, `{"data":{"n":"%d"}}`, i), metav1.PatchOptions{})
			mu.Lock()
			writes++
			if err != nil {
				failed++
			} else {
				now := time.Now()
				if !lastWrite.IsZero() {
					longestGap = max(longestGap, now.Sub(lastWrite))
				}
				lastWrite = now
			}
			mu.Unlock()
			time.Sleep(100 * time.Millisecond)
		}
	}()

	if out, err := exec.Command(next, "upgrade", "stage", "--data-dir", servers[1].dir).CombinedOutput(); err != nil {
		t.Fatalf("stage: %v: %s", err, out)
	}
	start := time.Now()
	if out, err := exec.Command(current, "upgrade", "apply", "--data-dir", servers[1].dir, "v0.9.1").CombinedOutput(); err != nil {
		t.Fatalf("apply: %v: %s", err, out)
	}
	// Never two servers under way at once, seen every 100 ms.
	var plan *upgradeapi.Upgrade
	agenttest.EventuallyWithin(t, "the plan done", 6*time.Minute, func() bool {
		// Any server that answers.
		for _, cl := range plans {
			if list, err := cl.Upgrades().List(ctx, metav1.ListOptions{}); err == nil && len(list.Items) == 1 {
				plan = &list.Items[0]
				break
			}
		}
		if plan == nil {
			return false
		}
		active := 0
		for _, n := range plan.Status.Nodes {
			if n.Phase == upgradeapi.NodeUpgrading || n.Phase == upgradeapi.NodeDraining {
				active++
			}
		}
		if active > 1 {
			t.Fatalf("%d servers under way at once: %+v", active, plan.Status.Nodes)
		}
		if plan.Status.Phase == upgradeapi.PhaseFailed {
			t.Fatalf("the plan failed: %s", plan.Status.Message)
		}
		return plan.Status.Phase == upgradeapi.PhaseSucceeded
	})
	took := time.Since(start)
	stopWriting()
	<-writerDone
	t.Logf("three servers upgraded in %s; %d of %d writes failed (through the server restarting), longest time without a write %s",
		took.Round(time.Second), failed, writes, longestGap.Round(100*time.Millisecond))
	// Each started once the last was done (the status's times are to the
	// second).
	var last *metav1.Time
	for _, n := range plan.Status.Nodes {
		t.Logf("%s: %s, %s to %s", n.Name, n.Phase, n.Started, n.Finished)
		if n.Role != "server" || n.Phase != upgradeapi.NodeUpgraded || n.Started == nil || n.Finished == nil {
			t.Errorf("node %+v", n)
			continue
		}
		if last != nil && n.Started.Before(last) {
			t.Errorf("%s started at %s, before the last server finished (%s)", n.Name, n.Started, last)
		}
		last = n.Finished
	}
	// Three servers lose no write for longer than an election (two election
	// timeouts of the board settings, 5 s each) and a restart's
	// handover of the connections.
	if longestGap > 15*time.Second {
		t.Errorf("no write was taken for %s", longestGap)
	}

	for i, s := range servers {
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pids[names[i]])); err != nil || exe != s.bin {
			t.Errorf("server %s (pid %d) runs %q (%v), want %s in place", names[i], pids[names[i]], exe, err, s.bin)
		}
		if v := binaryVersion(s.bin); v != "v0.9.1" {
			t.Errorf("server %s's binary says %q", names[i], v)
		}
	}
	if v, l := membership(t, members); v != 3 || l != 0 {
		t.Errorf("after the upgrade: %d voting members and %d learners, want 3 and 0", v, l)
	}
	list, err := clients[2].CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range list.Items {
		if !agenttest.NodeReady(&n) || n.Annotations[upgradeapi.VersionAnnotation] != "v0.9.1" || n.Spec.Unschedulable {
			t.Errorf("node %s after the upgrade: ready %v, version %q, unschedulable %v", n.Name, agenttest.NodeReady(&n),
				n.Annotations[upgradeapi.VersionAnnotation], n.Spec.Unschedulable)
		}
	}
	for _, name := range names {
		p, err := clients[2].CoreV1().Pods("default").Get(ctx, "on-"+name, metav1.GetOptions{})
		if err != nil || string(p.UID) != uids[name] || p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) != 1 ||
			p.Status.ContainerStatuses[0].RestartCount != 0 {
			t.Errorf("the pod on %s after the upgrade: %v %v", name, p.Status, err)
		}
	}
}
