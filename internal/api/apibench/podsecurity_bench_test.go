package apibench

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// BenchmarkPodSecurity: 2,000 pods created by 32 clients in a namespace
// without Pod Security labels (privileged, Kubernetes' default: nothing
// to evaluate), then as many in one labelled restricted for enforce, warn
// and audit (each pod checked against Kubernetes' restricted level), then
// again in the privileged one (the machine is shared: the first and last
// rounds bracket the restricted one), same server, same run. Target:
// restricted at least 90 % of the privileged rate.
func BenchmarkPodSecurity(b *testing.B) {
	const clients, total = 32, 2000
	for range b.N {
		cfg := server(b)
		ctx := context.Background()
		admin := kubernetes.NewForConfigOrDie(rest.CopyConfig(cfg))
		for name, labels := range map[string]map[string]string{
			"open": nil,
			"locked": {"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/warn": "restricted",
				"pod-security.kubernetes.io/audit": "restricted"},
		} {
			if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
			// No loops run here to make it.
			if _, err := admin.CoreV1().ServiceAccounts(name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		run := func(namespace, prefix string) float64 {
			return createRate(b, cfg, clients, total, func(c *rest.Config) func(int64) error {
				pods := kubernetes.NewForConfigOrDie(c).CoreV1().Pods(namespace)
				return func(i int64) error {
					_, err := pods.Create(ctx, restrictedPod(fmt.Sprintf("%s-%06d", prefix, i)), metav1.CreateOptions{})
					return err
				}
			})
		}
		before := run("open", "a")
		restricted := run("locked", "b")
		after := run("open", "c")
		privileged := (before + after) / 2
		b.ReportMetric(privileged, "creates/s")
		b.ReportMetric(restricted, "creates-restricted/s")
		b.ReportMetric(restricted/privileged*100, "restricted-%")
	}
}

// restrictedPod is the bench's pod as a restricted namespace admits it.
func restrictedPod(name string) *corev1.Pod {
	p := pod(name, time.Now())
	p.Namespace = ""
	p.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](1000),
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
	p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false),
		Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}
	return p
}
