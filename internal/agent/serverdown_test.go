package agent_test

import (
	"context"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
	orchctr "github.com/orch-dev/orch/internal/agent/containerd"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
)

// TestServerDownForAMinute: the server is killed (kill -9, a power cut on
// the control-plane board) while a node runs a Deployment's pods, stays
// down for a minute, and starts again from its data dir. Nothing is lost:
// the pods ran on through the outage and are the same pods afterwards
// (same UIDs and containers, no restart), Ready all along once the server
// is back (the node is not marked Unknown for the server's own downtime),
// the node Ready, and new pods run.
func TestServerDownForAMinute(t *testing.T) {
	if testing.Short() {
		t.Skip("a minute's outage")
	}
	agentDir := nodeDataDir(t)
	bin := buildOrch(t)
	srvDir := t.TempDir()
	port := freePort(t)
	server := func() *exec.Cmd {
		cmd := exec.Command(bin, "server", "--data-dir", srvDir, "--disable-agent", "--bind-address", "127.0.0.1",
			"--advertise-address", "127.0.0.1", "--https-listen-port", strconv.Itoa(port), "--write-kubeconfig", filepath.Join(srvDir, "admin.yaml"))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	srv := server()
	client := waitServer(t, filepath.Join(srvDir, "admin.yaml"))
	token, err := os.ReadFile(filepath.Join(srvDir, "server", "token"))
	if err != nil {
		t.Fatal(err)
	}
	stopAgent := runAgent(t, "https://127.0.0.1:"+strconv.Itoa(port), strings.TrimSpace(string(token)), agentDir, "edge-1")
	defer stopAgent()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	labels := map[string]string{"app": "web"}
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: appsv1.DeploymentSpec{
		Replicas: ptr.To[int32](2), Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](0), Containers: []corev1.Container{busybox("web", "sleep 3600")}}}}}
	if _, err := client.AppsV1().Deployments("default").Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var before map[string]string // pod UID -> container ID
	eventually(t, "the Deployment's 2 pods Ready", func() bool {
		before = readyPods(ctx, client)
		return len(before) == 2
	})

	if err := srv.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = srv.Wait()
	time.Sleep(time.Minute)
	ctr := containerdClient(t, agentDir)
	for uid := range before {
		if !taskRunning(ctx, ctr, uid+"-web") {
			t.Errorf("pod %s's container stopped while the server was down", uid)
		}
	}

	server()
	eventually(t, "the node Ready and the same pods Ready after the restart", func() bool {
		node, err := client.CoreV1().Nodes().Get(ctx, "edge-1", metav1.GetOptions{})
		return err == nil && nodeReady(node) && maps.Equal(readyPods(ctx, client), before)
	})
	// They stay so: the node is not judged on the server's own downtime
	// (past the 40 s grace period), so its pods do not turn NotReady.
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		if got := readyPods(ctx, client); !maps.Equal(got, before) {
			t.Fatalf("after the restart the ready pods are %v, were %v", got, before)
		}
	}
	node, err := client.CoreV1().Nodes().Get(ctx, "edge-1", metav1.GetOptions{})
	if err != nil || len(node.Spec.Taints) != 0 {
		t.Errorf("node after the restart: taints %v, %v", node.Spec.Taints, err)
	}
	if _, err := client.AppsV1().Deployments("default").Patch(ctx, "web", "application/merge-patch+json", []byte(`{"spec":{"replicas":3}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a third pod Ready", func() bool { return len(readyPods(ctx, client)) == 3 })

	if err := client.AppsV1().Deployments("default").Delete(ctx, "web", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the pods gone from the node", func() bool {
		left, _ := os.ReadDir(filepath.Join(agentDir, "agent", "pods"))
		pods, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		return err == nil && len(pods.Items) == 0 && len(left) == 0
	})
}

// readyPods are the Ready, Running pods, by UID, with their first
// container's ID and restart count.
func readyPods(ctx context.Context, client kubernetes.Interface) map[string]string {
	pods, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil
	}
	out := map[string]string{}
	for _, p := range pods.Items {
		ready := false
		for _, c := range p.Status.Conditions {
			ready = ready || c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
		}
		if ready && p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == 1 {
			cs := p.Status.ContainerStatuses[0]
			out[string(p.UID)] = cs.ContainerID + " restarts " + strconv.Itoa(int(cs.RestartCount))
		}
	}
	return out
}

func nodeReady(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// buildOrch builds the orch binary into the test's temporary directory.
func buildOrch(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "orch")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/orch-dev/orch").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().(*net.TCPAddr).Port
}

// waitServer waits for a server process to write its admin kubeconfig
// and answer, and returns a client of it.
func waitServer(t testing.TB, kubeconfig string) kubernetes.Interface {
	t.Helper()
	var client kubernetes.Interface
	eventually(t, "the server answering", func() bool {
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return false
		}
		if client, err = kubernetes.NewForConfig(cfg); err != nil {
			return false
		}
		_, err = client.Discovery().ServerVersion()
		return err == nil
	})
	return client
}

// eventually waits up to a minute for cond.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// containerdClient connects to the containerd an agent with data dir
// dir runs, until the test ends.
func containerdClient(t testing.TB, dir string) *containerd.Client {
	t.Helper()
	ctr, err := containerd.New(filepath.Join(dir, "agent", "containerd", "containerd.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ctr.Close() })
	return ctr
}

// taskRunning says whether the container with that ID runs.
func taskRunning(ctx context.Context, ctr *containerd.Client, id string) bool {
	nsCtx := namespaces.WithNamespace(ctx, orchctr.Namespace)
	task, err := loadTask(nsCtx, ctr, id)
	if err != nil {
		return false
	}
	st, err := task.Status(nsCtx)
	return err == nil && st.Status == containerd.Running
}
