package pods

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent/logs"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func ephemeralStatusOf(p *corev1.Pod, name string) *corev1.ContainerStatus {
	if p == nil {
		return nil
	}
	for i := range p.Status.EphemeralContainerStatuses {
		if p.Status.EphemeralContainerStatuses[i].Name == name {
			return &p.Status.EphemeralContainerStatuses[i]
		}
	}
	return nil
}

// addEphemeral adds an ephemeral container to a pod, as the API's
// pods/ephemeralcontainers does.
func (n *fakeNode) addEphemeral(t *testing.T, pod string, c corev1.EphemeralContainer) {
	t.Helper()
	p := n.pod(pod).DeepCopy()
	p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, c)
	if _, err := n.api.Client.Pods("default").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestEphemeralContainersOnFakeRuntime: an ephemeral container added to
// a running pod (kubectl debug) is started once, in the pod, reported in
// ephemeralContainerStatuses and never ready; its output is its log; its
// exit is final (no restart, whatever the pod's policy) and changes
// nothing of the pod's phase or readiness; one whose target is not
// running waits, saying why; a pod whose containers have ended stops the
// debugging session too.
func TestEphemeralContainersOnFakeRuntime(t *testing.T) {
	pod := fakePod("web", "app", "side")
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	n := newFakeNode(t, pod)
	n.run(t)
	eventually(t, "the pod Running", func() bool { return n.pod("web").Status.Phase == corev1.PodRunning })

	debugger := corev1.EphemeralContainer{TargetContainerName: "side", EphemeralContainerCommon: corev1.EphemeralContainerCommon{
		Name: "debugger", Image: "busybox:test", ImagePullPolicy: corev1.PullIfNotPresent, Stdin: true, TTY: true}}
	n.addEphemeral(t, "web", debugger)
	id := "web-uid-debugger"
	eventually(t, "the ephemeral container running and reported", func() bool {
		cs := ephemeralStatusOf(n.pod("web"), "debugger")
		return n.rt.Running(id) && cs != nil && cs.State.Running != nil && !cs.Ready && cs.ContainerID == "containerd://"+id
	})
	if p := n.pod("web"); len(p.Status.ContainerStatuses) != 2 || !conditionTrue(p, corev1.PodReady) {
		t.Errorf("the pod with an ephemeral container: %d container statuses, conditions %+v", len(p.Status.ContainerStatuses), p.Status.Conditions)
	}
	if err := n.rt.Output(id, "debugging\n"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the ephemeral container's log", func() bool {
		var out bytes.Buffer
		err := n.m.ContainerLog(context.Background(), LogRequest{Namespace: "default", Pod: "web", Container: "debugger", Options: logs.Options{Tail: -1}}, &out)
		return err == nil && out.String() == "debugging\n"
	})

	if err := n.rt.Exit(id, 2); err != nil {
		t.Fatal(err)
	}
	eventually(t, "its exit final", func() bool {
		cs := ephemeralStatusOf(n.pod("web"), "debugger")
		return cs != nil && cs.State.Terminated != nil && cs.State.Terminated.ExitCode == 2 && cs.RestartCount == 0
	})
	time.Sleep(200 * time.Millisecond) // a restart would come at once
	if cs := ephemeralStatusOf(n.pod("web"), "debugger"); n.rt.Running(id) || cs.State.Terminated == nil || cs.RestartCount != 0 {
		t.Errorf("the ephemeral container ran again: %+v", cs)
	}
	if p := n.pod("web"); p.Status.Phase != corev1.PodRunning || !conditionTrue(p, corev1.PodReady) {
		t.Errorf("an ephemeral container's exit changed the pod: %s, %+v", p.Status.Phase, p.Status.Conditions)
	}

	// A target that no longer runs: the container waits, saying so.
	if err := n.rt.Exit("web-uid-app", 0); err != nil {
		t.Fatal(err)
	}
	eventually(t, "app exited", func() bool {
		cs := statusOf(n.pod("web"), "app")
		return cs != nil && cs.State.Terminated != nil
	})
	late := debugger
	late.Name, late.TargetContainerName = "late", "app"
	n.addEphemeral(t, "web", late)
	eventually(t, "the ephemeral container waiting for its target", func() bool {
		cs := ephemeralStatusOf(n.pod("web"), "late")
		return cs != nil && cs.State.Waiting != nil && cs.State.Waiting.Reason == "CreateContainerError" &&
			strings.Contains(cs.State.Waiting.Message, `target container "app" is not running`)
	})

	// A second session, untargeted, then the pod's last container ends:
	// the session is stopped and the pod completes.
	third := debugger
	third.Name, third.TargetContainerName = "third", ""
	n.addEphemeral(t, "web", third)
	eventually(t, "the third running", func() bool { return n.rt.Running("web-uid-third") })
	if err := n.rt.Exit("web-uid-side", 0); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the pod Succeeded, the session stopped", func() bool {
		return n.pod("web").Status.Phase == corev1.PodSucceeded && !n.rt.Running("web-uid-third")
	})
}

// TestImageVolumeOnFakeRuntime: an image volume is the image, pulled by
// its pull policy, viewed read only where the volume is; the view goes
// with the pod. An image the node lacks under pullPolicy Never keeps the
// pod waiting, saying why.
func TestImageVolumeOnFakeRuntime(t *testing.T) {
	pod := fakePod("web", "app")
	pod.Spec.Volumes = []corev1.Volume{{Name: "models", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: "busybox:test", PullPolicy: corev1.PullIfNotPresent}}}}
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "models", MountPath: "/models"}}
	missing := fakePod("missing", "app")
	missing.Spec.Volumes = []corev1.Volume{{Name: "models", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: "example.com/none:1", PullPolicy: corev1.PullNever}}}}
	n := newFakeNode(t, pod, missing)
	n.run(t)
	eventually(t, "the pod Running with its image volume", func() bool { return n.pod("web").Status.Phase == corev1.PodRunning })
	if views := n.rt.Views(); len(views) != 1 || views[0] != "image-volume-web-uid-models" {
		t.Errorf("image views: %v", views)
	}
	eventually(t, "the pod whose volume's image is missing waiting", func() bool {
		cs := statusOf(n.pod("missing"), "app")
		return cs != nil && cs.State.Waiting != nil && cs.State.Waiting.Reason == "ErrImageNeverPull"
	})
	if err := n.api.Client.Pods("default").Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the view gone with the pod", func() bool { return n.pod("web") == nil && len(n.rt.Views()) == 0 })
}
