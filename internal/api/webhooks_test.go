package api_test

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
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api/apitest"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// testWebhook is an admission webhook server as operators run one: HTTPS
// with its own CA, answering AdmissionReviews by path.
type testWebhook struct {
	url       string
	ca        []byte
	tlsConfig *tls.Config
	mu        sync.Mutex
	last      map[string]*admissionv1.AdmissionRequest
	counts    map[string]int
}

// startWebhook serves the test webhook on addr ("127.0.0.1:0" or a
// host address), with a certificate for the IP and hook.default.svc.
func startWebhook(t *testing.T, addr string) *testWebhook {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	host, _, _ := net.SplitHostPort(ln.Addr().String())
	certPEM, keyPEM := selfSigned(t, net.ParseIP(host), "hook.default.svc")
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	w := &testWebhook{url: "https://" + ln.Addr().String(), ca: certPEM, last: map[string]*admissionv1.AdmissionRequest{}, counts: map[string]int{},
		tlsConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
	// tlsConfig stays a template: each server gets a copy, which ServeTLS writes to.
	srv := &http.Server{Handler: w, TLSConfig: w.tlsConfig.Clone(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	return w
}

func (w *testWebhook) request(path string) *admissionv1.AdmissionRequest {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last[path]
}

func (w *testWebhook) count(path string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.counts[path]
}

func (w *testWebhook) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	var review admissionv1.AdmissionReview
	body, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
		http.Error(rw, "bad review", http.StatusBadRequest)
		return
	}
	req := review.Request
	w.mu.Lock()
	w.last[r.URL.Path] = req
	w.counts[r.URL.Path]++
	w.mu.Unlock()
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	var obj struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
		Data     map[string]string `json:"data"`
	}
	_ = json.Unmarshal(req.Object.Raw, &obj)
	jsonPatch := admissionv1.PatchTypeJSONPatch
	switch r.URL.Path {
	case "/deny":
		if _, ok := obj.Data["deny"]; ok {
			resp.Allowed = false
			resp.Result = &metav1.Status{Message: "the key deny is not allowed", Code: http.StatusForbidden}
		}
	case "/deny-delete":
		resp.Allowed = false
		resp.Result = &metav1.Status{Message: "this configmap is protected"}
	case "/label":
		var patch string
		if obj.Metadata.Labels == nil {
			patch = `[{"op":"add","path":"/metadata/labels","value":{"mutated":"yes"}}]`
		} else {
			patch = `[{"op":"add","path":"/metadata/labels/mutated","value":"yes"}]`
		}
		resp.Patch, resp.PatchType = []byte(patch), &jsonPatch
	case "/stage2":
		// A second mutation that depends on the first having run.
		if obj.Metadata.Labels["mutated"] == "yes" && obj.Metadata.Labels["stage2"] == "" {
			resp.Patch, resp.PatchType = []byte(`[{"op":"add","path":"/metadata/labels/stage2","value":"done"}]`), &jsonPatch
		}
	case "/warn":
		resp.Warnings = []string{"configmaps here are watched"}
	case "/slow":
		// Past the caller's 1 s timeout; over once the caller has gone.
		select {
		case <-time.After(3 * time.Second):
		case <-r.Context().Done():
		}
	case "/garbage":
		_, _ = rw.Write([]byte("this is not a review"))
		return
	case "/wrong-uid":
		resp.UID = "someone-else"
	case "/bad-patch":
		resp.Patch, resp.PatchType = []byte(`[{"op":"replace","path":"/nothing/here","value":1}]`), &jsonPatch
	case "/fill-image":
		resp.Patch, resp.PatchType = []byte(`[{"op":"add","path":"/spec/image","value":"filled:in"}]`), &jsonPatch
	case "/name-change":
		resp.Patch, resp.PatchType = []byte(`[{"op":"replace","path":"/metadata/name","value":"other"}]`), &jsonPatch
	}
	out, _ := json.Marshal(&admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp})
	rw.Header().Set("Content-Type", "application/json")
	_, _ = rw.Write(out)
}

// selfSigned makes a certificate that is its own CA, for an IP and a name.
func selfSigned(t *testing.T, ip net.IP, name string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, DNSNames: []string{name}, IPAddresses: []net.IP{ip},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})
}

// configMapRule is the rule of the tests' webhooks: configmaps, every
// operation but CONNECT.
var configMapRule = []admissionregistrationv1.RuleWithOperations{{
	Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete},
	Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
}}

func validatingHook(name, url string, ca []byte, policy admissionregistrationv1.FailurePolicyType) admissionregistrationv1.ValidatingWebhook {
	return admissionregistrationv1.ValidatingWebhook{Name: name, ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: ptr.To(url), CABundle: ca},
		Rules: configMapRule, FailurePolicy: ptr.To(policy), SideEffects: ptr.To(admissionregistrationv1.SideEffectClassNone),
		AdmissionReviewVersions: []string{"v1"}, TimeoutSeconds: ptr.To[int32](1),
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"webhooks": "on"}}}
}

// waitWebhooksActive creates probe configmaps until the webhook's effect
// shows, as Kubernetes' own tests wait for a configuration to take effect.
func waitWebhooksActive(t *testing.T, c kubernetes.Interface, ns string, effective func(err error, cm *corev1.ConfigMap) bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		cm, err := c.CoreV1().ConfigMaps(ns).Create(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("probe-%d", i)},
			Data: map[string]string{"deny": "x"}}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if effective(err, cm) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("the webhook configuration did not take effect")
}

// TestAdmissionWebhooks drives validating and mutating webhooks as users
// meet them, with stock kubectl: a denial with the webhook's message,
// a mutation, warnings, failure policies, timeouts and bad answers.
func TestAdmissionWebhooks(t *testing.T) {
	srv := apitest.Start(t)
	ctx := context.Background()
	c := srv.Client
	kubectl := apitest.NewKubectl(t, srv.Kubeconfig)
	hook := startWebhook(t, "127.0.0.1:0")
	kubectl.Run("create", "namespace", "hooked")
	kubectl.Run("label", "namespace", "hooked", "webhooks=on")
	kubectl.Run("create", "namespace", "plain")

	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "policy"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{
			validatingHook("deny.orch.test", hook.url+"/deny", hook.ca, admissionregistrationv1.Fail),
			validatingHook("warn.orch.test", hook.url+"/warn", hook.ca, admissionregistrationv1.Fail),
		}}
	if _, err := c.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, vwc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitWebhooksActive(t, c, "hooked", func(err error, _ *corev1.ConfigMap) bool { return err != nil })

	t.Run("denied with the webhook's message", func(t *testing.T) {
		out, err := kubectl.Try("-n", "hooked", "create", "configmap", "bad", "--from-literal=deny=1")
		if err == nil || !strings.Contains(out, `admission webhook "deny.orch.test" denied the request: the key deny is not allowed`) {
			t.Fatalf("kubectl create: %v\n%s", err, out)
		}
		if _, err := c.CoreV1().ConfigMaps("hooked").Get(ctx, "bad", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("the denied configmap was stored: %v", err)
		}
		_, err = c.CoreV1().ConfigMaps("hooked").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "bad"}, Data: map[string]string{"deny": "1"}}, metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) {
			t.Fatalf("the webhook's code 403 is the client's: %v", err)
		}
	})
	t.Run("allowed, with the webhook's warning", func(t *testing.T) {
		out := kubectl.Run("-n", "hooked", "create", "configmap", "good", "--from-literal=ok=1")
		if !strings.Contains(out, "Warning: configmaps here are watched") {
			t.Fatalf("no warning from the webhook in kubectl's output:\n%s", out)
		}
		req := hook.request("/deny")
		if req.Operation != admissionv1.Create || req.Name != "good" || req.Namespace != "hooked" || req.UserInfo.Username != "system:admin" ||
			req.Resource.Resource != "configmaps" || req.Kind.Kind != "ConfigMap" || ptr.Deref(req.DryRun, true) {
			t.Fatalf("the review sent: %+v", req)
		}
		var opts metav1.CreateOptions
		if err := json.Unmarshal(req.Options.Raw, &opts); err != nil || opts.Kind != "CreateOptions" {
			t.Fatalf("options sent: %s (%v)", req.Options.Raw, err)
		}
	})
	t.Run("namespace selector leaves other namespaces alone", func(t *testing.T) {
		kubectl.Run("-n", "plain", "create", "configmap", "bad", "--from-literal=deny=1")
	})
	t.Run("update sees the old object", func(t *testing.T) {
		out, err := kubectl.Try("-n", "hooked", "patch", "configmap", "good", "-p", `{"data":{"deny":"now"}}`)
		if err == nil || !strings.Contains(out, "denied the request") {
			t.Fatalf("kubectl patch: %v\n%s", err, out)
		}
		req := hook.request("/deny")
		if req.Operation != admissionv1.Update || len(req.OldObject.Raw) == 0 {
			t.Fatalf("update review: %s, old object %q", req.Operation, req.OldObject.Raw)
		}
	})

	// The rest replace the configuration with one webhook each.
	set := func(t *testing.T, hooks ...admissionregistrationv1.ValidatingWebhook) {
		t.Helper()
		cur, err := c.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "policy", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Webhooks = hooks
		if _, err := c.AdmissionregistrationV1().ValidatingWebhookConfigurations().Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	down := "https://127.0.0.1:1/never"
	for _, tc := range []struct {
		name, url string
		policy    admissionregistrationv1.FailurePolicyType
		wantErr   string // "" when the write goes through
	}{
		{"down with Ignore", down, admissionregistrationv1.Ignore, ""},
		{"down with Fail", down, admissionregistrationv1.Fail, `failed calling webhook "case.orch.test"`},
		{"timeout", hook.url + "/slow", admissionregistrationv1.Fail, "context deadline exceeded"},
		{"timeout with Ignore", hook.url + "/slow", admissionregistrationv1.Ignore, ""},
		{"garbage", hook.url + "/garbage", admissionregistrationv1.Fail, `failed calling webhook "case.orch.test"`},
		{"wrong uid", hook.url + "/wrong-uid", admissionregistrationv1.Fail, `expected response.uid`},
		{"patch from a validating webhook", hook.url + "/label", admissionregistrationv1.Fail, "validating webhook may not return response.patch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set(t, validatingHook("case.orch.test", tc.url, hook.ca, tc.policy))
			name := "case-" + strings.ToLower(strings.ReplaceAll(tc.name, " ", "-"))
			// Wait for this configuration, not the last, to be in effect,
			// with dry runs: a probe stored under the last one could not
			// be deleted under this one.
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}
			deadline := time.Now().Add(15 * time.Second)
			for time.Now().Before(deadline) {
				_, err := c.CoreV1().ConfigMaps("hooked").Create(ctx, cm, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
				if tc.wantErr == "" && err == nil || tc.wantErr != "" && err != nil && strings.Contains(err.Error(), tc.wantErr) {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			_, err := c.CoreV1().ConfigMaps("hooked").Create(ctx, cm, metav1.CreateOptions{})
			if tc.wantErr == "" && err != nil {
				t.Fatalf("create refused: %v", err)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("create: %v, want an error with %q", err, tc.wantErr)
				}
				if _, err := c.CoreV1().ConfigMaps("hooked").Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
					t.Fatalf("a refused create was stored: %v", err)
				}
			}
		})
	}
	t.Run("delete denied", func(t *testing.T) {
		h := validatingHook("protect.orch.test", hook.url+"/deny-delete", hook.ca, admissionregistrationv1.Fail)
		h.Rules = []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Delete},
			Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}}}}
		h.ObjectSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"protected": "yes"}}
		set(t, h)
		kubectl.Run("-n", "hooked", "create", "configmap", "keep")
		kubectl.Run("-n", "hooked", "label", "configmap", "keep", "protected=yes")
		deadline := time.Now().Add(15 * time.Second)
		for {
			out, err := kubectl.Try("-n", "hooked", "delete", "configmap", "keep", "--dry-run=server")
			if err != nil && strings.Contains(out, "this configmap is protected") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("delete was not refused: %v\n%s", err, out)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if out, err := kubectl.Try("-n", "hooked", "delete", "configmap", "keep"); err == nil {
			t.Fatalf("delete went through:\n%s", out)
		}
		req := hook.request("/deny-delete")
		if req.Operation != admissionv1.Delete || len(req.OldObject.Raw) == 0 || len(req.Object.Raw) != 0 {
			t.Fatalf("delete review: %s object %q old %q", req.Operation, req.Object.Raw, req.OldObject.Raw)
		}
		// Objects the selector does not pick are deleted.
		kubectl.Run("-n", "hooked", "delete", "configmap", "good")
	})
	t.Run("match conditions (CEL) pick the requests", func(t *testing.T) {
		h := validatingHook("gated.orch.test", hook.url+"/deny-delete", hook.ca, admissionregistrationv1.Fail)
		h.MatchConditions = []admissionregistrationv1.MatchCondition{
			{Name: "gated-names", Expression: "object.metadata.name.startsWith('gated-')"},
			{Name: "not-admins", Expression: "!authorizer.group('').resource('nodes').check('delete').allowed() || request.userInfo.username == 'system:admin'"},
		}
		set(t, h)
		waitWebhooksActive(t, c, "hooked", func(err error, _ *corev1.ConfigMap) bool { return err == nil })
		deadline := time.Now().Add(15 * time.Second)
		for {
			out, err := kubectl.Try("-n", "hooked", "create", "configmap", "gated-one", "--dry-run=server")
			if err != nil && strings.Contains(out, "this configmap is protected") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the matching create was not refused: %v\n%s", err, out)
			}
			time.Sleep(100 * time.Millisecond)
		}
		kubectl.Run("-n", "hooked", "create", "configmap", "free-one")
		// An expression that does not compile is refused with its path.
		h.MatchConditions = []admissionregistrationv1.MatchCondition{{Name: "broken", Expression: "object.metadata.name.startsWith("}}
		cur, err := c.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "policy", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Webhooks = []admissionregistrationv1.ValidatingWebhook{h}
		_, err = c.AdmissionregistrationV1().ValidatingWebhookConfigurations().Update(ctx, cur, metav1.UpdateOptions{})
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "webhooks[0].matchConditions[0].expression") {
			t.Fatalf("a broken match condition: %v", err)
		}
	})
	t.Run("webhook configurations are never sent to webhooks", func(t *testing.T) {
		h := validatingHook("everything.orch.test", hook.url+"/deny-delete", hook.ca, admissionregistrationv1.Fail)
		h.NamespaceSelector = nil
		h.Rules = []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.OperationAll},
			Rule: admissionregistrationv1.Rule{APIGroups: []string{"*"}, APIVersions: []string{"*"}, Resources: []string{"*/*"}}}}
		set(t, h)
		waitWebhooksActive(t, c, "plain", func(err error, _ *corev1.ConfigMap) bool { return err != nil })
		// The configuration that refuses everything can still be removed.
		kubectl.Run("delete", "validatingwebhookconfiguration", "policy")
	})
}

// TestMutatingWebhooks: a label added by one webhook, another reinvoked
// after it, defaults applied and validation run again after mutation.
func TestMutatingWebhooks(t *testing.T) {
	srv := apitest.Start(t)
	ctx := context.Background()
	c := srv.Client
	kubectl := apitest.NewKubectl(t, srv.Kubeconfig)
	hook := startWebhook(t, "127.0.0.1:0")
	mk := func(name, path string, reinvoke admissionregistrationv1.ReinvocationPolicyType) admissionregistrationv1.MutatingWebhook {
		v := validatingHook(name, hook.url+path, hook.ca, admissionregistrationv1.Fail)
		return admissionregistrationv1.MutatingWebhook{Name: v.Name, ClientConfig: v.ClientConfig, Rules: v.Rules, FailurePolicy: v.FailurePolicy,
			SideEffects: v.SideEffects, AdmissionReviewVersions: v.AdmissionReviewVersions, TimeoutSeconds: v.TimeoutSeconds, ReinvocationPolicy: &reinvoke}
	}
	// stage2 runs first (it is first in the list) and adds its label
	// only once the other's is there: it must be reinvoked.
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "mutate"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{mk("stage2.orch.test", "/stage2", admissionregistrationv1.IfNeededReinvocationPolicy),
			mk("label.orch.test", "/label", admissionregistrationv1.NeverReinvocationPolicy)}}
	if _, err := c.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, mwc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitWebhooksActive(t, c, "default", func(err error, cm *corev1.ConfigMap) bool { return err == nil && cm.Labels["mutated"] == "yes" })

	kubectl.Run("create", "configmap", "mutated", "--from-literal=a=b")
	out := kubectl.Run("get", "configmap", "mutated", "-o", "jsonpath={.metadata.labels}")
	if !strings.Contains(out, `"mutated":"yes"`) || !strings.Contains(out, `"stage2":"done"`) {
		t.Fatalf("labels after mutation: %s", out)
	}
	if n := hook.count("/stage2"); n < 2 {
		t.Fatalf("the IfNeeded webhook was called %d times, want a reinvocation", n)
	}
	// A mutation that breaks what validation checks is refused.
	cur, _ := c.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "mutate", metav1.GetOptions{})
	cur.Webhooks = []admissionregistrationv1.MutatingWebhook{mk("bad-patch.orch.test", "/bad-patch", admissionregistrationv1.NeverReinvocationPolicy)}
	if _, err := c.AdmissionregistrationV1().MutatingWebhookConfigurations().Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitWebhooksActive(t, c, "default", func(err error, _ *corev1.ConfigMap) bool {
		return err != nil && strings.Contains(err.Error(), "bad-patch.orch.test")
	})
	if _, err := kubectl.Try("create", "configmap", "unpatched"); err == nil {
		t.Fatal("a create whose patch does not apply went through")
	}
	// A webhook may not move the object to another name.
	cur, _ = c.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "mutate", metav1.GetOptions{})
	cur.Webhooks = []admissionregistrationv1.MutatingWebhook{mk("rename.orch.test", "/name-change", admissionregistrationv1.NeverReinvocationPolicy)}
	if _, err := c.AdmissionregistrationV1().MutatingWebhookConfigurations().Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitWebhooksActive(t, c, "default", func(err error, _ *corev1.ConfigMap) bool {
		return err != nil && strings.Contains(err.Error(), "metadata.name")
	})
	if _, err := c.CoreV1().ConfigMaps("default").Get(ctx, "other", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a webhook renamed the object being created: %v", err)
	}
}

// TestMutatingWebhookFillsRequiredField: a custom resource that lacks a
// field its schema requires is created when a mutating webhook fills it
// in, as on Kubernetes, which validates only after mutating admission
// (kubebuilder's defaulting webhooks rely on it); without the webhook, or
// with one that leaves it out, the create is refused with the field.
func TestMutatingWebhookFillsRequiredField(t *testing.T) {
	srv := apitest.Start(t)
	ctx := context.Background()
	hook := startWebhook(t, "127.0.0.1:0")
	crd := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: "widgets.example.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{Group: "example.com", Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "widgets", Singular: "widget", Kind: "Widget"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true, Schema: &apiextensionsv1.CustomResourceValidation{
				OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
					"spec": {Type: "object", Required: []string{"image"}, Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"image": {Type: "string"}, "replicas": {Type: "integer"}}}}}}}}}}
	if err := createCRD(ctx, srv.Admin, crd); err != nil {
		t.Fatal(err)
	}
	waitCRDCondition(t, srv.Admin, crd.Name, apiextensionsv1.Established)
	widgets := dynamic.NewForConfigOrDie(srv.Admin).Resource(schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}).Namespace("default")
	widget := func(name string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "example.com/v1", "kind": "Widget",
			"metadata": map[string]any{"name": name}, "spec": map[string]any{"replicas": int64(1)}}}
	}
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if _, err = widgets.Create(ctx, widget("unhooked"), metav1.CreateOptions{}); err == nil || apierrors.IsInvalid(err) {
			break
		}
	}
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.image: Required value") {
		t.Fatalf("a Widget without its image and no webhook: %v", err)
	}

	rule := admissionregistrationv1.RuleWithOperations{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
		Rule: admissionregistrationv1.Rule{APIGroups: []string{"example.com"}, APIVersions: []string{"v1"}, Resources: []string{"widgets"}}}
	mk := func(name, path string) admissionregistrationv1.MutatingWebhook {
		v := validatingHook(name, hook.url+path, hook.ca, admissionregistrationv1.Fail)
		return admissionregistrationv1.MutatingWebhook{Name: v.Name, ClientConfig: v.ClientConfig, Rules: []admissionregistrationv1.RuleWithOperations{rule},
			FailurePolicy: v.FailurePolicy, SideEffects: v.SideEffects, AdmissionReviewVersions: v.AdmissionReviewVersions, TimeoutSeconds: v.TimeoutSeconds}
	}
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "fill"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{mk("label.orch.test", "/label")}}
	mutating := srv.Client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if _, err := mutating.Create(ctx, mwc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A webhook that labels but does not fill the field: still refused,
	// after it ran.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && hook.count("/label") == 0; time.Sleep(50 * time.Millisecond) {
		_, err = widgets.Create(ctx, widget("labelled"), metav1.CreateOptions{})
	}
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.image: Required value") {
		t.Fatalf("a Widget the webhook did not complete: %v", err)
	}
	cur, err := mutating.Get(ctx, "fill", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Webhooks = []admissionregistrationv1.MutatingWebhook{mk("fill.orch.test", "/fill-image")}
	if _, err := mutating.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var got *unstructured.Unstructured
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if got, err = widgets.Create(ctx, widget("filled"), metav1.CreateOptions{}); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("a Widget the webhook completes: %v", err)
	}
	if image, _, _ := unstructured.NestedString(got.Object, "spec", "image"); image != "filled:in" {
		t.Errorf("the created Widget's image: %q", image)
	}
	// An update that drops the field is completed the same way.
	unstructured.RemoveNestedField(got.Object, "spec", "image")
	if got, err = widgets.Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("an update the webhook completes: %v", err)
	}
	if image, _, _ := unstructured.NestedString(got.Object, "spec", "image"); image != "filled:in" {
		t.Errorf("the updated Widget's image: %q", image)
	}
}

// TestWebhookMatchPolicyEquivalent: a webhook whose rules name v1 of a
// kind served as v1 and v2 is called for a request made through v2 too,
// with the object converted to v1 and requestKind saying v2, and its
// patch lands in the object as v2 has it, as Kubernetes' default
// matchPolicy Equivalent does (an operator's webhooks list only the
// version they know); with matchPolicy Exact it is not called.
func TestWebhookMatchPolicyEquivalent(t *testing.T) {
	srv := apitest.Start(t)
	ctx := context.Background()
	hook := startWebhook(t, "127.0.0.1:0")
	props := &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
		"spec": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{"image": {Type: "string"}}}}}}
	crd := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: "gizmos.example.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{Group: "example.com", Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "gizmos", Singular: "gizmo", Kind: "Gizmo"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true, Schema: props},
				{Name: "v2", Served: true, Schema: props}}}}
	if err := createCRD(ctx, srv.Admin, crd); err != nil {
		t.Fatal(err)
	}
	waitCRDCondition(t, srv.Admin, crd.Name, apiextensionsv1.Established)
	dyn := dynamic.NewForConfigOrDie(srv.Admin)
	v2 := dyn.Resource(schema.GroupVersionResource{Group: "example.com", Version: "v2", Resource: "gizmos"}).Namespace("default")
	gizmo := func(name string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "example.com/v2", "kind": "Gizmo",
			"metadata": map[string]any{"name": name}, "spec": map[string]any{"image": "x"}}}
	}
	v := validatingHook("label.orch.test", hook.url+"/label", hook.ca, admissionregistrationv1.Fail)
	mwh := admissionregistrationv1.MutatingWebhook{Name: v.Name, ClientConfig: v.ClientConfig, FailurePolicy: v.FailurePolicy, SideEffects: v.SideEffects,
		AdmissionReviewVersions: v.AdmissionReviewVersions, TimeoutSeconds: v.TimeoutSeconds,
		Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
			Rule: admissionregistrationv1.Rule{APIGroups: []string{"example.com"}, APIVersions: []string{"v1"}, Resources: []string{"gizmos"}}}}}
	mutating := srv.Client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if _, err := mutating.Create(ctx, &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "v1-only"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{mwh}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var got *unstructured.Unstructured
	var err error
	for i, deadline := 0, time.Now().Add(10*time.Second); time.Now().Before(deadline); i++ {
		if got, err = v2.Create(ctx, gizmo(fmt.Sprintf("g%d", i)), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if got.GetLabels()["mutated"] == "yes" {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got.GetLabels()["mutated"] != "yes" || got.GetAPIVersion() != "example.com/v2" {
		t.Fatalf("a v2 create, the webhook for v1: %s labels %v", got.GetAPIVersion(), got.GetLabels())
	}
	req := hook.request("/label")
	if req.Kind.Version != "v1" || req.Resource.Version != "v1" || req.RequestKind.Version != "v2" || req.RequestResource.Version != "v2" {
		t.Errorf("the webhook was sent kind %v resource %v, requestKind %v requestResource %v", req.Kind, req.Resource, req.RequestKind, req.RequestResource)
	}
	if !strings.Contains(string(req.Object.Raw), `"apiVersion":"example.com/v1"`) {
		t.Errorf("the webhook was sent the object in another version than its own: %s", req.Object.Raw)
	}

	cur, err := mutating.Get(ctx, "v1-only", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	exact := admissionregistrationv1.Exact
	cur.Webhooks[0].MatchPolicy = &exact
	if _, err := mutating.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i, deadline := 0, time.Now().Add(10*time.Second); time.Now().Before(deadline); i++ {
		if got, err = v2.Create(ctx, gizmo(fmt.Sprintf("e%d", i)), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if got.GetLabels()["mutated"] == "" {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got.GetLabels()["mutated"] != "" {
		t.Errorf("matchPolicy Exact: the v1 webhook still mutates v2 creates")
	}

	// A ValidatingAdmissionPolicy for v1 judges v2 creates the same way.
	policies := srv.Client.AdmissionregistrationV1()
	vap := &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: "no-forbidden-image"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{Operations: []admissionregistrationv1.OperationType{"CREATE"},
					Rule: admissionregistrationv1.Rule{APIGroups: []string{"example.com"}, APIVersions: []string{"v1"}, Resources: []string{"gizmos"}}}}}},
			Validations: []admissionregistrationv1.Validation{{Expression: "object.apiVersion == 'example.com/v1' && object.spec.image != 'forbidden'", Message: "no forbidden image"}}}}
	if _, err := policies.ValidatingAdmissionPolicies().Create(ctx, vap, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := policies.ValidatingAdmissionPolicyBindings().Create(ctx, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: "no-forbidden-image"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: "no-forbidden-image",
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	forbidden := gizmo("forbidden")
	_ = unstructured.SetNestedField(forbidden.Object, "forbidden", "spec", "image")
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if _, err = v2.Create(ctx, forbidden, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
			break
		}
	}
	if err == nil || !strings.Contains(err.Error(), "no forbidden image") {
		t.Errorf("a v2 create the v1 policy forbids: %v", err)
	}
	if _, err := v2.Create(ctx, gizmo("allowed"), metav1.CreateOptions{}); err != nil {
		t.Errorf("a v2 create the v1 policy allows (it sees the object as v1): %v", err)
	}
}

// TestWebhookThroughService calls a webhook named by a Service, reached
// at its ready endpoint with the certificate checked for
// <service>.<namespace>.svc, as operators deploy them.
func TestWebhookThroughService(t *testing.T) {
	ip := hostAddress(t)
	srv := apitest.Start(t)
	ctx := context.Background()
	c := srv.Client
	hook := startWebhook(t, net.JoinHostPort(ip.String(), "0"))
	_, portStr, _ := net.SplitHostPort(strings.TrimPrefix(hook.url, "https://"))
	var port int32
	if _, err := fmt.Sscan(portStr, &port); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "hook"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromInt32(port)}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "hook-1", Labels: map[string]string{discoveryv1.LabelServiceName: "hook"}},
		AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{{Addresses: []string{ip.String()}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: &port, Protocol: ptr.To(corev1.ProtocolTCP)}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h := validatingHook("svc.orch.test", "", hook.ca, admissionregistrationv1.Fail)
	h.ClientConfig = admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Namespace: "default", Name: "hook", Path: ptr.To("/deny")}, CABundle: hook.ca}
	h.NamespaceSelector = nil
	if _, err := c.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "svc"}, Webhooks: []admissionregistrationv1.ValidatingWebhook{h}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitWebhooksActive(t, c, "default", func(err error, _ *corev1.ConfigMap) bool {
		return err != nil && strings.Contains(err.Error(), `admission webhook "svc.orch.test" denied the request`)
	})
	// A Service with no ready endpoint fails the call, closed.
	if err := c.DiscoveryV1().EndpointSlices("default").Delete(ctx, "hook-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err := c.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "fine"}}, metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "no endpoints available") {
		t.Fatalf("create with the webhook's Service down: %v", err)
	}
}

// hostAddress is a non-loopback IPv4 address of this machine: Endpoint
// addresses may not be loopback ones.
func hostAddress(t *testing.T) net.IP {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() && !ipn.IP.IsLinkLocalUnicast() {
			return ipn.IP
		}
	}
	t.Skip("this machine has no non-loopback IPv4 address for an endpoint")
	return nil
}

// TestWebhookConfigurationValidation: what Kubernetes refuses in a
// configuration is refused with the field.
func TestWebhookConfigurationValidation(t *testing.T) {
	srv := apitest.Start(t)
	ctx := context.Background()
	good := validatingHook("ok.orch.test", "https://example.com/x", nil, admissionregistrationv1.Fail)
	for _, tc := range []struct {
		name  string
		edit  func(h *admissionregistrationv1.ValidatingWebhook)
		field string
	}{
		{"short name", func(h *admissionregistrationv1.ValidatingWebhook) { h.Name = "short" }, "webhooks[0].name"},
		{"http url", func(h *admissionregistrationv1.ValidatingWebhook) { h.ClientConfig.URL = ptr.To("http://example.com") }, "webhooks[0].clientConfig.url"},
		{"no client", func(h *admissionregistrationv1.ValidatingWebhook) { h.ClientConfig.URL = nil }, "webhooks[0].clientConfig"},
		{"no side effects", func(h *admissionregistrationv1.ValidatingWebhook) { h.SideEffects = nil }, "webhooks[0].sideEffects"},
		{"long timeout", func(h *admissionregistrationv1.ValidatingWebhook) { h.TimeoutSeconds = ptr.To[int32](31) }, "webhooks[0].timeoutSeconds"},
		{"review versions", func(h *admissionregistrationv1.ValidatingWebhook) { h.AdmissionReviewVersions = []string{"v2"} }, "webhooks[0].admissionReviewVersions"},
		{"bad operation", func(h *admissionregistrationv1.ValidatingWebhook) {
			h.Rules = []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{"POKE"}, Rule: configMapRule[0].Rule}}
		}, "webhooks[0].rules[0].operations[0]"},
		{"bad selector", func(h *admissionregistrationv1.ValidatingWebhook) {
			h.ObjectSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"a b": "c"}}
		}, "webhooks[0].objectSelector.matchLabels"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := *good.DeepCopy()
			tc.edit(&h)
			_, err := srv.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{
				ObjectMeta: metav1.ObjectMeta{Name: "bad"}, Webhooks: []admissionregistrationv1.ValidatingWebhook{h}}, metav1.CreateOptions{})
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("create: %v, want invalid %s", err, tc.field)
			}
		})
	}
	// Defaults as Kubernetes sets them.
	h := good
	h.FailurePolicy, h.TimeoutSeconds, h.NamespaceSelector = nil, nil, nil
	out, err := srv.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "defaults"}, Webhooks: []admissionregistrationv1.ValidatingWebhook{h}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w := out.Webhooks[0]
	if *w.FailurePolicy != admissionregistrationv1.Fail || *w.TimeoutSeconds != 10 || *w.MatchPolicy != admissionregistrationv1.Equivalent ||
		w.NamespaceSelector == nil || w.ObjectSelector == nil || *w.Rules[0].Scope != admissionregistrationv1.AllScopes {
		t.Fatalf("defaults: %+v", w)
	}
	kubectl := apitest.NewKubectl(t, srv.Kubeconfig)
	if got := kubectl.Run("get", "validatingwebhookconfigurations"); !strings.Contains(got, "WEBHOOKS") || !strings.Contains(got, "defaults") {
		t.Fatalf("kubectl get:\n%s", got)
	}
}
