//go:build e2e

package e2e_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/orch-dev/orch/internal/agent/agenttest"
	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/upgradeapi"
	"k8s.io/client-go/tools/clientcmd"
)

// stamped holds the builds buildStamped made, by package and version:
// the tests share them (a build of orch takes most of a minute here).
var stamped = struct {
	sync.Mutex
	dir  string
	bins map[string]string
}{bins: map[string]string{}}

// buildStamped builds the package at pkg as orch's release builds stamp
// it, with version, once per test process; callers copy it to run it.
func buildStamped(t *testing.T, pkg, version string) string {
	t.Helper()
	stamped.Lock()
	defer stamped.Unlock()
	if bin, ok := stamped.bins[pkg+"@"+version]; ok {
		return bin
	}
	if stamped.dir == "" {
		dir, err := os.MkdirTemp("", "orch-e2e-builds-")
		if err != nil {
			t.Fatal(err)
		}
		stamped.dir = dir
	}
	bin := filepath.Join(stamped.dir, fmt.Sprintf("%d", len(stamped.bins)), "orch")
	build := exec.Command("go", "build", "-ldflags", "-X main.version="+version+" -X main.commit=e2e", "-o", bin, pkg)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build %s %s: %v\n%s", pkg, version, err, out)
	}
	stamped.bins[pkg+"@"+version] = bin
	return bin
}

// copyBinary puts a copy of bin in a directory of its own.
func copyBinary(t *testing.T, bin string) string {
	t.Helper()
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "orch")
	if err := os.WriteFile(out, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return out
}

// binaryVersion is what `bin version` says, "" when it does not run.
func binaryVersion(bin string) string {
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		return ""
	}
	v, _, _ := strings.Cut(strings.TrimPrefix(string(out), "orch version "), " ")
	return v
}

// TestUpgradeRollsOver is issue 42's user story on a server and two
// agents in network namespaces: the server (run without an agent, so
// replaced by hand first, as its owner would) stages its own binary and
// a plan upgrades both agents one at a time while a Deployment under a
// budget keeps serving through its node port; an agent killed with
// SIGKILL as it swaps comes back on one of the two versions and the plan
// finishes; then a release that cannot start is rolled back by the node
// and stops its plan.
func TestUpgradeRollsOver(t *testing.T) {
	next := copyBinary(t, buildStamped(t, "github.com/orch-dev/orch", "v0.9.1"))
	current := buildStamped(t, "github.com/orch-dev/orch", "v0.9.0")
	broken := buildStamped(t, "github.com/orch-dev/orch/internal/release/testdata/fakeorch", "v0.9.2")
	c := newClusterOf(t, next)
	// up-b runs as systemd runs install.sh's unit; up-a with nothing to
	// start it again.
	c.supervised = map[string]bool{"up-b": true}
	ips := map[string]string{"up-a": "198.18.0.21", "up-b": "198.18.0.22"}
	nodes := map[string]*node{}
	for _, name := range []string{"up-a", "up-b"} {
		nodes[name] = c.addNodeOf(name, ips[name], copyBinary(t, current))
		dir := nodes[name].dir
		// Processes a rollback started in place of the test's own.
		t.Cleanup(func() { _ = exec.Command("pkill", "-9", "-f", "--data-dir "+dir).Run() })
	}
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	orchCmd := func(args ...string) (string, error) {
		// Flags go before a command's arguments.
		args = append(append(slices.Clip(args[:2]), "--data-dir", c.dataDir), args[2:]...)
		out, err := exec.CommandContext(ctx, next, args...).CombinedOutput()
		return string(out), err
	}
	ready := func(what string, want map[string]string) {
		t.Helper()
		agenttest.Eventually(t, what, func() bool {
			list, err := c.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
			if err != nil || len(list.Items) != len(want) {
				return false
			}
			for _, n := range list.Items {
				if !agenttest.NodeReady(&n) || n.Annotations[upgradeapi.VersionAnnotation] != want[n.Name] || n.Spec.Unschedulable {
					return false
				}
			}
			return true
		})
	}
	ready("both agents Ready on v0.9.0", map[string]string{"up-a": "v0.9.0", "up-b": "v0.9.0"})

	// Refused before anything moves: a corrupt binary, a version not
	// staged.
	corrupt := filepath.Join(t.TempDir(), "orch")
	data, _ := os.ReadFile(next)
	if err := os.WriteFile(corrupt, data[:len(data)/3], 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := orchCmd("upgrade", "stage", corrupt); err == nil {
		t.Fatalf("a third of a binary was staged: %s", out)
	}
	if out, err := orchCmd("upgrade", "apply", "v0.9.1"); err == nil || !strings.Contains(out, "not staged") {
		t.Fatalf("a plan for a version not staged: %v: %s", err, out)
	}
	if out, err := orchCmd("upgrade", "stage"); err != nil || !strings.Contains(out, "staged orch v0.9.1 for linux/") {
		t.Fatalf("orch upgrade stage: %v: %s", err, out)
	}

	// Two replicas, one per node, a budget that lets one go at a time,
	// and a client asking both nodes' ports.
	labels := map[string]string{"app": "web"}
	web := whoAmI()
	web.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/big", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 1}
	// Out of the Service before it stops, as charts that roll without a
	// failed request do.
	web.Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"sleep", "3"}}}}
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](2),
		Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](10), Containers: []corev1.Container{web},
			TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: corev1.LabelHostname,
				WhenUnsatisfiable: corev1.ScheduleAnyway, LabelSelector: &metav1.LabelSelector{MatchLabels: labels}}}}}}}
	if _, err := c.client.AppsV1().Deployments("default").Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: policyv1.PodDisruptionBudgetSpec{
		MinAvailable: ptr.To(intstr.FromInt32(1)), Selector: &metav1.LabelSelector{MatchLabels: labels}}}
	if _, err := c.client.PolicyV1().PodDisruptionBudgets("default").Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: labels,
		Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080), NodePort: 30089}}}}
	if _, err := c.client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, ip := range ips {
		httpGet(t, "http://"+ip+":30089/cgi-bin/who")
	}
	var asked, failed atomic.Int64
	var failures sync.Map
	clientCtx, stopClient := context.WithCancel(ctx)
	clientDone := make(chan struct{})
	go func() {
		defer close(clientDone)
		httpc := &http.Client{Timeout: 3 * time.Second}
		for i := 0; clientCtx.Err() == nil; i++ {
			ip := ips[[]string{"up-a", "up-b"}[i%2]]
			resp, err := httpc.Get("http://" + ip + ":30089/cgi-bin/who")
			asked.Add(1)
			if err == nil {
				_ = resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					err = fmt.Errorf("%s", resp.Status)
				}
			}
			if err != nil {
				failed.Add(1)
				failures.Store(time.Now().Format("15:04:05.000")+" "+ip, err.Error())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()

	// The plan; up-b is killed with SIGKILL halfway through its download
	// and started again by its supervisor: it resumes the download.
	start := time.Now()
	if out, err := orchCmd("upgrade", "apply", "--node-timeout", "3m", "--drain-timeout", "2m", "v0.9.1"); err != nil {
		t.Fatalf("orch upgrade apply: %v: %s", err, out)
	}
	b := nodes["up-b"]
	agenttest.Eventually(t, "up-b downloading the release", func() bool {
		log, _ := os.ReadFile(b.logPath)
		return strings.Contains(string(log), "downloading the release")
	})
	time.Sleep(3 * time.Second) // 70 MB at 8 MiB/s take about nine
	b.kill()
	if v := binaryVersion(b.bin); v != "v0.9.0" && v != "v0.9.1" {
		t.Fatalf("after SIGKILL mid-swap the node's binary says %q", v)
	}
	t.Logf("killed up-b as it downloaded: its binary is %s", binaryVersion(b.bin))
	client := upgradeClient(t, c)
	var plan *upgradeapi.Upgrade
	agenttest.Eventually(t, "the plan done", func() bool {
		list, err := client.Upgrades().List(ctx, metav1.ListOptions{})
		if err != nil || len(list.Items) != 1 {
			return false
		}
		plan = &list.Items[0]
		if plan.Status.Phase == upgradeapi.PhaseFailed {
			t.Fatalf("the plan failed: %s", plan.Status.Message)
		}
		return plan.Status.Phase == upgradeapi.PhaseSucceeded
	})
	took := time.Since(start)
	if log, _ := os.ReadFile(b.logPath); !strings.Contains(string(log), "release downloaded") {
		t.Errorf("up-b never finished its download")
	} else {
		line := string(log)[strings.LastIndex(string(log), "release downloaded"):]
		t.Logf("up-b after its restart: %s", strings.SplitN(line, "\n", 2)[0])
	}
	ready("both agents Ready on v0.9.1, uncordoned", map[string]string{"up-a": "v0.9.1", "up-b": "v0.9.1"})
	stopClient()
	<-clientDone
	for _, n := range plan.Status.Nodes {
		t.Logf("node %s: %s -> %s in %s", n.Name, n.From, n.Phase, n.Finished.Sub(n.Started.Time).Round(time.Second))
	}
	failures.Range(func(k, v any) bool { t.Logf("failed request %s: %s", k, v); return true })
	t.Logf("upgraded two agents in %s; %d of %d requests failed", took.Round(time.Second), failed.Load(), asked.Load())
	if failed.Load() > asked.Load()/50 {
		t.Errorf("%d of %d requests failed during the upgrade", failed.Load(), asked.Load())
	}
	for name, n := range nodes {
		if v, prev := binaryVersion(n.bin), binaryVersion(n.bin+".previous"); v != "v0.9.1" || prev != "v0.9.0" {
			t.Errorf("%s's binary is %q, the previous %q", name, v, prev)
		}
	}
	if out := c.mustKubectl("", "get", "upgrades"); !strings.Contains(out, "Succeeded") || !strings.Contains(out, "2/2") {
		t.Errorf("kubectl get upgrades:\n%s", out)
	}

	// A release that passes its checks but cannot start: the node's guard
	// puts v0.9.1 back and starts it, the node says why, and the plan
	// stops there, up-a uncordoned.
	staged := copyBinary(t, broken) // named orch: this machine's platform
	if out, err := orchCmd("upgrade", "stage", staged); err != nil {
		t.Fatalf("stage the broken release: %v: %s", err, out)
	}
	if out, err := orchCmd("upgrade", "apply", "v0.9.2"); err == nil || !strings.Contains(out, "under way") && !strings.Contains(out, "created") {
		t.Logf("apply v0.9.2 without --force: %v: %s", err, out)
	}
	agenttest.Eventually(t, "the plan to v0.9.2 refused without --force (agents may not pass the server)", func() bool {
		out, _ := orchCmd("upgrade", "status")
		return strings.Contains(out, "agents may not run a newer orch than the servers")
	})
	if out, err := orchCmd("upgrade", "apply", "--force", "--selector", "kubernetes.io/hostname=up-a", "--node-timeout", "2m", "v0.9.2"); err != nil {
		t.Fatalf("apply v0.9.2: %v: %s", err, out)
	}
	agenttest.Eventually(t, "the plan to v0.9.2 stopped by the rollback", func() bool {
		out, _ := orchCmd("upgrade", "status")
		return strings.Contains(out, "Failed") && strings.Contains(out, "up-a: rolled back to v0.9.1")
	})
	ready("up-a Ready on v0.9.1 again", map[string]string{"up-a": "v0.9.1", "up-b": "v0.9.1"})
	if v := binaryVersion(nodes["up-a"].bin); v != "v0.9.1" {
		t.Errorf("up-a's binary after the rollback: %q", v)
	}
	out, _ := orchCmd("upgrade", "status")
	t.Logf("orch upgrade status:\n%s", out)
	guard, _ := os.ReadFile(filepath.Join(nodes["up-a"].dir, "upgrade", "guard.log"))
	t.Logf("up-a's guard:\n%s", guard)

	// The same on up-b, which its supervisor runs: the guard puts v0.9.1
	// back and leaves the start to the supervisor, so that one agent
	// runs, not two.
	b.mu.Lock()
	startsBefore := b.starts
	b.mu.Unlock()
	if out, err := orchCmd("upgrade", "apply", "--force", "--selector", "kubernetes.io/hostname=up-b", "--node-timeout", "2m", "v0.9.2"); err != nil {
		t.Fatalf("apply v0.9.2 to up-b: %v: %s", err, out)
	}
	agenttest.Eventually(t, "the plan to v0.9.2 on up-b stopped by the rollback", func() bool {
		out, _ := orchCmd("upgrade", "status")
		return strings.Contains(out, "Failed") && strings.Contains(out, "up-b: rolled back to v0.9.1")
	})
	ready("up-b Ready on v0.9.1 again", map[string]string{"up-a": "v0.9.1", "up-b": "v0.9.1"})
	if v := binaryVersion(b.bin); v != "v0.9.1" {
		t.Errorf("up-b's binary after the rollback: %q", v)
	}
	b.mu.Lock()
	restarted := b.starts - startsBefore
	b.mu.Unlock()
	if restarted != 1 {
		t.Errorf("up-b's supervisor started it %d times after the broken release exited, want 1", restarted)
	}
	agents, _ := exec.Command("pgrep", "-f", "agent .*--data-dir "+b.dir).Output()
	if n := len(strings.Fields(string(agents))); n != 1 {
		t.Errorf("%d agents run on up-b after its rollback, want 1 (its guard must leave the start to systemd)", n)
	}
	guard, _ = os.ReadFile(filepath.Join(b.dir, "upgrade", "guard.log"))
	t.Logf("up-b's guard:\n%s", guard)
}

// upgradeClient is the admin's client of orch's Upgrade kind.
func upgradeClient(t *testing.T, c *cluster) *kube.Client {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	client, err := kube.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// TestServerUpgradesItself: a server with its own node (the common
// one-board install) stages the next release and upgrades itself: the
// process replaces itself in place (the same PID), the API comes back,
// and its pods run on, never restarted, as through any restart of orch.
func TestServerUpgradesItself(t *testing.T) {
	next := buildStamped(t, "github.com/orch-dev/orch", "v0.9.1")
	bin := copyBinary(t, buildStamped(t, "github.com/orch-dev/orch", "v0.9.0"))
	dir := agenttest.NodeDataDir(t)
	t.Cleanup(func() {
		if out, err := exec.Command(bin, "agent", "--cleanup").CombinedOutput(); err != nil {
			t.Errorf("orch agent --cleanup: %v\n%s", err, out)
		}
	})
	port, kubeletPort := agenttest.FreePort(t), agenttest.FreePort(t)
	kubeconfig := filepath.Join(dir, "admin.yaml")
	logPath := filepath.Join(t.TempDir(), "orch.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	srv := exec.Command(bin, "server", "--data-dir", dir, "--runtime-dir", filepath.Join(dir, "run"), "--node-name", "solo", "--bind-address", "127.0.0.1",
		"--advertise-address", "127.0.0.1", "--node-ip", "127.0.0.1", "--https-listen-port", fmt.Sprint(port), "--kubelet-port", fmt.Sprint(kubeletPort),
		"--write-kubeconfig", kubeconfig, "--disable-snapshots")
	srv.Stdout, srv.Stderr = logFile, logFile
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = srv.Process.Signal(os.Interrupt)
		_ = srv.Wait()
		_ = logFile.Close()
		if t.Failed() {
			out, _ := exec.Command("tail", "-n", "40", logPath).Output()
			t.Logf("orch server's log ends:\n%s", out)
		}
	})
	client := agenttest.WaitServer(t, kubeconfig)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	names := []string{"p1", "p2", "p3"}
	uids := agenttest.RunningPods(ctx, t, client, names...)
	before := agenttest.TaskPids(ctx, t, dir, uids)

	if out, err := exec.Command(next, "upgrade", "stage", "--data-dir", dir).CombinedOutput(); err != nil {
		t.Fatalf("stage: %v: %s", err, out)
	}
	start := time.Now()
	if out, err := exec.Command(bin, "upgrade", "apply", "--data-dir", dir, "v0.9.1").CombinedOutput(); err != nil {
		t.Fatalf("apply: %v: %s", err, out)
	}
	var status string
	agenttest.Eventually(t, "the server upgraded", func() bool {
		out, _ := exec.Command(bin, "upgrade", "status", "--data-dir", dir).CombinedOutput()
		status = string(out)
		return strings.Contains(status, "Succeeded")
	})
	t.Logf("the server upgraded itself in %s:\n%s", time.Since(start).Round(time.Second), status)
	if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", srv.Process.Pid)); err != nil || exe != bin {
		t.Errorf("the server's process (pid %d) runs %q (%v), want %s: it did not replace itself in place", srv.Process.Pid, exe, err, bin)
	}
	if v := binaryVersion(bin); v != "v0.9.1" {
		t.Errorf("the binary says %q", v)
	}
	node, err := client.CoreV1().Nodes().Get(ctx, "solo", metav1.GetOptions{})
	if err != nil || node.Annotations[upgradeapi.VersionAnnotation] != "v0.9.1" || node.Labels[upgradeapi.ControlPlaneLabel] != "true" || node.Spec.Unschedulable {
		t.Fatalf("the node after the upgrade: %v %v", node.ObjectMeta, err)
	}
	for _, c := range agenttest.RestartCounts(ctx, client, names...) {
		if c != 0 {
			t.Errorf("a pod restarted through the upgrade: %v", agenttest.RestartCounts(ctx, client, names...))
		}
	}
	if after := agenttest.TaskPids(ctx, t, dir, uids); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("containers after the upgrade %v, were %v", after, before)
	}
	if err := client.CoreV1().Pods("default").DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	agenttest.Eventually(t, "the pods gone from the node", func() bool {
		left, _ := os.ReadDir(filepath.Join(dir, "agent", "pods"))
		return len(left) == 0
	})
}

func TestMain(m *testing.M) {
	code := m.Run()
	if stamped.dir != "" {
		_ = os.RemoveAll(stamped.dir)
	}
	os.Exit(code)
}
