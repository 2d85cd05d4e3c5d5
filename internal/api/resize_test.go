package api_test

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestPodResize: pods/resize as Kubernetes serves it, with the patch the
// conformance suite sends and client-go's UpdateResize: only the
// containers' resources and resize policies are taken (the pod's
// generation counts it), requests default from limits; the QoS class
// may not change, no request or limit may go, nothing but cpu and
// memory may change, a static pod is not resized; resources change
// only through the subresource.
func TestPodResize(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	pods := ts.client.CoreV1().Pods("default")
	list := func(kv ...string) corev1.ResourceList {
		l := corev1.ResourceList{}
		for i := 0; i+1 < len(kv); i += 2 {
			l[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
		}
		return l
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: corev1.PodSpec{Containers: []corev1.Container{
		{Name: "c1", Image: "busybox:1.36", Resources: corev1.ResourceRequirements{Requests: list("cpu", "20m", "memory", "35Mi", "ephemeral-storage", "1Gi")}},
		{Name: "c2", Image: "busybox:1.36", Resources: corev1.ResourceRequirements{Requests: list("cpu", "20m"), Limits: list("cpu", "30m")}}}}}
	created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	patch := `{"metadata":{"labels":{"sneaked":"in"}},"spec":{"containers":[{"name":"c1","image":"busybox:1.37","resources":{"requests":{"cpu":"25m","memory":"40Mi"}}},` +
		`{"name":"c2","resources":{"limits":{"cpu":"35m","memory":"50Mi"}},"resizePolicy":[{"resourceName":"memory","restartPolicy":"RestartContainer"}]}]}}`
	got, err := pods.Patch(ctx, "web", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "resize")
	if err != nil {
		t.Fatal(err)
	}
	c1, c2 := got.Spec.Containers[0], got.Spec.Containers[1]
	if c1.Resources.Requests.Cpu().String() != "25m" || c1.Resources.Requests.Memory().String() != "40Mi" || c1.Image != "busybox:1.36" || got.Labels["sneaked"] != "" {
		t.Errorf("c1 after the resize patch: %+v, image %s, labels %v", c1.Resources, c1.Image, got.Labels)
	}
	if c2.Resources.Limits.Memory().String() != "50Mi" || c2.Resources.Requests.Memory().String() != "50Mi" || len(c2.ResizePolicy) != 1 {
		t.Errorf("c2 after the resize patch (a new limit defaults its request): %+v %+v", c2.Resources, c2.ResizePolicy)
	}
	if got.Generation != created.Generation+1 {
		t.Errorf("generation %d after a resize of a pod at %d", got.Generation, created.Generation)
	}

	// client-go's UpdateResize, as the conformance suite's replace
	// endpoint spec uses it.
	got.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU] = resource.MustParse("30m")
	if got, err = pods.UpdateResize(ctx, "web", got, metav1.UpdateOptions{}); err != nil || got.Spec.Containers[0].Resources.Requests.Cpu().String() != "30m" {
		t.Fatalf("UpdateResize: %v, %v", got.Spec.Containers[0].Resources, err)
	}
	if res := ts.client.CoreV1().RESTClient().Get().Namespace("default").Resource("pods").Name("web").SubResource("resize").Do(ctx); res.Error() != nil {
		t.Errorf("get pods/resize: %v", res.Error())
	}

	refused := []struct {
		name  string
		patch string
		want  string
	}{
		{"a request removed", `{"spec":{"containers":[{"name":"c1","resources":{"requests":{"memory":null}}}]}}`,
			"spec.containers[0].resources.requests: Forbidden: resource requests cannot be removed"},
		{"another resource", `{"spec":{"containers":[{"name":"c1","resources":{"requests":{"ephemeral-storage":"2Gi"}}}]}}`,
			"spec: Forbidden: only cpu and memory resources are mutable"},
		{"Burstable made Guaranteed", `{"spec":{"containers":[{"name":"c1","resources":{"limits":{"cpu":"30m","memory":"40Mi","ephemeral-storage":"1Gi"}}},{"name":"c2","resources":{"requests":{"cpu":"35m"}}}]}}`,
			"Pod QOS Class may not change as a result of resizing"},
		{"a bad policy", `{"spec":{"containers":[{"name":"c1","resizePolicy":[{"resourceName":"storage","restartPolicy":"NotRequired"}]}]}}`,
			`spec.containers[0].resizePolicy: Unsupported value: "storage"`},
	}
	for _, tc := range refused {
		if _, err := pods.Patch(ctx, "web", types.StrategicMergePatchType, []byte(tc.patch), metav1.PatchOptions{}, "resize"); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v\nwant %s", tc.name, err, tc.want)
		}
	}
	best := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "best"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c1", Image: "busybox"}}}}
	if _, err := pods.Create(ctx, best, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pods.Patch(ctx, "best", types.StrategicMergePatchType, []byte(`{"spec":{"containers":[{"name":"c1","resources":{"requests":{"memory":"35Mi"}}}]}}`),
		metav1.PatchOptions{}, "resize"); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "Pod QOS Class may not change as a result of resizing") {
		t.Errorf("a BestEffort pod given a request: %v", err)
	}

	// Not through the pod itself.
	current, err := pods.Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	current.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU] = resource.MustParse("40m")
	if _, err := pods.Update(ctx, current, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "pod updates may not change fields") {
		t.Errorf("resources changed by an update of the pod: %v", err)
	}

	static := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "static-n1", Annotations: map[string]string{corev1.MirrorPodAnnotationKey: "x"}},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c1", Image: "busybox", Resources: corev1.ResourceRequirements{Requests: list("cpu", "10m")}}}}}
	if _, err := pods.Create(ctx, static, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pods.Patch(ctx, "static-n1", types.StrategicMergePatchType, []byte(`{"spec":{"containers":[{"name":"c1","resources":{"requests":{"cpu":"20m"}}}]}}`),
		metav1.PatchOptions{}, "resize"); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "static pods cannot be resized") {
		t.Errorf("a static pod resized: %v", err)
	}

	never := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "never"}, Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "c1", Image: "busybox",
		ResizePolicy: []corev1.ContainerResizePolicy{{ResourceName: corev1.ResourceCPU, RestartPolicy: corev1.RestartContainer}}}}}}
	if _, err := pods.Create(ctx, never, metav1.CreateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "must be 'NotRequired' when pod `restartPolicy` is 'Never'") {
		t.Errorf("RestartContainer in a pod that never restarts: %v", err)
	}
}
