package agent_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/orch-dev/orch/internal/agent"
	"github.com/orch-dev/orch/internal/agent/agenttest"
	"github.com/orch-dev/orch/internal/api"
	"github.com/orch-dev/orch/internal/api/apitest"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/utils/exec"
)

// TestKubectlLogs: stock kubectl reads container logs through the API
// server, which proxies to the node's kubelet API: whole, tailed, with
// timestamps, of the previous run, of a named container, followed as
// lines arrive; and says why when there is nothing to read.
func TestKubectlLogs(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kubectl")
	}
	n := startNode(t, "logs-node")
	k := apitest.NewKubectl(t, n.Server.Kubeconfig)

	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "counter"}, Spec: corev1.PodSpec{Containers: []corev1.Container{
		agenttest.Busybox("count", "for i in 1 2 3 4 5; do echo line $i; done; sleep 0.5; echo to stderr >&2; sleep 3600"),
		agenttest.Busybox("side", "echo from the side; sleep 3600"),
	}}})
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "ticker"}, Spec: corev1.PodSpec{Containers: []corev1.Container{
		agenttest.Busybox("tick", "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.2; done"),
	}}})
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "crasher"}, Spec: corev1.PodSpec{Containers: []corev1.Container{
		agenttest.Busybox("main", "echo run at $(cat /proc/uptime); exit 1"),
	}}})
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "waiting"}, Spec: corev1.PodSpec{Containers: []corev1.Container{
		{Name: "main", Image: "example.com/not-here:1"},
	}}})
	n.waitOutput(t, "counter", "count", "to stderr")
	n.waitOutput(t, "counter", "side", "from the side")

	if out := k.Run("logs", "counter", "-c", "count"); out != "line 1\nline 2\nline 3\nline 4\nline 5\nto stderr\n" {
		t.Errorf("kubectl logs:\n%q", out)
	}
	// Over a websocket, as Kubernetes' conformance suite and web consoles
	// read it: the log in binary messages, then the socket closed.
	for _, protocol := range []string{"binary.k8s.io", "base64.binary.k8s.io"} {
		if got, err := logOverWebSocket(n, "counter", "count", protocol); err != nil || got != "line 1\nline 2\nline 3\nline 4\nline 5\nto stderr\n" {
			t.Errorf("the log over a %s websocket: %q, %v", protocol, got, err)
		}
	}
	if out := k.Run("logs", "counter", "-c", "count", "--tail=2"); out != "line 5\nto stderr\n" {
		t.Errorf("kubectl logs --tail=2:\n%q", out)
	}
	if out := k.Run("logs", "counter", "-c", "side", "--timestamps"); !strings.HasSuffix(out, "Z from the side\n") ||
		!strings.HasPrefix(out, time.Now().UTC().Format("2006-01-02T")) {
		t.Errorf("kubectl logs --timestamps:\n%q", out)
	}
	if out := k.Run("logs", "counter", "-c", "count", "--limit-bytes=8"); out != "line 1\nl" {
		t.Errorf("kubectl logs --limit-bytes=8: %q", out)
	}
	if out := k.Run("logs", "counter", "-c", "count", "--since=1h"); !strings.Contains(out, "line 1") {
		t.Errorf("kubectl logs --since=1h: %q", out)
	}
	// kubectl picks the first container itself, saying so; the API asks
	// for a name, in kube-apiserver's words.
	if out := k.Run("logs", "counter"); !strings.HasPrefix(out, `Defaulted container "count" out of: count, side`) {
		t.Errorf("kubectl logs of a two-container pod without -c:\n%s", out)
	}
	if _, err := n.Client.CoreV1().Pods("default").GetLogs("counter", &corev1.PodLogOptions{}).Stream(n.Ctx); err == nil ||
		!strings.Contains(err.Error(), "a container name must be specified for pod counter, choose one of: [count side]") {
		t.Errorf("pods/log of a two-container pod without a container: %v", err)
	}
	// kubectl asks for the default container when the annotation names it.
	if _, err := n.Client.CoreV1().Pods("default").Patch(n.Ctx, "counter", "application/merge-patch+json",
		[]byte(`{"metadata":{"annotations":{"kubectl.kubernetes.io/default-container":"side"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if out := k.Run("logs", "counter"); out != "from the side\n" {
		t.Errorf("kubectl logs with a default container: %q", out)
	}

	// --previous: the run before the current one.
	n.Eventually("the crasher restarted", time.Minute, func(ctx context.Context) (bool, error) {
		p := n.pod(ctx, "crasher")
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount >= 1, nil
	})
	if out := k.Run("logs", "crasher", "--previous"); !strings.HasPrefix(out, "run at ") {
		t.Errorf("kubectl logs --previous: %q", out)
	}
	if out, err := k.Try("logs", "ticker", "--previous"); err == nil || !strings.Contains(out, `previous terminated container "tick" in pod "ticker" not found`) {
		t.Errorf("kubectl logs --previous of a first run: %v %s", err, out)
	}
	n.Eventually("the waiting pod reported", time.Minute, func(ctx context.Context) (bool, error) {
		p := n.pod(ctx, "waiting")
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Waiting != nil, nil
	})
	if out, err := k.Try("logs", "waiting"); err == nil || !strings.Contains(out, `container "main" in pod "waiting" is waiting to start: ErrImagePull`) {
		t.Errorf("kubectl logs of a pod that never started: %v %s", err, out)
	}

	// kubectl describe lists the kubelet's events, in its words.
	for pod, want := range map[string][]string{
		"crasher": {`Pulled     `, `Container image "busybox:test" already present on machine`, "Created container: main", "Started container main",
			"Back-off restarting failed container main in pod crasher_default", "kubelet"},
		"waiting": {`Pulling image "example.com/not-here:1"`, `Failed to pull image "example.com/not-here:1"`, "Error: ErrImagePull"},
	} {
		n.Eventually("kubectl describe pod "+pod+" listing the kubelet's events", time.Minute, func(context.Context) (bool, error) {
			out := k.Run("describe", "pod", pod)
			for _, w := range want {
				if !strings.Contains(out, w) {
					return false, nil
				}
			}
			return true, nil
		})
	}

	// -f streams lines as they are written.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := k.Command(ctx, nil, "logs", "-f", "ticker", "--tail=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	var got []string
	start := time.Now()
	for len(got) < 10 && lines.Scan() {
		got = append(got, lines.Text())
	}
	elapsed := time.Since(start)
	cancel()
	_ = cmd.Wait()
	if len(got) < 10 || elapsed < time.Second {
		t.Errorf("kubectl logs -f gave %d lines in %s (want 10 arriving over ~2 s): %v", len(got), elapsed, got)
	}
	for i := 1; i < len(got); i++ {
		var a, b int
		if _, err := fmt.Sscanf(got[i-1], "tick %d", &a); err != nil {
			t.Fatal(err)
		}
		if _, err := fmt.Sscanf(got[i], "tick %d", &b); err != nil {
			t.Fatal(err)
		}
		if b != a+1 {
			t.Errorf("followed lines out of order: %v", got)
			break
		}
	}
}

// TestKubeletAPIRefusesOthers: the node's :10250 API answers the API
// server's certificate only; a node's own (same CA) gets 403 and no
// certificate gets no connection.
func TestKubeletAPIRefusesOthers(t *testing.T) {
	n := startNode(t, "guarded")
	node, err := n.Client.CoreV1().Nodes().Get(n.Ctx, "guarded", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	port := node.Status.DaemonEndpoints.KubeletEndpoint.Port
	if port == 0 {
		t.Fatal("the node does not say where its kubelet API is")
	}
	tlsDir := filepath.Join(n.dir, "agent", "tls")
	ca, _ := os.ReadFile(filepath.Join(tlsDir, "ca.crt"))
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	cert, err := tls.LoadX509KeyPair(filepath.Join(tlsDir, "client.crt"), filepath.Join(tlsDir, "client.key"))
	if err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("https://127.0.0.1:%d/containerLogs/default/x/y", port)
	asNode := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}}}
	resp, err := asNode.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("a node's certificate got %s", resp.Status)
	}
	anonymous := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	if resp, err := anonymous.Get(url); err == nil {
		_ = resp.Body.Close()
		t.Errorf("no certificate got %s", resp.Status)
	}
}

// TestKubectlExecPortForward: stock kubectl execs commands in a running
// container (output, stderr, stdin, exit codes) and forwards a local port
// to one the pod listens on only inside its network namespace.
func TestKubectlExecPortForward(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kubectl")
	}
	n := startNode(t, "exec-node")
	k := apitest.NewKubectl(t, n.Server.Kubeconfig)

	// The seed articles' flow, to the end: a Deployment's pods Running
	// with addresses from the node's pod network.
	k.Run("create", "deployment", "web", "--image=busybox:test", "--replicas=2", "--", "sleep", "3600")
	if out := k.Run("rollout", "status", "deployment/web", "--timeout=60s"); !strings.Contains(out, `deployment "web" successfully rolled out`) {
		t.Fatalf("rollout status: %s", out)
	}
	if out := k.Run("get", "pods", "-l", "app=web", "-o", "wide"); strings.Count(out, "Running") != 2 || strings.Count(out, " 10.42.") != 2 || !strings.Contains(out, "exec-node") {
		t.Errorf("kubectl get pods -o wide:\n%s", out)
	}
	k.Run("delete", "deployment", "web")
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "shell"}, Spec: corev1.PodSpec{Containers: []corev1.Container{
		agenttest.Busybox("main", "mkdir -p /www; echo served from inside > /www/index.html; httpd -f -p 127.0.0.1:8080 -h /www"),
	}}})
	n.Eventually("the shell pod Running", time.Minute, func(ctx context.Context) (bool, error) {
		return n.pod(ctx, "shell").Status.Phase == corev1.PodRunning, nil
	})

	if out := k.Run("exec", "shell", "--", "sh", "-c", "echo hi from $(hostname); echo oops >&2"); out != "hi from shell\noops\n" && out != "oops\nhi from shell\n" {
		t.Errorf("kubectl exec: %q", out)
	}
	out, err := k.Try("exec", "shell", "--", "sh", "-c", "exit 3")
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != 3 {
		t.Errorf("kubectl exec of exit 3: %v %q", err, out)
	}
	cmd := k.Command(n.Ctx, nil, "exec", "-i", "shell", "--", "sh", "-c", "cat; echo done")
	cmd.Stdin = strings.NewReader("piped in\n")
	if out, err := cmd.CombinedOutput(); err != nil || string(out) != "piped in\ndone\n" {
		t.Errorf("kubectl exec -i: %v %q", err, out)
	}
	if out, err := k.Try("exec", "shell", "-c", "nope", "--", "true"); err == nil || !strings.Contains(out, "container nope is not valid for pod shell") {
		t.Errorf("kubectl exec into a container the pod lacks: %v %s", err, out)
	}
	// The websocket protocol kubectl tries first (v5) is served, without
	// falling back to SPDY: stdin and its close, stdout, stderr, exit code.
	req := n.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace("default").Name("shell").SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: "main", Command: []string{"sh", "-c", "cat; echo err >&2; exit 4"}, Stdin: true, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(n.Server.Admin, "GET", req.URL().String())
	if err != nil {
		t.Fatal(err)
	}
	var wsOut, wsErr strings.Builder
	err = ws.StreamWithContext(n.Ctx, remotecommand.StreamOptions{Stdin: strings.NewReader("over websocket\n"), Stdout: &wsOut, Stderr: &wsErr})
	var codeErr utilexec.ExitError
	if !errors.As(err, &codeErr) || codeErr.ExitStatus() != 4 || wsOut.String() != "over websocket\n" || wsErr.String() != "err\n" {
		t.Errorf("exec over websocket v5: %v, stdout %q, stderr %q", err, wsOut.String(), wsErr.String())
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pf := k.Command(ctx, nil, "port-forward", "pod/shell", ":8080")
	stdout, err := pf.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := pf.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = pf.Wait() }()
	lines := bufio.NewScanner(stdout)
	var local string
	for lines.Scan() {
		// Forwarding from 127.0.0.1:39157 -> 8080
		if _, err := fmt.Sscanf(lines.Text(), "Forwarding from 127.0.0.1:%s", &local); err == nil {
			break
		}
	}
	if local == "" {
		t.Fatal("kubectl port-forward printed no local port")
	}
	for i := range 2 { // two connections over one forward
		resp, err := http.Get("http://127.0.0.1:" + local + "/index.html")
		if err != nil {
			t.Fatalf("request %d through port-forward: %v", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if string(body) != "served from inside\n" {
			t.Errorf("request %d through port-forward: %s %q", i, resp.Status, body)
		}
	}
}

// TestKubectlAttachRun: `kubectl run -i --rm` runs a one-off pod fed from
// the caller's stdin, prints its output, returns its exit code and deletes
// it; `kubectl attach -i` joins a running container's stdin and output
// (which its log gets too) and leaves it running when the input ends; a
// container with a terminal is attached over the v5 websocket with its
// terminal (TERM=xterm, resizable); and `kubectl exec -it` and `kubectl
// run -it --rm`, run at a real (pseudo-)terminal, give a shell one.
func TestKubectlAttachRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kubectl")
	}
	n := startNode(t, "attach-node")
	k := apitest.NewKubectl(t, n.Server.Kubeconfig)

	run := k.Command(n.Ctx, nil, "run", "oneoff", "-i", "--rm", "--restart=Never", "--image=busybox:test", "--command", "--", "sh", "-c", "read line; echo got $line; exit 3")
	run.Stdin = strings.NewReader("hello\n")
	out, err := run.CombinedOutput()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != 3 || !strings.Contains(string(out), "got hello\n") || !strings.Contains(string(out), `pod "oneoff" deleted`) {
		t.Errorf("kubectl run -i --rm: %v\n%s", err, out)
	}
	if _, err := n.Client.CoreV1().Pods("default").Get(n.Ctx, "oneoff", metav1.GetOptions{}); err == nil {
		t.Error("kubectl run --rm left its pod")
	}

	echo := agenttest.Busybox("main", "while read l; do echo echo:$l; done")
	echo.Stdin = true
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "echo"}, Spec: corev1.PodSpec{Containers: []corev1.Container{echo}}})
	n.Eventually("the echo pod Running", time.Minute, func(ctx context.Context) (bool, error) {
		return n.pod(ctx, "echo").Status.Phase == corev1.PodRunning, nil
	})
	for _, word := range []string{"one", "two"} { // stdin stays open between sessions
		attach := k.Command(n.Ctx, nil, "attach", "-i", "echo")
		stdin, err := attach.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := attach.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := attach.Start(); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(stdin, word+"\n"); err != nil {
			t.Fatal(err)
		}
		lines := bufio.NewScanner(stdout)
		for lines.Scan() && lines.Text() != "echo:"+word {
		}
		// The session ends with its input; the container goes on.
		_ = stdin.Close()
		_, _ = io.Copy(io.Discard, stdout)
		if err := attach.Wait(); err != nil || lines.Text() != "echo:"+word {
			t.Errorf("kubectl attach -i with %q: %v, last line %q", word, err, lines.Text())
		}
	}
	n.waitOutput(t, "echo", "main", "echo:one", "echo:two")
	if p := n.pod(n.Ctx, "echo"); p.Status.Phase != corev1.PodRunning || p.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("after the attach sessions the echo pod is %s, restarted %d times", p.Status.Phase, p.Status.ContainerStatuses[0].RestartCount)
	}
	if out, err := k.Try("attach", "-c", "nope", "echo"); err == nil || !strings.Contains(out, "nope") {
		t.Errorf("kubectl attach to a container the pod lacks: %v %s", err, out)
	}

	term := agenttest.Busybox("main", "sh")
	term.Stdin, term.TTY = true, true
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "term"}, Spec: corev1.PodSpec{Containers: []corev1.Container{term}}})
	n.Eventually("the term pod Running", time.Minute, func(ctx context.Context) (bool, error) {
		return n.pod(ctx, "term").Status.Phase == corev1.PodRunning, nil
	})
	req := n.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace("default").Name("term").SubResource("attach").
		VersionedParams(&corev1.PodAttachOptions{Container: "main", Stdin: true, Stdout: true, TTY: true}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(n.Server.Admin, "GET", req.URL().String())
	if err != nil {
		t.Fatal(err)
	}
	stdinR, stdinW := io.Pipe()
	defer func() { _ = stdinW.Close() }()
	var termOut syncBuffer
	done := make(chan error, 1)
	sizes := &fixedSize{&remotecommand.TerminalSize{Width: 123, Height: 45}}
	go func() {
		done <- ws.StreamWithContext(n.Ctx, remotecommand.StreamOptions{Stdin: stdinR, Stdout: &termOut, Tty: true, TerminalSizeQueue: sizes})
	}()
	for _, line := range []string{"echo term=$TERM", "stty size"} {
		if _, err := io.WriteString(stdinW, line+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	n.Eventually("the terminal's answers", time.Minute, func(context.Context) (bool, error) {
		return strings.Contains(termOut.String(), "term=xterm") && strings.Contains(termOut.String(), "45 123"), nil
	})
	_, _ = io.WriteString(stdinW, "exit\n")
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("attach with a terminal: %v", err)
		}
	case <-time.After(time.Minute):
		t.Error("the attach session did not end with the shell")
	}

	// At a real terminal, as a user types: kubectl puts the terminal in
	// raw mode and sends its size, and the shell in the container has a
	// terminal of that size.
	for _, args := range [][]string{
		{"exec", "-it", "echo", "--", "sh"},
		{"run", "shell", "-it", "--rm", "--restart=Never", "--image=busybox:test", "--command", "--", "sh"},
	} {
		master, slave := openTerminal(t, 37, 111)
		cmd := k.Command(n.Ctx, []string{"TERM=xterm"}, args...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		_ = slave.Close()
		var screen syncBuffer
		go func() { _, _ = io.Copy(&screen, master) }() // ends with EIO once kubectl is gone
		n.Eventually("kubectl "+args[0]+" -it: the shell's prompt", time.Minute, func(context.Context) (bool, error) {
			return strings.Contains(screen.String(), "# "), nil
		})
		_, _ = io.WriteString(master, "echo on $(tty); stty size\r")
		n.Eventually("kubectl "+args[0]+" -it: the terminal's answers", time.Minute, func(context.Context) (bool, error) {
			return strings.Contains(screen.String(), "on /dev/pts/0") && strings.Contains(screen.String(), "37 111"), nil
		})
		// Nothing but what the shell wrote: no stray bytes of the stream's
		// own (a NUL seen when the session's stdin was a closed pipe was
		// that pipe's end, echoed by the container's terminal, as it is on
		// Kubernetes).
		if strings.ContainsRune(screen.String(), 0) {
			t.Errorf("kubectl %s -it: a NUL byte on the terminal: %q", args[0], screen.String())
		}
		_, _ = io.WriteString(master, "exit\r")
		waited := make(chan error, 1)
		go func() { waited <- cmd.Wait() }()
		select {
		case err := <-waited:
			if err != nil {
				t.Errorf("kubectl %s -it: %v\n%s", args[0], err, screen.String())
			}
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
			t.Errorf("kubectl %s -it did not end with the shell:\n%s", args[0], screen.String())
		}
	}
	if _, err := n.Client.CoreV1().Pods("default").Get(n.Ctx, "shell", metav1.GetOptions{}); err == nil {
		t.Error("kubectl run -it --rm left its pod")
	}
}

// syncBuffer is a strings.Builder safe for a writer and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// fixedSize is a terminal that is one size, reported once (nil ends the
// client's resizing).
type fixedSize struct{ size *remotecommand.TerminalSize }

func (f *fixedSize) Next() *remotecommand.TerminalSize {
	s := f.size
	f.size = nil
	return s
}

// openTerminal opens a pseudo-terminal of rows by cols: the caller talks
// through master; a program run on slave has a real terminal.
func openTerminal(t *testing.T, rows, cols uint16) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlock pty: %v", err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("pty number: %v", err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlSetWinsize(int(s.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols}); err != nil {
		t.Fatalf("terminal size: %v", err)
	}
	return m, s
}

// TestPodsReachedThroughTheirNode: a server that is not on the pod
// network (--disable-agent) reaches pods through their node's kubelet
// API: pods/proxy and services/proxy answer from a pod's port, a pod the
// node does not run is refused, and the tunnel answers the API server's
// certificate only.
func TestPodsReachedThroughTheirNode(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a pod")
	}
	c, dir := prepareNodeWith(t, func(cfg *api.Config) { cfg.PodsBehindNodes = true })
	n := startNodeIn(t, c, dir, "tunnelled")
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: map[string]string{"app": "web"}}, Spec: corev1.PodSpec{Containers: []corev1.Container{
		agenttest.Busybox("main", "mkdir -p /www; echo served by $(hostname) > /www/index.html; httpd -f -p 8080 -h /www"),
	}}})
	if _, err := n.Client.CoreV1().Services("default").Create(n.Ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	n.Eventually("the web pod Ready", time.Minute, func(ctx context.Context) (bool, error) {
		for _, c := range n.pod(ctx, "web").Status.Conditions {
			if c.Type == corev1.PodReady {
				return c.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	})
	pods, services := n.Client.CoreV1().Pods("default"), n.Client.CoreV1().Services("default")
	if out, err := pods.ProxyGet("http", "web", "8080", "/index.html", nil).DoRaw(n.Ctx); err != nil || string(out) != "served by web\n" {
		t.Errorf("pods/proxy through the node: %v %q", err, out)
	}
	n.Eventually("services/proxy through the node", time.Minute, func(ctx context.Context) (bool, error) {
		out, err := services.ProxyGet("http", "web", "80", "/index.html", nil).DoRaw(ctx)
		return err == nil && string(out) == "served by web\n", nil
	})
	if out, err := pods.ProxyGet("http", "web", "8081", "/", nil).DoRaw(n.Ctx); err == nil {
		t.Errorf("a port nothing listens on answered: %q", out)
	}

	node, err := n.Client.CoreV1().Nodes().Get(n.Ctx, "tunnelled", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tlsDir := filepath.Join(n.dir, "agent", "tls")
	cert, err := tls.LoadX509KeyPair(filepath.Join(tlsDir, "client.crt"), filepath.Join(tlsDir, "client.key"))
	if err != nil {
		t.Fatal(err)
	}
	asNode := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{cert}}}} //nolint:gosec // only the answer's status matters
	req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d/podTunnel/default/web/8080", node.Status.DaemonEndpoints.KubeletEndpoint.Port), nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", agent.TunnelProtocol)
	resp, err := asNode.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("a node's certificate asking for a tunnel got %s", resp.Status)
	}
}

// logOverWebSocket reads a container's whole log through the API server
// over a websocket of protocol.
func logOverWebSocket(n *node, pod, container, protocol string) (string, error) {
	u := n.Client.CoreV1().RESTClient().Get().Namespace("default").Resource("pods").Name(pod).SubResource("log").Param("container", container).URL()
	u.Scheme = "wss"
	tlsConfig, err := rest.TLSConfigFor(n.Server.Admin)
	if err != nil {
		return "", err
	}
	header := http.Header{}
	if token := n.Server.Admin.BearerToken; token != "" {
		header.Set("Authorization", "Bearer "+token)
	}
	dialer := websocket.Dialer{TLSClientConfig: tlsConfig, Subprotocols: []string{protocol}}
	conn, resp, err := dialer.DialContext(n.Ctx, u.String(), header)
	if err != nil {
		return "", err
	}
	defer func() { _ = conn.Close() }()
	_ = resp.Body.Close()
	var got strings.Builder
	for {
		_, msg, err := conn.ReadMessage()
		if err != nil {
			var closed *websocket.CloseError
			if errors.As(err, &closed) {
				return got.String(), nil
			}
			return got.String(), err
		}
		if strings.HasPrefix(protocol, "base64") {
			if msg, err = base64.StdEncoding.DecodeString(string(msg)); err != nil {
				return got.String(), err
			}
		}
		got.Write(msg)
	}
}
