package apibench

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// BenchmarkCustomResourceCELCreate: 2,000 custom resources created by 32
// clients for a definition without rules, then as many for one whose
// schema has five CEL rules (cross-field, string, list and quantity
// checks), same server, same run. Target: with rules at least 70 % of
// the rate without.
func BenchmarkCustomResourceCELCreate(b *testing.B) {
	const clients, total = 32, 2000
	rules := []any{
		map[string]any{"rule": "self.minReplicas <= self.replicas", "message": "minReplicas must not exceed replicas"},
		map[string]any{"rule": "self.name.startsWith('w-')"},
		map[string]any{"rule": "self.tags.all(t, size(t) < 32)"},
		map[string]any{"rule": "quantity(self.memory).isLessThan(quantity('4Gi'))"},
		map[string]any{"rule": "self.mode in ['fast', 'slow']"},
	}
	for range b.N {
		cfg := server(b)
		ctx := context.Background()
		dyn := dynamic.NewForConfigOrDie(rest.CopyConfig(cfg))
		define := func(plural string, withRules bool) schema.GroupVersionResource {
			spec := map[string]any{"type": "object", "properties": map[string]any{
				"name": map[string]any{"type": "string", "maxLength": 64}, "mode": map[string]any{"type": "string", "maxLength": 8},
				"memory":   map[string]any{"type": "string", "maxLength": 16},
				"replicas": map[string]any{"type": "integer"}, "minReplicas": map[string]any{"type": "integer"},
				"tags": map[string]any{"type": "array", "maxItems": 8, "items": map[string]any{"type": "string", "maxLength": 64}},
			}}
			if withRules {
				spec["x-kubernetes-validations"] = rules
			}
			crd := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
				"metadata": map[string]any{"name": plural + ".bench.example.com"},
				"spec": map[string]any{"group": "bench.example.com", "scope": "Namespaced",
					"names": map[string]any{"plural": plural, "kind": plural[:len(plural)-1] + "x"},
					"versions": []any{map[string]any{"name": "v1", "served": true, "storage": true,
						"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "properties": map[string]any{"spec": spec}}}}}},
			}}
			crds := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
			if _, err := dyn.Resource(crds).Create(ctx, crd, metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
			gvr := schema.GroupVersionResource{Group: "bench.example.com", Version: "v1", Resource: plural}
			for deadline := time.Now().Add(10 * time.Second); ; {
				if _, err := dyn.Resource(gvr).Namespace("default").List(ctx, metav1.ListOptions{}); err == nil {
					return gvr
				} else if time.Now().After(deadline) {
					b.Fatalf("%s not served: %v", plural, err)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
		rate := func(gvr schema.GroupVersionResource) float64 {
			return createRate(b, cfg, clients, total, func(c *rest.Config) func(int64) error {
				c.ContentType = "application/json"
				client := dynamic.NewForConfigOrDie(c).Resource(gvr).Namespace("default")
				return func(i int64) error {
					w := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "bench.example.com/v1", "kind": gvr.Resource[:len(gvr.Resource)-1] + "x",
						"metadata": map[string]any{"name": fmt.Sprintf("w-%06d", i)},
						"spec": map[string]any{"name": fmt.Sprintf("w-%06d", i), "mode": "fast", "memory": "512Mi", "replicas": int64(3), "minReplicas": int64(1),
							"tags": []any{"a", "bench", "edge"}}}}
					_, err := client.Create(ctx, w, metav1.CreateOptions{})
					return err
				}
			})
		}
		plain := rate(define("plains", false))
		checked := rate(define("checkeds", true))
		b.ReportMetric(plain, "plain/s")
		b.ReportMetric(checked, "cel-rules/s")
		b.ReportMetric(checked/plain*100, "cel-%")
	}
}

// createRate runs total creates from clients, each with its own
// connection opened before the clock starts, and returns creates/s.
func createRate(b *testing.B, cfg *rest.Config, clients, total int, client func(c *rest.Config) func(i int64) error) float64 {
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	creates := make([]func(int64) error, clients)
	for w := range creates {
		c := rest.CopyConfig(cfg)
		c.Dial = (&net.Dialer{}).DialContext
		creates[w] = client(c)
		if _, err := kubernetes.NewForConfigOrDie(c).CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	start := time.Now()
	for _, create := range creates {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(total); i = next.Add(1) {
				if err := create(i); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return float64(total) / time.Since(start).Seconds()
}

// BenchmarkValidatingWebhook: ConfigMap creates with no webhook, then with
// one validating webhook (HTTPS, served on this machine, allowing every
// request) that matches them: the rate with 16 clients, and the latency of
// one client's creates one after another, whose difference is what the
// webhook's round trip adds. Target: the added p99 under 5 ms here.
func BenchmarkValidatingWebhook(b *testing.B) {
	const clients, total, sequential = 16, 2000, 500
	for range b.N {
		cfg := server(b)
		ctx := context.Background()
		url, ca := allowingWebhook(b)
		c := kubernetes.NewForConfigOrDie(rest.CopyConfig(cfg))
		run := func(prefix string) (float64, []time.Duration) {
			r := createRate(b, cfg, clients, total, func(c *rest.Config) func(int64) error {
				client := kubernetes.NewForConfigOrDie(c).CoreV1().ConfigMaps("default")
				return func(i int64) error {
					_, err := client.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%06d", prefix, i)}, Data: map[string]string{"k": "v"}}, metav1.CreateOptions{})
					return err
				}
			})
			var lat []time.Duration
			for i := range sequential {
				start := time.Now()
				if _, err := c.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-seq-%06d", prefix, i)}}, metav1.CreateOptions{}); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			return r, lat
		}
		without, latWithout := run("plain")
		cfgName := "bench"
		if _, err := c.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: cfgName}, Webhooks: []admissionregistrationv1.ValidatingWebhook{{
				Name: "allow.bench.orch", ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: ptr.To(url), CABundle: ca},
				Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}}}},
				SideEffects: ptr.To(admissionregistrationv1.SideEffectClassNone), AdmissionReviewVersions: []string{"v1"}}}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); calls.Load() == 0; {
			_, _ = c.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-"}}, metav1.CreateOptions{DryRun: []string{"All"}})
			if time.Now().After(deadline) {
				b.Fatal("the webhook was never called")
			}
			time.Sleep(20 * time.Millisecond)
		}
		with, latWith := run("hooked")
		pWithout, pWith := latencies(latWithout), latencies(latWith)
		b.ReportMetric(without, "creates/s")
		b.ReportMetric(with, "creates-webhook/s")
		b.ReportMetric(with/without*100, "webhook-%")
		b.ReportMetric(ms(pWith[0]), "p50-webhook-ms")
		b.ReportMetric(ms(pWith[1]), "p99-webhook-ms")
		b.ReportMetric(ms(pWith[1]-pWithout[1]), "added-p99-ms")
		b.ReportMetric(ms(pWith[0]-pWithout[0]), "added-p50-ms")
	}
}

var calls atomic.Int64

func latencies(lat []time.Duration) [2]time.Duration {
	slices.Sort(lat)
	return [2]time.Duration{percentile(lat, 0.5), percentile(lat, 0.99)}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// allowingWebhook serves a validating webhook that allows everything, over
// HTTPS with its own CA; it returns its URL and CA.
func allowingWebhook(b *testing.B) (string, []byte) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		b.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "bench"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, TLSConfig: &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			var review admissionv1.AdmissionReview
			data, _ := io.ReadAll(r.Body)
			if err := json.Unmarshal(data, &review); err != nil || review.Request == nil {
				http.Error(w, "bad review", http.StatusBadRequest)
				return
			}
			out, _ := json.Marshal(&admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true}})
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(out)
		})}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	b.Cleanup(func() { _ = srv.Close() })
	return "https://" + ln.Addr().String() + "/validate", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
