package pods

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func statusPod(policy corev1.RestartPolicy, inits int) *corev1.Pod {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default", UID: "uid-1"},
		Spec: corev1.PodSpec{RestartPolicy: policy, Containers: []corev1.Container{{Name: "app", Image: "busybox:1.36"}}}}
	for i := range inits {
		pod.Spec.InitContainers = append(pod.Spec.InitContainers, corev1.Container{Name: "init" + string(rune('a'+i)), Image: "busybox:1.36"})
	}
	return pod
}

func condition(s corev1.PodStatus, t corev1.PodConditionType) corev1.PodCondition {
	for _, c := range s.Conditions {
		if c.Type == t {
			return c
		}
	}
	return corev1.PodCondition{}
}

// TestPodStatus: the phase, conditions and container states the kubelet
// reports, computed from what the node runs, with no containerd and no
// root (the agent's tests check the same against real containers).
func TestPodStatus(t *testing.T) {
	started := time.Now().Add(-time.Minute)
	running := func(cs *containerState) {
		cs.created, cs.running, cs.startedAt, cs.ready, cs.startupDone = true, true, started, true, true
	}
	exited := func(code int32, reason string) func(*containerState) {
		return func(cs *containerState) {
			cs.created, cs.startedAt, cs.exit = true, started, &exit{code: code, at: time.Now(), reason: reason}
		}
	}
	for _, tc := range []struct {
		name      string
		pod       *corev1.Pod
		initState []func(*containerState)
		appState  func(*containerState)
		initDone  bool
		podErr    *configError
		check     func(t *testing.T, s corev1.PodStatus)
	}{
		{name: "running and ready", pod: statusPod(corev1.RestartPolicyAlways, 0), appState: running, initDone: true,
			check: func(t *testing.T, s corev1.PodStatus) {
				if s.Phase != corev1.PodRunning || condition(s, corev1.PodReady).Status != corev1.ConditionTrue || s.ContainerStatuses[0].State.Running == nil ||
					s.PodIP != "10.42.0.7" || s.HostIP != "192.0.2.10" || s.ContainerStatuses[0].ContainerID != "containerd://uid-1-app" {
					t.Errorf("%+v", s)
				}
			}},
		{name: "done, never restarted: Succeeded", pod: statusPod(corev1.RestartPolicyNever, 0), appState: exited(0, ""), initDone: true,
			check: func(t *testing.T, s corev1.PodStatus) {
				ready := condition(s, corev1.PodReady)
				if s.Phase != corev1.PodSucceeded || ready.Status != corev1.ConditionFalse || ready.Reason != "PodCompleted" ||
					s.ContainerStatuses[0].State.Terminated.Reason != "Completed" {
					t.Errorf("%+v", s)
				}
			}},
		{name: "failed and restarting counts as running", pod: statusPod(corev1.RestartPolicyAlways, 0), appState: exited(1, ""), initDone: true,
			check: func(t *testing.T, s corev1.PodStatus) {
				cs := s.ContainerStatuses[0]
				if s.Phase != corev1.PodRunning || cs.State.Waiting == nil || cs.State.Waiting.Reason != "CrashLoopBackOff" ||
					cs.LastTerminationState.Terminated == nil || cs.LastTerminationState.Terminated.Reason != "Error" {
					t.Errorf("%+v", s)
				}
			}},
		{name: "a process that never ran: StartError, exit 128", pod: statusPod(corev1.RestartPolicyNever, 0), appState: exited(128, "StartError"), initDone: true,
			check: func(t *testing.T, s corev1.PodStatus) {
				if term := s.ContainerStatuses[0].State.Terminated; s.Phase != corev1.PodFailed || term == nil || term.Reason != "StartError" || term.ExitCode != 128 {
					t.Errorf("%+v", s)
				}
			}},
		{name: "an init container failed, never restarted: Failed", pod: statusPod(corev1.RestartPolicyNever, 1), initState: []func(*containerState){exited(2, "")},
			check: func(t *testing.T, s corev1.PodStatus) {
				if s.Phase != corev1.PodFailed {
					t.Errorf("%+v", s)
				}
			}},
		{name: "init containers under way: Pending, PodInitializing", pod: statusPod(corev1.RestartPolicyAlways, 2), initState: []func(*containerState){exited(0, ""), running},
			check: func(t *testing.T, s corev1.PodStatus) {
				init := condition(s, corev1.PodInitialized)
				if s.Phase != corev1.PodPending || init.Status != corev1.ConditionFalse || !strings.Contains(init.Message, "[initb]") ||
					s.ContainerStatuses[0].State.Waiting == nil || s.ContainerStatuses[0].State.Waiting.Reason != "PodInitializing" || !s.InitContainerStatuses[0].Ready {
					t.Errorf("%+v", s)
				}
			}},
		{name: "a missing ConfigMap: CreateContainerConfigError", pod: statusPod(corev1.RestartPolicyAlways, 0), initDone: true,
			podErr: &configError{reason: "CreateContainerConfigError", message: `configmap "cfg" not found`},
			check: func(t *testing.T, s corev1.PodStatus) {
				if w := s.ContainerStatuses[0].State.Waiting; s.Phase != corev1.PodPending || w == nil || w.Reason != "CreateContainerConfigError" {
					t.Errorf("%+v", s)
				}
			}},
		{name: "an unmet readiness gate", pod: func() *corev1.Pod {
			p := statusPod(corev1.RestartPolicyAlways, 0)
			p.Spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: "example.com/lb"}}
			return p
		}(), appState: running, initDone: true,
			check: func(t *testing.T, s corev1.PodStatus) {
				if r := condition(s, corev1.PodReady); r.Status != corev1.ConditionFalse || r.Reason != "ReadinessGatesNotReady" ||
					condition(s, corev1.ContainersReady).Status != corev1.ConditionTrue {
					t.Errorf("%+v", s.Conditions)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := newPodState(tc.pod)
			st.ip, st.started, st.initialized = "10.42.0.7", started, tc.initDone
			for i, f := range tc.initState {
				f(st.init[i])
			}
			if tc.appState != nil {
				tc.appState(st.app[0])
			}
			status := podStatus(tc.pod, st, "192.0.2.10", tc.podErr)
			tc.check(t, status)
			// Read back as the API keeps it, the status is the same: the
			// next sync writes nothing.
			data, err := json.Marshal(status)
			if err != nil {
				t.Fatal(err)
			}
			stored := tc.pod.DeepCopy()
			if err := json.Unmarshal(data, &stored.Status); err != nil {
				t.Fatal(err)
			}
			if again := podStatus(stored, st, "192.0.2.10", tc.podErr); !equality.Semantic.DeepEqual(again, stored.Status) {
				t.Errorf("the status read back differs from the next sync's:\n%+v\n%+v", stored.Status, again)
			}
		})
	}
}

// TestRestartsOnDisk: a container's latest run is read back from its log
// files, whatever else lies in the directory.
func TestRestartsOnDisk(t *testing.T) {
	m := &Manager{cfg: Config{DataDir: t.TempDir()}}
	if n := m.restartsOnDisk("uid", "app"); n != 0 {
		t.Fatalf("no logs: %d", n)
	}
	dir := filepath.Dir(m.logPath("uid", "app", 0))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"0.log", "1.log", "7.log", "12.log.gz", "notes"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if n := m.restartsOnDisk("uid", "app"); n != 7 {
		t.Fatalf("restarts on disk: %d, want 7", n)
	}
}
