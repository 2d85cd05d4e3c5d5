package loops_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api/apitest"
	"github.com/orch-dev/orch/internal/loops/hollow"
	"github.com/orch-dev/orch/internal/loops/loopstest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func quotaPod(name string, cpu string) *corev1.Pod {
	c := corev1.Container{Name: "app", Image: "busybox"}
	if cpu != "" {
		c.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}
		c.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{Containers: []corev1.Container{c}}}
}

// counted waits until the quota's status says used for each resource:
// at once on an idle machine; the first count waits for the loops'
// informers, which the race detector and the other packages' tests slow
// past 10 s on a loaded two-core CI machine.
func counted(c *loopstest.Cluster, name string, want map[corev1.ResourceName]string) {
	c.Eventually("quota "+name+" counted", 30*time.Second, func(ctx context.Context) (bool, error) {
		q, err := c.Client.CoreV1().ResourceQuotas("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for r, v := range want {
			got, ok := q.Status.Used[r]
			if !ok || got.Cmp(resource.MustParse(v)) != 0 {
				return false, nil
			}
		}
		return len(q.Status.Hard) == len(q.Spec.Hard), nil
	})
}

// TestResourceQuota: a quota's usage is counted and enforced as in
// Kubernetes: creates past a hard limit are refused with Kubernetes'
// message, pods under a compute quota must state it, scopes select the
// pods they name, deleted objects give their share back.
func TestResourceQuota(t *testing.T) {
	c := loopstest.Start(t, nil, hollow.Options{LeaseEvery: -1})
	core := c.Client.CoreV1()
	ctx := c.Ctx
	hard := corev1.ResourceList{corev1.ResourcePods: resource.MustParse("2"), corev1.ResourceRequestsCPU: resource.MustParse("1"),
		corev1.ResourceConfigMaps: resource.MustParse("2"), "count/deployments.apps": resource.MustParse("0")}
	if _, err := core.ResourceQuotas("default").Create(ctx, &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "team"},
		Spec: corev1.ResourceQuotaSpec{Hard: hard}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := core.ResourceQuotas("default").Create(ctx, &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "besteffort"},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}, Scopes: []corev1.ResourceQuotaScope{corev1.ResourceQuotaScopeBestEffort}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The namespace's kube-root-ca.crt counts as a ConfigMap, as in Kubernetes.
	counted(c, "team", map[corev1.ResourceName]string{corev1.ResourcePods: "0", corev1.ResourceConfigMaps: "1"})
	counted(c, "besteffort", map[corev1.ResourceName]string{corev1.ResourcePods: "0"})

	for _, p := range []*corev1.Pod{quotaPod("a", "400m"), quotaPod("b", "400m")} {
		if _, err := core.Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want string
	}{
		{"a third pod", quotaPod("c", "100m"), `pods "c" is forbidden: exceeded quota: team, requested: pods=1, used: pods=2, limited: pods=2`},
		{"a best-effort pod", quotaPod("d", ""), `pods "d" is forbidden: exceeded quota: besteffort, requested: pods=1, used: pods=0, limited: pods=0`},
	} {
		if _, err := core.Pods("default").Create(ctx, tc.pod, metav1.CreateOptions{}); !apierrors.IsForbidden(err) || err.Error() != tc.want {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	if err := core.Pods("default").Delete(ctx, "a", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	counted(c, "team", map[corev1.ResourceName]string{corev1.ResourcePods: "1", corev1.ResourceRequestsCPU: "400m"})
	if _, err := core.Pods("default").Create(ctx, quotaPod("e", "700m"), metav1.CreateOptions{}); !apierrors.IsForbidden(err) ||
		!strings.Contains(err.Error(), "exceeded quota: team, requested: requests.cpu=700m, used: requests.cpu=400m, limited: requests.cpu=1") {
		t.Errorf("a pod past the cpu quota: %v", err)
	}
	noRequest := quotaPod("f", "")
	noRequest.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}
	if _, err := core.Pods("default").Create(ctx, noRequest, metav1.CreateOptions{}); !apierrors.IsForbidden(err) ||
		!strings.Contains(err.Error(), "failed quota: team: must specify requests.cpu for: app") {
		t.Errorf("a pod without a cpu request under a cpu quota: %v", err)
	}
	if _, err := core.Pods("default").Create(ctx, quotaPod("g", "600m"), metav1.CreateOptions{}); err != nil {
		t.Errorf("a pod within the quota again: %v", err)
	}
	if _, err := core.ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "one"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := core.ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "two"}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) ||
		!strings.Contains(err.Error(), "exceeded quota: team, requested: configmaps=1, used: configmaps=2, limited: configmaps=2") {
		t.Errorf("a configmap past the quota: %v", err)
	}
	// A dry run is checked but charges nothing.
	if _, err := core.ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "dry"}}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); !apierrors.IsForbidden(err) {
		t.Errorf("a dry-run configmap past the quota: %v", err)
	}
}

// TestResourceQuotaUnderConcurrency: fifty pods created at once against
// a quota of ten: exactly ten are admitted, and the quota says ten.
func TestResourceQuotaUnderConcurrency(t *testing.T) {
	c := loopstest.Start(t, nil, hollow.Options{LeaseEvery: -1})
	core := c.Client.CoreV1()
	if _, err := core.ResourceQuotas("default").Create(c.Ctx, &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "ten"},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("10")}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	counted(c, "ten", map[corev1.ResourceName]string{corev1.ResourcePods: "0"})
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted, refused := 0, 0
	for i := range 50 {
		wg.Go(func() {
			_, err := core.Pods("default").Create(c.Ctx, quotaPod(fmt.Sprintf("p-%02d", i), ""), metav1.CreateOptions{})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				admitted++
			case apierrors.IsForbidden(err):
				refused++
			default:
				t.Errorf("create: %v", err)
			}
		})
	}
	wg.Wait()
	if admitted != 10 || refused != 40 {
		t.Errorf("%d admitted and %d refused, want 10 and 40", admitted, refused)
	}
	list, err := core.Pods("default").List(c.Ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 10 {
		t.Errorf("%d pods stored, want 10 (%v)", len(list.Items), err)
	}
	counted(c, "ten", map[corev1.ResourceName]string{corev1.ResourcePods: "10"})
}

// TestQuotaWithKubectl: kubectl create quota, get quota and describe
// quota show what the loop counted, as on Kubernetes.
func TestQuotaWithKubectl(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kubectl")
	}
	c := loopstest.Start(t, nil, hollow.Options{LeaseEvery: -1})
	k := apitest.NewKubectl(t, c.Server.Kubeconfig)
	k.Run("create", "quota", "small", "--hard=pods=3,requests.cpu=2,limits.cpu=4,services=1")
	counted(c, "small", map[corev1.ResourceName]string{corev1.ResourcePods: "0"})
	k.Run("run", "web", "--image=busybox", "--restart=Never", "--overrides",
		`{"spec":{"containers":[{"name":"web","image":"busybox","resources":{"requests":{"cpu":"500m"},"limits":{"cpu":"1"}}}]}}`)
	counted(c, "small", map[corev1.ResourceName]string{corev1.ResourcePods: "1", corev1.ResourceRequestsCPU: "500m"})
	if out := k.Run("get", "quota"); !strings.Contains(out, "pods: 1/3, requests.cpu: 500m/2, services: 1/1") || !strings.Contains(out, "limits.cpu: 1/4") {
		t.Errorf("kubectl get quota:\n%s", out)
	}
	out := k.Run("describe", "quota", "small")
	for _, line := range []string{`pods\s+1\s+3`, `requests\.cpu\s+500m\s+2`, `limits\.cpu\s+1\s+4`, `services\s+1\s+1`} {
		if !regexp.MustCompile(line).MatchString(out) {
			t.Errorf("kubectl describe quota: no %q in\n%s", line, out)
		}
	}
	if out, err := k.Try("create", "service", "clusterip", "extra", "--tcp=80:80"); err == nil || !strings.Contains(out, "exceeded quota: small, requested: services=1, used: services=1, limited: services=1") {
		t.Errorf("a second Service: %v %s", err, out)
	}
}

// TestClaimQuota: claims count against requests.storage, in all and per
// class (<class>.storageclass.storage.k8s.io/...), as Kubernetes' claim
// evaluator charges them; a deleted claim frees its share.
func TestClaimQuota(t *testing.T) {
	c := loopstest.Start(t, nil, hollow.Options{LeaseEvery: -1})
	core := c.Client.CoreV1()
	hard := corev1.ResourceList{corev1.ResourceRequestsStorage: resource.MustParse("3Gi"),
		"local-path.storageclass.storage.k8s.io/persistentvolumeclaims": resource.MustParse("1")}
	if _, err := core.ResourceQuotas("default").Create(c.Ctx, &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "disk"},
		Spec: corev1.ResourceQuotaSpec{Hard: hard}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	counted(c, "disk", map[corev1.ResourceName]string{corev1.ResourceRequestsStorage: "0"})
	claim := func(name, size string, class *string) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: class,
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}}}}
	}
	if _, err := core.PersistentVolumeClaims("default").Create(c.Ctx, claim("a", "2Gi", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		claim *corev1.PersistentVolumeClaim
		want  string
	}{
		{claim("b", "2Gi", new(string)), "exceeded quota: disk, requested: requests.storage=2Gi, used: requests.storage=2Gi, limited: requests.storage=3Gi"},
		{claim("c", "1Gi", nil), "exceeded quota: disk, requested: local-path.storageclass.storage.k8s.io/persistentvolumeclaims=1"},
	} {
		if _, err := core.PersistentVolumeClaims("default").Create(c.Ctx, tc.claim, metav1.CreateOptions{}); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("claim %s: %v, want %q", tc.claim.Name, err, tc.want)
		}
	}
	counted(c, "disk", map[corev1.ResourceName]string{corev1.ResourceRequestsStorage: "2Gi"})
	if err := core.PersistentVolumeClaims("default").Delete(c.Ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	counted(c, "disk", map[corev1.ResourceName]string{corev1.ResourceRequestsStorage: "0"})
	if _, err := core.PersistentVolumeClaims("default").Create(c.Ctx, claim("b", "2Gi", new(string)), metav1.CreateOptions{}); err != nil {
		t.Errorf("a claim within the quota once the first is gone: %v", err)
	}
}
