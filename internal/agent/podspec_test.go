package agent_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent"
	"github.com/orch-dev/orch/internal/agent/agenttest"
	"github.com/orch-dev/orch/internal/agent/logs"
	"github.com/orch-dev/orch/internal/agent/testimage"
	"github.com/orch-dev/orch/internal/api"
	"github.com/orch-dev/orch/internal/loops"
	"github.com/orch-dev/orch/internal/loops/hollow"
	"github.com/orch-dev/orch/internal/loops/loopstest"
	"google.golang.org/grpc"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
)

// node is a real node for a test: a cluster with the loops, and an agent
// running pods in its own containerd.
type node struct {
	*loopstest.Cluster
	dir  string
	name string
}

// For is n failing t, a subtest, instead of the test that started it.
func (n *node) For(t testing.TB) *node {
	return &node{Cluster: n.Cluster.For(t), dir: n.dir, name: n.name}
}

// startNode starts a cluster and one agent node with the busybox test
// image imported, and waits for the node to be Ready.
func startNode(t testing.TB, name string, options ...func(*agent.Config)) *node {
	t.Helper()
	c, dir := prepareNode(t)
	return startNodeIn(t, c, dir, name, options...)
}

// startNodeIn is startNode on a cluster and data dir from prepareNode.
func startNodeIn(t testing.TB, c *loopstest.Cluster, dir, name string, options ...func(*agent.Config)) *node {
	t.Helper()
	stop := agenttest.RunAgent(t, c.Server.URL(), c.Server.Token(), dir, name, options...)
	t.Cleanup(func() {
		// Pods go first, so that nothing outlives the test.
		_ = c.Client.CoreV1().Pods("default").DeleteCollection(context.Background(), metav1.DeleteOptions{GracePeriodSeconds: agenttest.PtrTo[int64](0)}, metav1.ListOptions{})
		c.Eventually("pods cleaned up on the node", time.Minute, func(ctx context.Context) (bool, error) {
			left, _ := os.ReadDir(filepath.Join(dir, "agent", "pods"))
			return len(left) == 0, nil
		})
		stop()
	})
	waitNodeReady(c, name)
	return &node{Cluster: c, dir: dir, name: name}
}

// prepareNode skips unless this machine can run containers (root,
// containerd, runc, the CNI plugins), starts a cluster, and returns it
// with an agent data dir holding the busybox test image.
func prepareNode(t testing.TB) (*loopstest.Cluster, string) {
	t.Helper()
	return prepareNodeWith(t, nil)
}

// prepareNodeWith is prepareNode with the server's configuration changed
// by configure.
func prepareNodeWith(t testing.TB, configure func(*api.Config)) (*loopstest.Cluster, string) {
	t.Helper()
	dir := agenttest.NodeDataDir(t)
	return loopstest.StartWithServer(t, configure, nil, hollow.Options{LeaseEvery: -1}, loops.Options{}), dir
}

func (n *node) create(t testing.TB, pod *corev1.Pod) {
	t.Helper()
	if pod.Spec.TerminationGracePeriodSeconds == nil {
		pod.Spec.TerminationGracePeriodSeconds = agenttest.PtrTo[int64](1)
	}
	if _, err := n.Client.CoreV1().Pods("default").Create(n.Ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (n *node) pod(ctx context.Context, name string) *corev1.Pod {
	p, err := n.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return &corev1.Pod{}
	}
	return p
}

// waitRunning waits for a pod to be Running with an address.
func (n *node) waitRunning(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	var p *corev1.Pod
	n.Eventually(name+" Running", time.Minute, func(ctx context.Context) (bool, error) {
		p = n.pod(ctx, name)
		return p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "", nil
	})
	return p
}

// output is what a pod's container has written so far.
func (n *node) output(ctx context.Context, pod, container string) string {
	p := n.pod(ctx, pod)
	var b strings.Builder
	_ = logs.Read(ctx, filepath.Join(n.dir, "agent", "pods", string(p.UID), "logs", container, "0.log"), logs.Options{Tail: -1}, &b, func() bool { return false })
	return b.String()
}

// waitOutput waits for a container's output to contain every want.
func (n *node) waitOutput(t *testing.T, pod, container string, want ...string) string {
	t.Helper()
	var out string
	n.Eventually(pod+"/"+container+" printing "+strings.Join(want, ", "), time.Minute, func(ctx context.Context) (bool, error) {
		out = n.output(ctx, pod, container)
		for _, w := range want {
			if !strings.Contains(out, w) {
				return false, nil
			}
		}
		return true, nil
	})
	return out
}

// TestCommandAndArgs runs an image that has both an Entrypoint and a Cmd
// the four ways Kubernetes defines: command and args replace both; command
// alone replaces both (the image's Cmd is dropped); args alone replace
// only the Cmd; neither runs Entrypoint + Cmd. (`kubectl run x --image=y
// -- a b` sets args.)
func TestCommandAndArgs(t *testing.T) {
	c, dir := prepareNode(t)
	if err := testimage.Write(filepath.Join(dir, "agent", "images", "entry.tar"), "docker.io/library/entry:test",
		testimage.Config{Entrypoint: []string{"echo", "entrypoint"}, Cmd: []string{"image-cmd"}}); err != nil {
		t.Fatal(err)
	}
	n := startNodeIn(t, c, dir, "args-node")
	for _, tt := range []struct {
		name          string
		command, args []string
		want          string
	}{
		{"both", []string{"echo", "command"}, []string{"my-args"}, "command my-args\n"},
		{"command", []string{"echo", "command"}, nil, "command\n"},
		{"args", nil, []string{"my-args"}, "entrypoint my-args\n"},
		{"neither", nil, nil, "entrypoint image-cmd\n"},
	} {
		n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: tt.name}, Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "main", Image: "entry:test", Command: tt.command, Args: tt.args}}}})
		defer func() {
			if out := n.waitOutput(t, tt.name, "main", tt.want); out != tt.want {
				t.Errorf("%s: printed %q, want %q", tt.name, out, tt.want)
			}
		}()
	}
}

// TestContainerStartErrors: a container whose process cannot start (here
// a missing binary) is reported as the kubelet reports it: terminated,
// reason StartError, exit code 128, runc's message, a Warning event; it
// restarts with the crash-loop back-off under restartPolicy Always, fails
// its pod under Never, and so fails a Job at its backoffLimit.
func TestContainerStartErrors(t *testing.T) {
	n := startNode(t, "start-errors")
	missing := corev1.Container{Name: "main", Image: "busybox:test", Command: []string{"/no/such/binary"}}
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "never"}, Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{missing}}})
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "always"}, Spec: corev1.PodSpec{Containers: []corev1.Container{missing}}})
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "job"}, Spec: batchv1.JobSpec{BackoffLimit: agenttest.PtrTo[int32](1), Template: corev1.PodTemplateSpec{
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: agenttest.PtrTo[int64](1), Containers: []corev1.Container{missing}}}}}
	if _, err := n.Client.BatchV1().Jobs("default").Create(n.Ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	startError := func(s *corev1.ContainerStateTerminated) bool {
		return s != nil && s.Reason == "StartError" && s.ExitCode == 128 && strings.Contains(s.Message, "/no/such/binary") && strings.Contains(s.Message, "no such file or directory")
	}
	n.Eventually("the Never pod Failed with StartError", time.Minute, func(ctx context.Context) (bool, error) {
		p := n.pod(ctx, "never")
		return p.Status.Phase == corev1.PodFailed && len(p.Status.ContainerStatuses) == 1 && startError(p.Status.ContainerStatuses[0].State.Terminated), nil
	})
	n.Eventually("the Always pod in CrashLoopBackOff after StartErrors", time.Minute, func(ctx context.Context) (bool, error) {
		p := n.pod(ctx, "always")
		if len(p.Status.ContainerStatuses) != 1 {
			return false, nil
		}
		s := p.Status.ContainerStatuses[0]
		return s.RestartCount >= 1 && s.State.Waiting != nil && s.State.Waiting.Reason == "CrashLoopBackOff" && startError(s.LastTerminationState.Terminated), nil
	})
	n.Eventually("the Job failed at its backoffLimit", 2*time.Minute, func(ctx context.Context) (bool, error) {
		j, err := n.Client.BatchV1().Jobs("default").Get(ctx, "job", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range j.Status.Conditions {
			if c.Type == batchv1.JobFailed && c.Status == corev1.ConditionTrue {
				return c.Reason == "BackoffLimitExceeded", nil
			}
		}
		return false, nil
	})
	n.Eventually("a Warning event saying why", 10*time.Second, func(ctx context.Context) (bool, error) {
		events, err := n.Client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=never"})
		if err != nil {
			return false, nil
		}
		for _, e := range events.Items {
			if e.Type == corev1.EventTypeWarning && e.Reason == "Failed" && strings.Contains(e.Message, "/no/such/binary") {
				return true, nil
			}
		}
		return false, nil
	})
	_ = n.Client.BatchV1().Jobs("default").Delete(n.Ctx, "job", metav1.DeleteOptions{PropagationPolicy: agenttest.PtrTo(metav1.DeletePropagationBackground)})
}

// TestPodSpec runs pods that use what the kubelet gives a container (init
// containers, env and volumes from ConfigMaps, Secrets and the downward
// API, hosts and resolv.conf, security context, limits, probes,
// termination messages) on a real node and checks each from inside.
func TestPodSpec(t *testing.T) {
	n := startNode(t, "spec-node")
	core := n.Client.CoreV1()
	if _, err := core.ConfigMaps("default").Create(n.Ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings"},
		Data: map[string]string{"mode": "fast", "level": "3", "app.conf": "listen 8080\n"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := core.Secrets("default").Create(n.Ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "creds"},
		StringData: map[string]string{"password": "s3cret", "user": "admin"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	hostDir := filepath.Join(t.TempDir(), "host", "data")

	// Init containers run in order, each to success, before the app
	// container; they share the pod's emptyDir.
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "init"}, Spec: corev1.PodSpec{
		Volumes: []corev1.Volume{{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		InitContainers: []corev1.Container{
			withMount(agenttest.Busybox("first", "echo first >> /work/order"), "work", "/work"),
			withMount(agenttest.Busybox("second", "sleep 1; echo second >> /work/order"), "work", "/work"),
		},
		Containers: []corev1.Container{withMount(agenttest.Busybox("app", "cat /work/order; sleep 3600"), "work", "/work")},
	}})

	// Env from a ConfigMap, a Secret, the pod's fields and its limits,
	// with $(VAR) expansion and the API server's service link.
	env := agenttest.Busybox("main", "env; sleep 3600")
	env.Args = nil
	env.EnvFrom = []corev1.EnvFromSource{{Prefix: "CFG_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}}}
	env.Env = []corev1.EnvVar{
		{Name: "PASSWORD", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}, Key: "password"}}},
		{Name: "MODE", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}, Key: "mode"}}},
		{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
		{Name: "TIER", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['tier']"}}},
		{Name: "MEM_MB", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.memory", Divisor: resource.MustParse("1Mi")}}},
		{Name: "GREETING", Value: "hello $(POD_NAME) in $(MODE) mode, $$(kept)"},
		{Name: "OPTIONAL", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}, Key: "x", Optional: agenttest.PtrTo(true)}}},
	}
	env.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "env", Labels: map[string]string{"tier": "web"}}, Spec: corev1.PodSpec{Containers: []corev1.Container{env}}})

	// Volumes: a ConfigMap (some keys, one with a mode), a Secret (on
	// tmpfs), the downward API, a hostPath created on demand, a subPath.
	vol := agenttest.Busybox("main", "cat /cfg/conf/app /cfg/level; echo; stat -L -c 'mode=%a' /cfg/level; cat /secret/password; echo; "+
		"grep ' /secret ' /proc/mounts | tr ' ' '\\n' | grep -x tmpfs; cat /meta/labels; echo; echo written > /host/file; "+
		"cat /only-mode; echo; echo end; sleep 3600")
	vol.VolumeMounts = []corev1.VolumeMount{{Name: "cfg", MountPath: "/cfg"}, {Name: "secret", MountPath: "/secret"}, {Name: "meta", MountPath: "/meta"},
		{Name: "host", MountPath: "/host"}, {Name: "cfg", MountPath: "/only-mode", SubPath: "conf/app"}}
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "volumes", Labels: map[string]string{"app": "vol", "tier": "db"}}, Spec: corev1.PodSpec{
		Volumes: []corev1.Volume{
			{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"},
				Items: []corev1.KeyToPath{{Key: "app.conf", Path: "conf/app"}, {Key: "level", Path: "level", Mode: agenttest.PtrTo[int32](0o600)}}}}},
			{Name: "secret", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "creds"}}},
			{Name: "meta", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{
				{Path: "labels", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels"}}}}}},
			{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: hostDir, Type: agenttest.PtrTo(corev1.HostPathDirectoryOrCreate)}}},
		},
		Containers: []corev1.Container{vol},
	}})

	// A ConfigMap that does not exist yet: the container waits, saying
	// why, and starts once it is created.
	late := agenttest.Busybox("main", "echo $LATE; sleep 3600")
	late.Env = []corev1.EnvVar{{Name: "LATE", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "late"}, Key: "v"}}}}
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "late"}, Spec: corev1.PodSpec{Containers: []corev1.Container{late}}})

	// Hosts and DNS files, hostname, and a subdomain.
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "dns"}, Spec: corev1.PodSpec{Hostname: "db-0", Subdomain: "db",
		HostAliases: []corev1.HostAlias{{IP: "10.1.2.3", Hostnames: []string{"legacy.local"}}},
		Containers:  []corev1.Container{agenttest.Busybox("main", "cat /etc/hosts /etc/resolv.conf; hostname; sleep 3600")}}})

	// Security context: user and group, a read-only root filesystem.
	secure := agenttest.Busybox("main", "id; touch /rootfs-write 2>&1 || echo read-only; sleep 3600")
	secure.SecurityContext = &corev1.SecurityContext{RunAsUser: agenttest.PtrTo[int64](1000), ReadOnlyRootFilesystem: agenttest.PtrTo(true)}
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "secure"}, Spec: corev1.PodSpec{
		SecurityContext: &corev1.PodSecurityContext{RunAsGroup: agenttest.PtrTo[int64](2000)}, Containers: []corev1.Container{secure}}})
	nonRoot := agenttest.Busybox("main", "sleep 3600")
	nonRoot.SecurityContext = &corev1.SecurityContext{RunAsNonRoot: agenttest.PtrTo(true)}
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "nonroot"}, Spec: corev1.PodSpec{Containers: []corev1.Container{nonRoot}}})

	// A memory limit kills a hog: OOMKilled.
	hog := agenttest.Busybox("main", "head -c 200000000 /dev/zero | tail")
	hog.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("32Mi")}
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hog"}, Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{hog}}})

	// A termination message, from the file and from the logs.
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "message"}, Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{
		agenttest.Busybox("file", "echo 'disk full' > /dev/termination-log; exit 2"),
		{Name: "logs", Image: "busybox:test", Command: []string{"sh", "-c", "echo last; printf words; exit 3"}, TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError},
		// Not root, at a path of its own.
		{Name: "nonroot", Image: "busybox:test", Command: []string{"sh", "-c", "printf DONE > /dev/termination-custom-log"},
			TerminationMessagePath: "/dev/termination-custom-log", SecurityContext: &corev1.SecurityContext{RunAsUser: agenttest.PtrTo[int64](1000)}},
	}}})

	// hostNetwork: the node's address.
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hostnet"}, Spec: corev1.PodSpec{HostNetwork: true,
		Containers: []corev1.Container{agenttest.Busybox("main", "sleep 3600")}}})

	// Probes: readiness over HTTP gates Ready; a failing liveness exec
	// probe restarts the container; a startup probe holds liveness off.
	// The page the readiness probe asks for is served from a hostPath the
	// test writes to.
	www := filepath.Join(t.TempDir(), "www")
	web := withMount(agenttest.Busybox("web", "httpd -f -p 8080 -h /www"), "www", "/www")
	web.Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}
	web.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/index.html", Port: intstr.FromString("http")}}, PeriodSeconds: 1}
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "ready"}, Spec: corev1.PodSpec{Containers: []corev1.Container{web},
		Volumes: []corev1.Volume{{Name: "www", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: www, Type: agenttest.PtrTo(corev1.HostPathDirectoryOrCreate)}}}}}})
	live := agenttest.Busybox("main", "touch /tmp/healthy; sleep 2; rm /tmp/healthy; sleep 3600")
	live.LivenessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"test", "-f", "/tmp/healthy"}}},
		PeriodSeconds: 1, FailureThreshold: 2, TerminationGracePeriodSeconds: agenttest.PtrTo[int64](1)}
	live.StartupProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: nil, Exec: &corev1.ExecAction{Command: []string{"test", "-f", "/tmp/healthy"}}}, PeriodSeconds: 1}
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "live"}, Spec: corev1.PodSpec{Containers: []corev1.Container{live}}})
	// A gRPC readiness probe asks the standard health service; the one
	// answering is the test's, on the node's address that a hostNetwork
	// pod shares.
	health := grpchealth.NewServer()
	health.SetServingStatus("orch.test", healthpb.HealthCheckResponse_NOT_SERVING)
	grpcLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	grpcSrv := grpc.NewServer()
	healthpb.RegisterHealthServer(grpcSrv, health)
	go func() { _ = grpcSrv.Serve(grpcLn) }()
	defer grpcSrv.Stop()
	// A readiness gate: Ready waits for a condition another controller
	// (here the test) sets, as a load balancer controller does.
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "gated"}, Spec: corev1.PodSpec{
		ReadinessGates: []corev1.PodReadinessGate{{ConditionType: "example.com/lb-registered"}},
		Containers:     []corev1.Container{agenttest.Busybox("main", "sleep 3600")}}})
	rpc := agenttest.Busybox("main", "sleep 3600")
	rpc.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{GRPC: &corev1.GRPCAction{Port: int32(grpcLn.Addr().(*net.TCPAddr).Port), Service: agenttest.PtrTo("orch.test")}}, PeriodSeconds: 1}
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "grpc"}, Spec: corev1.PodSpec{HostNetwork: true, Containers: []corev1.Container{rpc}}})

	// Lifecycle hooks: postStart after the start, preStop before the stop;
	// each leaves a mark in a hostPath.
	hooksDir := filepath.Join(t.TempDir(), "hooks")
	hooked := withMount(agenttest.Busybox("main", "sleep 3600"), "hooks", "/hooks")
	hooked.Lifecycle = &corev1.Lifecycle{
		PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c", "echo started > /hooks/post"}}},
		PreStop:   &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c", "echo stopping > /hooks/pre"}}},
	}
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hooks"}, Spec: corev1.PodSpec{TerminationGracePeriodSeconds: agenttest.PtrTo[int64](10),
		Containers: []corev1.Container{hooked},
		Volumes:    []corev1.Volume{{Name: "hooks", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: hooksDir, Type: agenttest.PtrTo(corev1.HostPathDirectoryOrCreate)}}}}}})

	t.Run("lifecycle hooks", func(t *testing.T) {
		n := n.For(t)
		n.Eventually("postStart ran", time.Minute, func(ctx context.Context) (bool, error) {
			data, _ := os.ReadFile(filepath.Join(hooksDir, "post"))
			return string(data) == "started\n", nil
		})
		if _, err := os.Stat(filepath.Join(hooksDir, "pre")); err == nil {
			t.Fatal("preStop ran before the pod was deleted")
		}
		if err := core.Pods("default").Delete(n.Ctx, "hooks", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		n.Eventually("preStop ran and the pod is gone", time.Minute, func(ctx context.Context) (bool, error) {
			data, _ := os.ReadFile(filepath.Join(hooksDir, "pre"))
			_, err := core.Pods("default").Get(ctx, "hooks", metav1.GetOptions{})
			return string(data) == "stopping\n" && err != nil, nil
		})
	})
	t.Run("init containers", func(t *testing.T) {
		n := n.For(t)
		n.waitOutput(t, "init", "app", "first\nsecond\n")
		// The status follows the output shortly.
		n.Eventually("init containers Completed, the pod Initialized", time.Minute, func(ctx context.Context) (bool, error) {
			p := n.pod(ctx, "init")
			for _, s := range p.Status.InitContainerStatuses {
				if s.State.Terminated == nil || s.State.Terminated.Reason != "Completed" || !s.Ready {
					return false, nil
				}
			}
			return len(p.Status.InitContainerStatuses) == 2 && hasCondition(p, corev1.PodInitialized), nil
		})
	})
	t.Run("env", func(t *testing.T) {
		n := n.For(t)
		p := n.pod(n.Ctx, "env")
		out := n.waitOutput(t, "env", "main", "CFG_mode=fast", "CFG_level=3", "PASSWORD=s3cret", "MODE=fast", "POD_NAME=env", "TIER=web", "MEM_MB=64",
			"GREETING=hello env in fast mode, $(kept)", "KUBERNETES_SERVICE_HOST=", "KUBERNETES_SERVICE_PORT=443")
		n.Eventually("the pod's IP known", time.Minute, func(ctx context.Context) (bool, error) {
			p = n.pod(ctx, "env")
			return p.Status.PodIP != "", nil
		})
		if !strings.Contains(out, "POD_IP="+p.Status.PodIP+"\n") || strings.Contains(out, "OPTIONAL=") {
			t.Errorf("env:\n%s", out)
		}
	})
	t.Run("volumes", func(t *testing.T) {
		n := n.For(t)
		out := n.waitOutput(t, "volumes", "main", "end")
		for _, want := range []string{"listen 8080\n3\nmode=600\n", "s3cret\ntmpfs\n", "app=\"vol\"\ntier=\"db\"\n", "listen 8080\n\nend"} {
			if !strings.Contains(out, want) {
				t.Errorf("volumes: want %q in\n%s", want, out)
			}
		}
		if data, err := os.ReadFile(filepath.Join(hostDir, "file")); err != nil || string(data) != "written\n" {
			t.Errorf("hostPath file: %q %v", data, err)
		}
	})
	t.Run("missing ConfigMap", func(t *testing.T) {
		n := n.For(t)
		n.Eventually("CreateContainerConfigError", time.Minute, func(ctx context.Context) (bool, error) {
			p := n.pod(ctx, "late")
			return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Waiting != nil &&
				p.Status.ContainerStatuses[0].State.Waiting.Reason == "CreateContainerConfigError" &&
				p.Status.ContainerStatuses[0].State.Waiting.Message == `configmap "late" not found`, nil
		})
		if _, err := core.ConfigMaps("default").Create(n.Ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "late"}, Data: map[string]string{"v": "arrived"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		n.waitOutput(t, "late", "main", "arrived")
	})
	t.Run("hosts and DNS", func(t *testing.T) {
		n := n.For(t)
		n.waitOutput(t, "dns", "main", "# Kubernetes-managed hosts file.", "\tdb-0.db.default.svc.cluster.local\tdb-0\n", "10.1.2.3\tlegacy.local",
			"nameserver 10.43.0.10\n", "search default.svc.cluster.local svc.cluster.local cluster.local", "options ndots:5", "\ndb-0\n")
	})
	t.Run("security context", func(t *testing.T) {
		n := n.For(t)
		n.waitOutput(t, "secure", "main", "uid=1000 gid=2000", "read-only")
		n.Eventually("runAsNonRoot refusing a root image", time.Minute, func(ctx context.Context) (bool, error) {
			p := n.pod(ctx, "nonroot")
			return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Waiting != nil &&
				p.Status.ContainerStatuses[0].State.Waiting.Reason == "CreateContainerConfigError", nil
		})
	})
	t.Run("OOMKilled", func(t *testing.T) {
		n := n.For(t)
		n.Eventually("the hog OOMKilled", time.Minute, func(ctx context.Context) (bool, error) {
			p := n.pod(ctx, "hog")
			if p.Status.Phase != corev1.PodFailed || len(p.Status.ContainerStatuses) != 1 {
				return false, nil
			}
			term := p.Status.ContainerStatuses[0].State.Terminated
			return term != nil && term.Reason == "OOMKilled" && term.ExitCode == 137, nil
		})
	})
	t.Run("termination message", func(t *testing.T) {
		n := n.For(t)
		n.Eventually("messages in the status", time.Minute, func(ctx context.Context) (bool, error) {
			p := n.pod(ctx, "message")
			got := map[string]string{}
			for _, s := range p.Status.ContainerStatuses {
				if s.State.Terminated != nil {
					got[s.Name] = s.State.Terminated.Message
				}
			}
			return p.Status.Phase == corev1.PodFailed && got["file"] == "disk full\n" && got["logs"] == "last\nwords" && got["nonroot"] == "DONE", nil
		})
	})
	t.Run("hostNetwork", func(t *testing.T) {
		n := n.For(t)
		n.Eventually("the pod at the node's address", time.Minute, func(ctx context.Context) (bool, error) {
			p := n.pod(ctx, "hostnet")
			return p.Status.Phase == corev1.PodRunning && p.Status.PodIP == "127.0.0.1", nil
		})
	})
	t.Run("probes", func(t *testing.T) {
		n := n.For(t)
		n.Eventually("the web pod Running, not Ready", time.Minute, func(ctx context.Context) (bool, error) {
			p := n.pod(ctx, "ready")
			return p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Running != nil, nil
		})
		time.Sleep(2 * time.Second) // two probe periods
		if p := n.pod(n.Ctx, "ready"); hasCondition(p, corev1.PodReady) || p.Status.ContainerStatuses[0].Ready {
			t.Fatalf("Ready before its readiness probe passed: %+v", p.Status)
		}
		if err := os.WriteFile(filepath.Join(www, "index.html"), []byte("ok\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		n.Eventually("readiness over HTTP", time.Minute, func(ctx context.Context) (bool, error) {
			return hasCondition(n.pod(ctx, "ready"), corev1.PodReady), nil
		})
		n.Eventually("liveness restarting the container", time.Minute, func(ctx context.Context) (bool, error) {
			p := n.pod(ctx, "live")
			return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount >= 1, nil
		})
		if p := n.pod(n.Ctx, "grpc"); p.Status.Phase != corev1.PodRunning || hasCondition(p, corev1.PodReady) {
			t.Fatalf("gRPC probe: %s, Ready while NOT_SERVING: %+v", p.Status.Phase, p.Status.Conditions)
		}
		gateMessage := `corresponding condition of pod readiness gate "example.com/lb-registered" does not exist.`
		n.Eventually("the gated pod Running, its containers ready, the pod not", time.Minute, func(ctx context.Context) (bool, error) {
			p := n.pod(ctx, "gated")
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady {
					return hasCondition(p, corev1.ContainersReady) && c.Status == corev1.ConditionFalse && c.Reason == "ReadinessGatesNotReady" && c.Message == gateMessage, nil
				}
			}
			return false, nil
		})
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			p := n.pod(n.Ctx, "gated")
			p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: "example.com/lb-registered", Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()})
			_, err := core.Pods("default").UpdateStatus(n.Ctx, p, metav1.UpdateOptions{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		n.Eventually("Ready once the gate's condition is True", time.Minute, func(ctx context.Context) (bool, error) {
			return hasCondition(n.pod(ctx, "gated"), corev1.PodReady), nil
		})
		health.SetServingStatus("orch.test", healthpb.HealthCheckResponse_SERVING)
		n.Eventually("readiness over gRPC", time.Minute, func(ctx context.Context) (bool, error) {
			return hasCondition(n.pod(ctx, "grpc"), corev1.PodReady), nil
		})
		health.SetServingStatus("orch.test", healthpb.HealthCheckResponse_NOT_SERVING)
		n.Eventually("not ready again over gRPC", time.Minute, func(ctx context.Context) (bool, error) {
			return !hasCondition(n.pod(ctx, "grpc"), corev1.PodReady), nil
		})
	})
}

func withMount(c corev1.Container, volume, path string) corev1.Container {
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: volume, MountPath: path})
	return c
}

func hasCondition(p *corev1.Pod, t corev1.PodConditionType) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == t {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// TestPodSharedNamespaces: as with Kubernetes' pause container, the
// containers of a pod share an IPC namespace, a UTS namespace (the pod's
// hostname) and a 64 MiB /dev/shm, which other pods do not see;
// hostIPC and hostNetwork pods get the node's. A pod asking to share its
// process namespace, which needs a pause process orch does not run, is
// warned of it in its events.
func TestPodSharedNamespaces(t *testing.T) {
	n := startNode(t, "sharing-node")
	const report = `echo ipc=$(readlink /proc/self/ns/ipc) uts=$(readlink /proc/self/ns/uts) host=$(hostname) shm=$(df -k /dev/shm | tail -1 | awk '{print $2}')`
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sharing"}, Spec: corev1.PodSpec{Containers: []corev1.Container{
		agenttest.Busybox("a", "echo from-a > /dev/shm/note; "+report+"; sleep 3600"),
		agenttest.Busybox("b", "until [ -f /dev/shm/note ]; do sleep 0.1; done; "+report+" note=$(cat /dev/shm/note); sleep 3600"),
	}}})
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "other"}, Spec: corev1.PodSpec{Containers: []corev1.Container{
		agenttest.Busybox("main", "ls /dev/shm; "+report+"; sleep 3600"),
	}}})
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "host"}, Spec: corev1.PodSpec{HostIPC: true, HostNetwork: true, Containers: []corev1.Container{
		agenttest.Busybox("main", report+"; sleep 3600"),
	}}})
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pids"}, Spec: corev1.PodSpec{ShareProcessNamespace: agenttest.PtrTo(true), Containers: []corev1.Container{
		agenttest.Busybox("main", "sleep 3600"),
	}}})
	n.Eventually("a warning that the pod's process namespace is not shared", time.Minute, func(ctx context.Context) (bool, error) {
		l, err := n.Client.EventsV1().Events("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, e := range l.Items {
			if e.Regarding.Name == "pids" && e.Reason == "ShareProcessNamespaceUnsupported" && e.Type == corev1.EventTypeWarning {
				return true, nil
			}
		}
		return false, nil
	})
	fields := func(pod, container string) map[string]string {
		out := map[string]string{}
		for _, f := range strings.Fields(n.waitOutput(t, pod, container, "ipc=")) {
			if k, v, ok := strings.Cut(f, "="); ok {
				out[k] = v
			}
		}
		return out
	}
	a, b, other, host := fields("sharing", "a"), fields("sharing", "b"), fields("other", "main"), fields("host", "main")
	if a["ipc"] != b["ipc"] || a["uts"] != b["uts"] || a["ipc"] == "" || a["uts"] == "" {
		t.Errorf("the containers of a pod do not share IPC and UTS namespaces: %v and %v", a, b)
	}
	if b["note"] != "from-a" || a["host"] != "sharing" || b["host"] != "sharing" || a["shm"] != "65536" {
		t.Errorf("shared /dev/shm and hostname: %v and %v", a, b)
	}
	if other["ipc"] == a["ipc"] || other["uts"] == a["uts"] || strings.Contains(n.output(n.Ctx, "other", "main"), "note") {
		t.Errorf("another pod shares the first's namespaces or /dev/shm: %v and %v", other, a)
	}
	self := func(kind string) string {
		link, err := os.Readlink("/proc/self/ns/" + kind)
		if err != nil {
			t.Fatal(err)
		}
		return link
	}
	hostname, _ := os.Hostname()
	if host["ipc"] != self("ipc") || host["uts"] != self("uts") || host["host"] != hostname {
		t.Errorf("a hostIPC, hostNetwork pod: %v; the node has ipc %s, uts %s, hostname %s", host, self("ipc"), self("uts"), hostname)
	}
}

// TestPodPrivilegesAndKernel: what a container may do, as the kubelet sets
// it up: the default capability set, capabilities dropped and added,
// privileged containers (every capability, mounts); no_new_privs only
// with allowPrivilegeEscalation false; the pod's sysctls;
// fsGroup owning its volumes; projected volumes; an emptyDir in memory
// with its size limit.
func TestPodPrivilegesAndKernel(t *testing.T) {
	n := startNode(t, "privileges-node")
	core := n.Client.CoreV1()
	if _, err := core.ConfigMaps("default").Create(n.Ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "app"},
		Data: map[string]string{"mode": "fast"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := core.Secrets("default").Create(n.Ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "key"},
		StringData: map[string]string{"token": "t0k3n"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const caps = "grep -e CapEff -e NoNewPrivs /proc/self/status; touch /f; chown 1 /f && echo chown-ok || echo chown-denied; " +
		"mkdir -p /m; mount -t tmpfs none /m 2>/dev/null && echo mount-ok || echo mount-denied; echo end; sleep 3600"
	dropped := agenttest.Busybox("main", caps)
	dropped.SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"NET_ADMIN"}}}
	privileged := agenttest.Busybox("main", caps)
	privileged.SecurityContext = &corev1.SecurityContext{Privileged: agenttest.PtrTo(true)}
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "default-caps"}, Spec: corev1.PodSpec{Containers: []corev1.Container{agenttest.Busybox("main", caps)}}})
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "dropped-caps"}, Spec: corev1.PodSpec{Containers: []corev1.Container{dropped}}})
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "privileged"}, Spec: corev1.PodSpec{Containers: []corev1.Container{privileged}}})
	noEscalation := agenttest.Busybox("main", caps)
	noEscalation.SecurityContext = &corev1.SecurityContext{AllowPrivilegeEscalation: agenttest.PtrTo(false)}
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "no-escalation"}, Spec: corev1.PodSpec{Containers: []corev1.Container{noEscalation}}})

	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sysctls"}, Spec: corev1.PodSpec{
		SecurityContext: &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{{Name: "net.ipv4.ip_unprivileged_port_start", Value: "80"}, {Name: "kernel.shm_rmid_forced", Value: "1"}}},
		Containers:      []corev1.Container{agenttest.Busybox("main", "echo port=$(cat /proc/sys/net/ipv4/ip_unprivileged_port_start) shm=$(cat /proc/sys/kernel/shm_rmid_forced); sleep 3600")}}})

	owned := agenttest.Busybox("main", "id -G; stat -L -c 'secret-group=%g' /key/token; echo data > /scratch/x && stat -c 'scratch-group=%g' /scratch/x; "+
		"cat /all/mode /all/token /all/name; echo; grep ' /scratch ' /proc/mounts; echo end; sleep 3600")
	owned.VolumeMounts = []corev1.VolumeMount{{Name: "key", MountPath: "/key"}, {Name: "scratch", MountPath: "/scratch"}, {Name: "all", MountPath: "/all"}}
	n.create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "owned"}, Spec: corev1.PodSpec{
		SecurityContext: &corev1.PodSecurityContext{RunAsUser: agenttest.PtrTo[int64](1000), FSGroup: agenttest.PtrTo[int64](3000)},
		Volumes: []corev1.Volume{
			{Name: "key", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "key"}}},
			{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: agenttest.PtrTo(resource.MustParse("16Mi"))}}},
			{Name: "all", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
				{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "app"}}},
				{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "key"}}},
				{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "name", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}},
			}}}},
		},
		Containers: []corev1.Container{owned}}})

	capEff := func(out string) string {
		for _, f := range strings.Split(out, "\n") {
			if v, ok := strings.CutPrefix(f, "CapEff:"); ok {
				return strings.TrimSpace(v)
			}
		}
		return ""
	}
	// The default set is containerd's (and Docker's): 0xa80425fb.
	// A setuid program may elevate unless allowPrivilegeEscalation is
	// false, as the kubelet sets no_new_privs.
	if out := n.waitOutput(t, "default-caps", "main", "end"); capEff(out) != "00000000a80425fb" || !strings.Contains(out, "chown-ok") || !strings.Contains(out, "mount-denied") ||
		!strings.Contains(out, "NoNewPrivs:\t0") {
		t.Errorf("default capabilities:\n%s", out)
	}
	if out := n.waitOutput(t, "no-escalation", "main", "end"); !strings.Contains(out, "NoNewPrivs:\t1") {
		t.Errorf("allowPrivilegeEscalation: false:\n%s", out)
	}
	// NET_ADMIN is bit 12; without CAP_CHOWN even root cannot chown.
	if out := n.waitOutput(t, "dropped-caps", "main", "end"); capEff(out) != "0000000000001000" || !strings.Contains(out, "chown-denied") {
		t.Errorf("capabilities drop ALL, add NET_ADMIN:\n%s", out)
	}
	if out := n.waitOutput(t, "privileged", "main", "end"); !strings.Contains(out, "mount-ok") || strings.HasPrefix(capEff(out), "00000000a8") {
		t.Errorf("privileged:\n%s", out)
	}
	if out := n.waitOutput(t, "sysctls", "main", "port="); !strings.Contains(out, "port=80 shm=1") {
		t.Errorf("pod sysctls: %q", out)
	}
	out := n.waitOutput(t, "owned", "main", "end")
	for _, want := range []string{"3000", "secret-group=3000", "scratch-group=3000", "fastt0k3nowned", "tmpfs", "size=16384k"} {
		if !strings.Contains(out, want) {
			t.Errorf("fsGroup, projected and memory volumes: no %q in\n%s", want, out)
		}
	}
}
