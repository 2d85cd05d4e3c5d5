package api_test

import (
	"context"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

const limitRangeManifest = `apiVersion: v1
kind: LimitRange
metadata: {name: sizes}
spec:
  limits:
  - type: Container
    max: {cpu: "1", memory: 512Mi}
    min: {cpu: 50m}
    default: {cpu: 500m, memory: 256Mi}
    defaultRequest: {cpu: 100m}
    maxLimitRequestRatio: {cpu: "10"}
  - type: Pod
    max: {memory: 768Mi}
`

// TestLimitRangesWithKubectl: a LimitRange created with stock kubectl
// gives containers that set nothing their defaults (recorded in the
// kubernetes.io/limit-ranger annotation), and refuses containers and pods
// outside its bounds with Kubernetes' messages.
func TestLimitRangesWithKubectl(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kubectl")
	}
	ts := startServer(t, "")
	ctx := context.Background()
	k := newKubectl(t, ts)
	manifest := filepath.Join(t.TempDir(), "limits.yaml")
	write(t, manifest, limitRangeManifest)
	k.run("apply", "-f", manifest)
	if out := k.run("get", "limits"); !strings.Contains(out, "sizes") {
		t.Errorf("kubectl get limits: %s", out)
	}
	if out := k.run("describe", "limitrange", "sizes"); !regexp.MustCompile(`Container\s+cpu\s+50m\s+1\s+100m\s+500m\s+10`).MatchString(out) {
		t.Errorf("kubectl describe limitrange:\n%s", out)
	}
	k.run("run", "plain", "--image=busybox", "--restart=Never")
	pod, err := ts.client.CoreV1().Pods("default").Get(ctx, "plain", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	res := pod.Spec.Containers[0].Resources
	for name, want := range map[string]string{"requests.cpu": "100m", "requests.memory": "256Mi", "limits.cpu": "500m", "limits.memory": "256Mi"} {
		list := res.Requests
		if strings.HasPrefix(name, "limits") {
			list = res.Limits
		}
		if got := list[corev1.ResourceName(strings.SplitN(name, ".", 2)[1])]; got.Cmp(resource.MustParse(want)) != 0 {
			t.Errorf("%s: %s, want %s", name, got.String(), want)
		}
	}
	if a := pod.Annotations["kubernetes.io/limit-ranger"]; a != "LimitRanger plugin set: cpu, memory request for container plain; cpu, memory limit for container plain" {
		t.Errorf("annotation %q", a)
	}
	// A limit without a request is the request (Kubernetes' pod
	// defaulting, before LimitRange admission): 300m, not the 100m default.
	k.run("run", "partial", "--image=busybox", "--restart=Never", "--overrides",
		`{"spec":{"containers":[{"name":"c","image":"busybox","resources":{"limits":{"cpu":"300m"}}}]}}`)
	partial, err := ts.client.CoreV1().Pods("default").Get(ctx, "partial", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := partial.Spec.Containers[0].Resources.Requests.Cpu(); got.Cmp(resource.MustParse("300m")) != 0 {
		t.Errorf("the request of a 300m limit: %s", got)
	}
	// A default limit below what a container requests is validated after
	// admission set it, as in Kubernetes.
	if out, err := k.try("run", "greedy", "--image=busybox", "--restart=Never", "--overrides",
		`{"spec":{"containers":[{"name":"c","image":"busybox","resources":{"requests":{"cpu":"800m"}}}]}}`); err == nil || !strings.Contains(out, "is invalid") ||
		!strings.Contains(out, "must be less than or equal to cpu limit") {
		t.Errorf("a request above the default limit: %v %s", err, out)
	}
	for _, tc := range []struct{ name, overrides, message string }{
		{"over the container max", `{"spec":{"containers":[{"name":"c","image":"busybox","resources":{"limits":{"cpu":"2"}}}]}}`,
			"maximum cpu usage per Container is 1, but limit is 2"},
		{"under the container min", `{"spec":{"containers":[{"name":"c","image":"busybox","resources":{"requests":{"cpu":"10m"}}}]}}`,
			"minimum cpu usage per Container is 50m, but request is 10m"},
		{"over the ratio", `{"spec":{"containers":[{"name":"c","image":"busybox","resources":{"requests":{"cpu":"50m"},"limits":{"cpu":"1"}}}]}}`,
			"cpu max limit to request ratio per Container is 10, but provided ratio is 20.000000"},
		{"over the pod max", `{"spec":{"containers":[{"name":"a","image":"busybox","resources":{"limits":{"memory":"512Mi"}}},{"name":"b","image":"busybox","resources":{"limits":{"memory":"512Mi"}}}]}}`,
			"maximum memory usage per Pod is 768Mi, but limit is 1Gi"},
	} {
		out, err := k.try("run", "bad", "--image=busybox", "--restart=Never", "--overrides", tc.overrides)
		if err == nil || !strings.Contains(out, `pods "bad" is forbidden: `) || !strings.Contains(out, tc.message) {
			t.Errorf("%s: %v %s", tc.name, err, out)
		}
	}
}

// TestLimitRangeBadInput: malformed LimitRanges are 422s at the field
// Kubernetes names.
func TestLimitRangeBadInput(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	q := resource.MustParse
	for _, tc := range []struct {
		name string
		item corev1.LimitRangeItem
		want string
	}{
		{"min above max", corev1.LimitRangeItem{Type: corev1.LimitTypeContainer, Min: corev1.ResourceList{"cpu": q("2")}, Max: corev1.ResourceList{"cpu": q("1")}},
			"spec.limits[0].min[cpu]: Invalid value: \"2\": min value 2 is greater than max value 1"},
		{"default above max", corev1.LimitRangeItem{Type: corev1.LimitTypeContainer, Default: corev1.ResourceList{"memory": q("2Gi")}, Max: corev1.ResourceList{"memory": q("1Gi")}},
			"default value 2Gi is greater than max value 1Gi"},
		{"ratio below one", corev1.LimitRangeItem{Type: corev1.LimitTypeContainer, MaxLimitRequestRatio: corev1.ResourceList{"cpu": q("500m")}},
			"ratio 500m is less than 1"},
		{"defaults on a Pod item", corev1.LimitRangeItem{Type: corev1.LimitTypePod, Default: corev1.ResourceList{"cpu": q("1")}},
			"spec.limits[0].default: Forbidden: may not be specified when `type` is 'Pod'"},
		{"negative quantity", corev1.LimitRangeItem{Type: corev1.LimitTypeContainer, Min: corev1.ResourceList{"cpu": q("-1")}},
			"must be greater than or equal to 0"},
		{"no type", corev1.LimitRangeItem{Max: corev1.ResourceList{"cpu": q("1")}}, "spec.limits[0].type: Required value"},
		{"claims without storage bounds", corev1.LimitRangeItem{Type: corev1.LimitTypePersistentVolumeClaim, Max: corev1.ResourceList{"cpu": q("1")}},
			"either minimum or maximum storage value is required"},
	} {
		_, err := ts.client.CoreV1().LimitRanges("default").Create(ctx, &corev1.LimitRange{ObjectMeta: metav1.ObjectMeta{Name: "bad"},
			Spec: corev1.LimitRangeSpec{Limits: []corev1.LimitRangeItem{tc.item}}}, metav1.CreateOptions{})
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want 422 %q", tc.name, err, tc.want)
		}
	}
}

// TestClaimLimitRange: a PersistentVolumeClaim item bounds the storage a
// new claim asks for, with Kubernetes' messages.
func TestClaimLimitRange(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	core := ts.client.CoreV1()
	lr := &corev1.LimitRange{ObjectMeta: metav1.ObjectMeta{Name: "disks"}, Spec: corev1.LimitRangeSpec{Limits: []corev1.LimitRangeItem{{
		Type: corev1.LimitTypePersistentVolumeClaim, Min: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
		Max: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("5Gi")}}}}}
	if _, err := core.LimitRanges("default").Create(ctx, lr, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for size, want := range map[string]string{
		"500Mi": "minimum storage usage per PersistentVolumeClaim is 1Gi, but request is 500Mi",
		"10Gi":  "maximum storage usage per PersistentVolumeClaim is 5Gi, but request is 10Gi",
		"2Gi":   "",
	} {
		pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{GenerateName: "c-"}, Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}}}}
		_, err := core.PersistentVolumeClaims("default").Create(ctx, pvc, metav1.CreateOptions{})
		switch {
		case want == "" && err != nil:
			t.Errorf("a claim of %s: %v", size, err)
		case want != "" && (!apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want)):
			t.Errorf("a claim of %s: %v, want %q", size, err, want)
		}
	}
}

// TestLimitRangeCountsRuntimeClassOverhead: a Pod item's max counts the
// overhead the pod's RuntimeClass adds, as Kubernetes' LimitRanger
// validates the pod RuntimeClass admission has already mutated: 512Mi of
// containers fit a 768Mi pod max alone, not with 300Mi of overhead.
func TestLimitRangeCountsRuntimeClassOverhead(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "heavy"}, Handler: "runc",
		Overhead: &nodev1.Overhead{PodFixed: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("300Mi")}}}
	if _, err := ts.client.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	lr := &corev1.LimitRange{ObjectMeta: metav1.ObjectMeta{Name: "sizes"}, Spec: corev1.LimitRangeSpec{Limits: []corev1.LimitRangeItem{{
		Type: corev1.LimitTypePod, Max: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("768Mi")}}}}}
	if _, err := ts.client.CoreV1().LimitRanges("default").Create(ctx, lr, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := func(name string, runtimeClass *string) *corev1.Pod {
		mem := corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")}
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{RuntimeClassName: runtimeClass,
			Containers: []corev1.Container{{Name: "c", Image: "busybox", Resources: corev1.ResourceRequirements{Requests: mem, Limits: mem}}}}}
	}
	if _, err := ts.client.CoreV1().Pods("default").Create(ctx, pod("plain", nil), metav1.CreateOptions{}); err != nil {
		t.Fatalf("512Mi under a 768Mi pod max: %v", err)
	}
	_, err := ts.client.CoreV1().Pods("default").Create(ctx, pod("heavy", ptr.To("heavy")), metav1.CreateOptions{})
	if want := "maximum memory usage per Pod is 768Mi, but limit is 812Mi"; !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
		t.Fatalf("512Mi and 300Mi of overhead: %v, want 403 %q", err, want)
	}
}
