package podgc_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/loops"
	"github.com/orch-dev/orch/internal/loops/hollow"
	"github.com/orch-dev/orch/internal/loops/loopstest"
	"github.com/orch-dev/orch/internal/loops/podgc"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestPodGC(t *testing.T) {
	c := loopstest.StartWith(t, map[string]hollow.NodeOptions{"n1": {}}, hollow.Options{LeaseEvery: -1},
		loops.Options{PodGC: podgc.Options{TerminatedThreshold: 2, CheckEvery: 100 * time.Millisecond}})
	pods := c.Client.CoreV1().Pods("default")
	pod := func(name, node, runFor string) {
		t.Helper()
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{}},
			Spec:       corev1.PodSpec{NodeName: node, RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
		}
		if runFor != "" {
			p.Annotations[hollow.RunForAnnotation] = runFor
		}
		if _, err := pods.Create(c.Ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pod("lost", "no-such-node", "")
	for i := range 4 {
		pod(fmt.Sprintf("done-%d", i), "n1", "10ms")
	}
	gone := func(name string) bool {
		_, err := pods.Get(c.Ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}
	// Creation times are in seconds; ties go by name, done-0 first.
	c.Eventually("the pod on a missing node collected", 10*time.Second, func(ctx context.Context) (bool, error) { return gone("lost"), nil })
	c.Eventually("the oldest finished pods collected", 10*time.Second, func(ctx context.Context) (bool, error) {
		return gone("done-0") && gone("done-1"), nil
	})
	if gone("done-2") || gone("done-3") {
		t.Error("finished pods under the threshold were collected")
	}
}
