package agent_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent/testimage"
	"github.com/orch-dev/orch/internal/api"
	"github.com/orch-dev/orch/internal/api/pki"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// BenchmarkWebhookFromPod: ConfigMap creates, one after the other as one
// client writes, through a validating webhook served by a pod on the
// node, against the same creates where no webhook applies, in the same
// run: each one's p50 and p99 and creates/s. "direct" is a server on the
// pod network (it runs an agent); "through-node" one that reaches the pod
// through the node's kubelet API (--disable-agent). Target: the
// webhook's p99 under 5 ms.
func BenchmarkWebhookFromPod(b *testing.B) {
	if testing.Short() {
		b.Skip("runs a pod")
	}
	hook := filepath.Join(b.TempDir(), "webhook")
	build := exec.Command("go", "build", "-o", hook, "./testdata/webhook")
	build.Env = append(os.Environ(), "CGO_ENABLED=0") // the image has no C library
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("build the webhook: %v\n%s", err, out)
	}
	binary, err := os.ReadFile(hook)
	if err != nil {
		b.Fatal(err)
	}
	for _, mode := range []struct {
		name   string
		behind bool
	}{{"direct", false}, {"through-node", true}} {
		b.Run(mode.name, func(b *testing.B) {
			for range b.N {
				benchmarkWebhookFromPod(b, binary, mode.behind)
			}
		})
	}
}

func benchmarkWebhookFromPod(b *testing.B, binary []byte, behind bool) {
	c, dir := prepareNodeWith(b, func(cfg *api.Config) { cfg.PodsBehindNodes = behind })
	if err := testimage.Write(filepath.Join(dir, "agent", "images", "webhook.tar"), "docker.io/library/webhook:test",
		testimage.Config{Cmd: []string{"/bin/webhook"}, Files: map[string][]byte{"/bin/webhook": binary}}); err != nil {
		b.Fatal(err)
	}
	n := startNodeIn(b, c, dir, "hooked")
	ctx := n.Ctx
	ca, err := pki.LoadOrCreateCA(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	serving, err := ca.Issue(pki.Request{CommonName: "hook.default.svc", DNSNames: []string{"hook.default.svc"}, Server: true})
	if err != nil {
		b.Fatal(err)
	}
	for _, ns := range []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "plain"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "hooked", Labels: map[string]string{"hooked": "yes"}}}} {
		if _, err := c.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	// The webhook is configured first, so that creates fail until its
	// pod serves: the first that succeeds went through it.
	none := admissionregistrationv1.SideEffectClassNone
	fail := admissionregistrationv1.Fail
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "bench"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{Name: "allow.bench.orch.test", AdmissionReviewVersions: []string{"v1"}, SideEffects: &none, FailurePolicy: &fail,
			ClientConfig: admissionregistrationv1.WebhookClientConfig{CABundle: ca.Bundle(),
				Service: &admissionregistrationv1.ServiceReference{Namespace: "default", Name: "hook", Path: ptr.To("/")}},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"hooked": "yes"}},
			Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}}}}}}}
	if _, err := c.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, vwc, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	configMaps := func(ns string) func(name string) error {
		return func(name string) error {
			_, err := c.Client.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"k": "v"}}, metav1.CreateOptions{})
			return err
		}
	}
	hooked, plain := configMaps("hooked"), configMaps("plain")
	n.Eventually("the webhook in force", time.Minute, func(context.Context) (bool, error) {
		err := hooked("probe")
		return err != nil && strings.Contains(err.Error(), "allow.bench.orch.test"), nil
	})
	if _, err := c.Client.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "hook"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "hook"}, Ports: []corev1.ServicePort{{Port: 443, TargetPort: intstr.FromInt32(8443)}}}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	n.create(b, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hook", Labels: map[string]string{"app": "hook"}}, Spec: corev1.PodSpec{Containers: []corev1.Container{{
		Name: "hook", Image: "webhook:test", ImagePullPolicy: corev1.PullIfNotPresent,
		Env: []corev1.EnvVar{{Name: "TLS_CRT", Value: string(serving.CertPEM)}, {Name: "TLS_KEY", Value: string(serving.KeyPEM)}}}}}})
	var last error
	n.Eventually("the webhook's pod answering", time.Minute, func(context.Context) (bool, error) {
		last = hooked("probe")
		return last == nil, nil
	})
	if last != nil {
		b.Fatalf("the last create: %v", last)
	}

	const creates = 300
	measure := func(create func(string) error, prefix string) (p50, p99 time.Duration, perSecond float64) {
		lat := make([]time.Duration, 0, creates)
		start := time.Now()
		for i := range creates {
			at := time.Now()
			if err := create(fmt.Sprintf("%s%03d", prefix, i)); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(at))
		}
		elapsed := time.Since(start)
		slices.Sort(lat)
		return lat[len(lat)/2], lat[len(lat)*99/100], creates / elapsed.Seconds()
	}
	// Alternated halves, so that the machine's noise falls on both.
	var none50, none99, hook50, hook99 []time.Duration
	var noneRate, hookRate float64
	for round := range 2 {
		p50, p99, rate := measure(plain, fmt.Sprintf("r%d-", round))
		none50, none99, noneRate = append(none50, p50), append(none99, p99), noneRate+rate/2
		p50, p99, rate = measure(hooked, fmt.Sprintf("r%d-", round))
		hook50, hook99, hookRate = append(hook50, p50), append(hook99, p99), hookRate+rate/2
	}
	ms := func(d []time.Duration) float64 { return float64(slices.Max(d).Microseconds()) / 1000 }
	b.ReportMetric(ms(none50), "none-p50-ms")
	b.ReportMetric(ms(none99), "none-p99-ms")
	b.ReportMetric(ms(hook50), "webhook-p50-ms")
	b.ReportMetric(ms(hook99), "webhook-p99-ms")
	b.ReportMetric(noneRate, "none-creates/s")
	b.ReportMetric(hookRate, "webhook-creates/s")
	b.ReportMetric(100*hookRate/noneRate, "webhook-vs-none-%")
}
