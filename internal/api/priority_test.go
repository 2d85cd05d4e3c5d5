package api_test

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestPriorityClasses: the system's classes are there from the start and
// cannot be deleted; a pod takes its class's value and preemption policy
// (or the default class's, or 0), a missing class or a value that
// disagrees is refused; one default class at most; a class's value is
// fixed, and high values are the system's — Kubernetes' errors each.
func TestPriorityClasses(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	classes, pods := ts.client.SchedulingV1().PriorityClasses(), ts.client.CoreV1().Pods("default")
	for name, value := range map[string]int32{"system-node-critical": 2000001000, "system-cluster-critical": 2000000000} {
		pc, err := classes.Get(ctx, name, metav1.GetOptions{})
		if err != nil || pc.Value != value {
			t.Fatalf("%s: %+v, %v", name, pc, err)
		}
		if err := classes.Delete(ctx, name, metav1.DeleteOptions{}); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "system priority class and cannot be deleted") {
			t.Errorf("deleting %s: %v", name, err)
		}
	}
	pod := func(name, class string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{PriorityClassName: class,
			Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	}
	got, err := pods.Create(ctx, pod("plain", ""), metav1.CreateOptions{})
	if err != nil || ptr.Deref(got.Spec.Priority, -1) != 0 || got.Spec.PriorityClassName != "" {
		t.Fatalf("a pod without class: priority %v, %v", got.Spec.Priority, err)
	}
	got, err = pods.Create(ctx, pod("critical", "system-cluster-critical"), metav1.CreateOptions{})
	if err != nil || ptr.Deref(got.Spec.Priority, -1) != 2000000000 || ptr.Deref(got.Spec.PreemptionPolicy, "") != corev1.PreemptLowerPriority {
		t.Fatalf("a system-cluster-critical pod: %v %v, %v", got.Spec.Priority, got.Spec.PreemptionPolicy, err)
	}
	if _, err := pods.Create(ctx, pod("lost", "absent"), metav1.CreateOptions{}); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "no PriorityClass with name absent was found") {
		t.Errorf("a pod naming a missing class: %v", err)
	}
	lying := pod("lying", "system-cluster-critical")
	lying.Spec.Priority = ptr.To[int32](5)
	if _, err := pods.Create(ctx, lying, metav1.CreateOptions{}); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "must not be provided in pod spec") {
		t.Errorf("a pod with a priority of its own: %v", err)
	}

	batch := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "batch"}, Value: 100, GlobalDefault: true, PreemptionPolicy: ptr.To(corev1.PreemptNever)}
	if _, err := classes.Create(ctx, batch, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err = pods.Create(ctx, pod("defaulted", ""), metav1.CreateOptions{})
	if err != nil || got.Spec.PriorityClassName != "batch" || ptr.Deref(got.Spec.Priority, -1) != 100 || ptr.Deref(got.Spec.PreemptionPolicy, "") != corev1.PreemptNever {
		t.Fatalf("a pod under a default class: %q %v %v, %v", got.Spec.PriorityClassName, got.Spec.Priority, got.Spec.PreemptionPolicy, err)
	}
	second := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "other"}, Value: 10, GlobalDefault: true}
	if _, err := classes.Create(ctx, second, metav1.CreateOptions{}); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "PriorityClass batch is marked as default. Only one default can exist") {
		t.Errorf("a second default class: %v", err)
	}
	pc, err := classes.Get(ctx, "batch", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pc.Value = 200
	if _, err := classes.Update(ctx, pc, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "value: Forbidden: may not be changed in an update") {
		t.Errorf("changing a class's value: %v", err)
	}
	for _, bad := range []struct {
		pc   *schedulingv1.PriorityClass
		want string
	}{
		{&schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "huge"}, Value: 1000000001}, "maximum allowed value of a user defined priority is 1000000000"},
		{&schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "system-mine"}, Value: 1}, "reserved for system use only"},
		{&schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "odd"}, Value: 1, PreemptionPolicy: ptr.To(corev1.PreemptionPolicy("Sometimes"))}, "preemptionPolicy: Unsupported value"},
	} {
		if _, err := classes.Create(ctx, bad.pc, metav1.CreateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("class %s: %v", bad.pc.Name, err)
		}
	}
}
