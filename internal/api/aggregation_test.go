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
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"
)

// extensionServer is an aggregated API server on this machine: TLS with a
// certificate for demo.demo.svc from a CA of its own, recording who the
// front proxy says is asking and whether its certificate was the front
// proxy's.
type extensionServer struct {
	*httptest.Server
	caPEM []byte
	mu    sync.Mutex
	// seen is who asked, by path: "user groups verified authorization"
	// of the last request (the availability checks ask too, every 10 s).
	seen  map[string]string
	roots *x509.CertPool
}

func startExtensionServer(t *testing.T) *extensionServer {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ext-ca"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(2), DNSNames: []string{"demo.demo.svc"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, ca, key.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	e := &extensionServer{caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), seen: map[string]string{}}
	e.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		verified := false
		e.mu.Lock()
		roots := e.roots
		e.mu.Unlock()
		if roots != nil && r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			_, err := r.TLS.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
			verified = err == nil && r.TLS.PeerCertificates[0].Subject.CommonName == "front-proxy-client"
		}
		e.mu.Lock()
		e.seen[r.URL.Path] = r.Header.Get("X-Remote-User") + " " + strings.Join(r.Header.Values("X-Remote-Group"), ",") + " " + strconv.FormatBool(verified) + " " + r.Header.Get("Authorization")
		e.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/apis/demo.orch.test/v1":
			_, _ = w.Write([]byte(`{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"demo.orch.test/v1","resources":[{"name":"widgets","singularName":"widget","namespaced":true,"kind":"Widget","verbs":["get","list"]}]}`))
		case "/apis/metrics.k8s.io/v1beta1":
			_, _ = w.Write([]byte(`{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"metrics.k8s.io/v1beta1","resources":[{"name":"nodes","kind":"NodeMetrics","verbs":["get","list"]}]}`))
		case "/apis/metrics.k8s.io/v1beta1/nodes":
			_, _ = w.Write([]byte(`{"kind":"NodeMetricsList","apiVersion":"metrics.k8s.io/v1beta1","metadata":{},"items":[{"metadata":{"name":"from-metrics-server"},"timestamp":null,"window":"10s","usage":{}}]}`))
		case "/openapi/v3/apis/demo.orch.test/v1":
			_, _ = w.Write([]byte(`{"openapi":"3.0.0","info":{"title":"demo","version":"v1"},"paths":{}}`))
		case "/apis/demo.orch.test/v1/namespaces/demo/widgets":
			_, _ = w.Write([]byte(`{"apiVersion":"demo.orch.test/v1","kind":"WidgetList","metadata":{},"items":[{"apiVersion":"demo.orch.test/v1","kind":"Widget","metadata":{"name":"w1","namespace":"demo"}}]}`))
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	// An endpoint may not be a loopback address: the server listens on
	// one of the machine's own.
	ln, err := net.Listen("tcp", net.JoinHostPort(hostAddress(t).String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	_ = e.Listener.Close()
	e.Listener = ln
	e.TLS = &tls.Config{MinVersion: tls.VersionTLS12, ClientAuth: tls.RequestClientCert,
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	e.StartTLS()
	t.Cleanup(e.Close)
	return e
}

// TestAggregatedAPIService: an APIService whose Service is a server on
// this machine (an EndpointSlice naming it) is checked, reported
// Available, listed in discovery and proxied to with the front proxy's
// certificate and the user in X-Remote-* headers (never the client's
// credentials); with no endpoint it is MissingEndpoints and its clients
// get 503. The server's own group/versions are Local APIServices, and
// extension-apiserver-authentication publishes the front proxy's CA.
func TestAggregatedAPIService(t *testing.T) {
	ts := startServer(t, "")
	started := time.Now()
	ctx := context.Background()
	ext := startExtensionServer(t)
	_, port, _ := net.SplitHostPort(ext.Listener.Addr().String())
	target, _ := strconv.Atoi(port)

	var auth *corev1.ConfigMap
	waitFor(t, "extension-apiserver-authentication", func() bool {
		var err error
		auth, err = ts.client.CoreV1().ConfigMaps("kube-system").Get(ctx, "extension-apiserver-authentication", metav1.GetOptions{})
		return err == nil
	})
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM([]byte(auth.Data["requestheader-client-ca-file"])) || auth.Data["requestheader-allowed-names"] != `["front-proxy-client"]` ||
		!strings.Contains(auth.Data["client-ca-file"], "BEGIN CERTIFICATE") {
		t.Fatalf("extension-apiserver-authentication: %v", auth.Data)
	}
	ext.mu.Lock()
	ext.roots = roots
	ext.mu.Unlock()
	waitFor(t, "the local APIServices", func() bool {
		s, err := getAPIService(ctx, ts, "v1.node.k8s.io")
		return err == nil && s.Spec.Service == nil && available(s) == "True/Local"
	})
	t.Logf("the local APIServices were registered %s after the server answered", time.Since(started))

	if _, err := ts.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "demo"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.client.CoreV1().Services("demo").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "demo"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 443, TargetPort: intstr.FromInt32(int32(target))}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	host, _, _ := net.SplitHostPort(ext.Listener.Addr().String())
	slice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "demo", Labels: map[string]string{discoveryv1.LabelServiceName: "demo"}},
		AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{{Addresses: []string{host}}},
		Ports: []discoveryv1.EndpointPort{{Port: ptr.To(int32(target)), Protocol: ptr.To(corev1.ProtocolTCP)}}}
	if _, err := ts.client.DiscoveryV1().EndpointSlices("demo").Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	apiService := &apiregistrationv1.APIService{ObjectMeta: metav1.ObjectMeta{Name: "v1.demo.orch.test"}, Spec: apiregistrationv1.APIServiceSpec{
		Group: "demo.orch.test", Version: "v1", GroupPriorityMinimum: 1000, VersionPriority: 15, CABundle: ext.caPEM,
		Service: &apiregistrationv1.ServiceReference{Namespace: "demo", Name: "demo"}}}
	body, _ := json.Marshal(apiService)
	if err := ts.client.Discovery().RESTClient().Post().AbsPath("/apis/apiregistration.k8s.io/v1/apiservices").Body(body).SetHeader("Content-Type", "application/json").Do(ctx).Error(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "v1.demo.orch.test Available", func() bool {
		s, err := getAPIService(ctx, ts, "v1.demo.orch.test")
		return err == nil && available(s) == "True/Passed"
	})
	s, _ := getAPIService(ctx, ts, "v1.demo.orch.test")
	if port := ptr.Deref(s.Spec.Service.Port, 0); port != 443 {
		t.Errorf("the Service's port defaulted to %d, want 443", port)
	}

	raw, err := ts.client.Discovery().RESTClient().Get().AbsPath("/apis/demo.orch.test/v1/namespaces/demo/widgets").DoRaw(ctx)
	if err != nil || !strings.Contains(string(raw), `"name":"w1"`) {
		t.Fatalf("a list through the aggregator: %v %s", err, raw)
	}
	ext.mu.Lock()
	last := ext.seen["/apis/demo.orch.test/v1/namespaces/demo/widgets"]
	ext.mu.Unlock()
	if last != "system:admin system:masters,system:authenticated true " {
		t.Errorf("the extension server saw %q, want the admin, its groups, the front proxy's certificate and no Authorization", last)
	}
	_, resources, err := ts.client.Discovery().ServerGroupsAndResources()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, rl := range resources {
		for _, r := range rl.APIResources {
			found = found || rl.GroupVersion == "demo.orch.test/v1" && r.Name == "widgets"
		}
	}
	if !found {
		t.Error("discovery does not list demo.orch.test/v1 widgets")
	}

	// Its OpenAPI document: in the index, fetched from it.
	index, err := ts.client.Discovery().RESTClient().Get().AbsPath("/openapi/v3").DoRaw(ctx)
	if err != nil || !strings.Contains(string(index), `"apis/demo.orch.test/v1":{"serverRelativeURL":"/openapi/v3/apis/demo.orch.test/v1"}`) {
		t.Errorf("the OpenAPI v3 index: %v %s", err, index)
	}
	doc, err := ts.client.Discovery().RESTClient().Get().AbsPath("/openapi/v3/apis/demo.orch.test/v1").DoRaw(ctx)
	if err != nil || !strings.Contains(string(doc), `"title":"demo"`) {
		t.Errorf("the aggregated OpenAPI v3 document: %v %s", err, doc)
	}

	// A caBundle that does not sign the server's certificate: never
	// trusted, never proxied to.
	wrongCA := startExtensionServer(t).caPEM
	untrusted := apiService.DeepCopy()
	untrusted.Name, untrusted.Spec.Group, untrusted.Spec.CABundle = "v1.untrusted.orch.test", "untrusted.orch.test", wrongCA
	body, _ = json.Marshal(untrusted)
	if err := ts.client.Discovery().RESTClient().Post().AbsPath("/apis/apiregistration.k8s.io/v1/apiservices").Body(body).SetHeader("Content-Type", "application/json").Do(ctx).Error(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "an untrusted server reported", func() bool {
		s, err := getAPIService(ctx, ts, "v1.untrusted.orch.test")
		return err == nil && available(s) == "False/FailedDiscoveryCheck"
	})
	if err := ts.client.Discovery().RESTClient().Get().AbsPath("/apis/untrusted.orch.test/v1/namespaces/demo/widgets").Do(ctx).Error(); !apierrors.IsServiceUnavailable(err) {
		t.Errorf("a request to an untrusted server: %v", err)
	}

	// metrics-server's APIService replaces orch's own metrics.k8s.io, as
	// on Kubernetes; deleted, orch's own is back.
	metrics, err := getAPIService(ctx, ts, "v1beta1.metrics.k8s.io")
	if err != nil || metrics.Spec.Service != nil {
		t.Fatalf("orch's own metrics.k8s.io APIService: %v %+v", err, metrics)
	}
	metrics.Spec.Service, metrics.Spec.CABundle = &apiregistrationv1.ServiceReference{Namespace: "demo", Name: "demo"}, ext.caPEM
	metrics.Spec.GroupPriorityMinimum, metrics.Spec.VersionPriority = 100, 100
	body, _ = json.Marshal(metrics)
	if err := ts.client.Discovery().RESTClient().Put().AbsPath("/apis/apiregistration.k8s.io/v1/apiservices/v1beta1.metrics.k8s.io").Body(body).SetHeader("Content-Type", "application/json").Do(ctx).Error(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "metrics-server's metrics.k8s.io available", func() bool {
		s, err := getAPIService(ctx, ts, "v1beta1.metrics.k8s.io")
		return err == nil && available(s) == "True/Passed"
	})
	raw, err = ts.client.Discovery().RESTClient().Get().AbsPath("/apis/metrics.k8s.io/v1beta1/nodes").DoRaw(ctx)
	if err != nil || !strings.Contains(string(raw), "from-metrics-server") {
		t.Errorf("node metrics with metrics-server registered: %v %s", err, raw)
	}
	if err := ts.client.Discovery().RESTClient().Delete().AbsPath("/apis/apiregistration.k8s.io/v1/apiservices/v1beta1.metrics.k8s.io").Do(ctx).Error(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "orch's own metrics.k8s.io back", func() bool {
		s, err := getAPIService(ctx, ts, "v1beta1.metrics.k8s.io")
		return err == nil && s.Spec.Service == nil && available(s) == "True/Local"
	})
	if raw, err := ts.client.Discovery().RESTClient().Get().AbsPath("/apis/metrics.k8s.io/v1beta1/nodes").DoRaw(ctx); err != nil || strings.Contains(string(raw), "from-metrics-server") {
		t.Errorf("node metrics once metrics-server's APIService is gone: %v %s", err, raw)
	}

	// No endpoint: MissingEndpoints, and 503 to its clients.
	if err := ts.client.DiscoveryV1().EndpointSlices("demo").Delete(ctx, "demo", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "v1.demo.orch.test MissingEndpoints", func() bool {
		s, err := getAPIService(ctx, ts, "v1.demo.orch.test")
		return err == nil && available(s) == "False/MissingEndpoints"
	})
	err = ts.client.Discovery().RESTClient().Get().AbsPath("/apis/demo.orch.test/v1/namespaces/demo/widgets").Do(ctx).Error()
	if !apierrors.IsServiceUnavailable(err) {
		t.Errorf("a request to an unavailable APIService: %v", err)
	}
}

func getAPIService(ctx context.Context, ts *testServer, name string) (*apiregistrationv1.APIService, error) {
	raw, err := ts.client.Discovery().RESTClient().Get().AbsPath("/apis/apiregistration.k8s.io/v1/apiservices/" + name).DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	var s apiregistrationv1.APIService
	return &s, json.Unmarshal(raw, &s)
}

func available(s *apiregistrationv1.APIService) string {
	for _, c := range s.Status.Conditions {
		if c.Type == apiregistrationv1.Available {
			return string(c.Status) + "/" + c.Reason
		}
	}
	return ""
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	// The server's loops look every 10 s: twice that and some.
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 30 s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
