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
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"
)

// BenchmarkAggregatedGet: 2,000 GETs of one object of an aggregated API
// (an extension server on this machine, behind an APIService), one at a
// time, straight to the extension server and through orch (its
// authentication, authorization and the proxy to the Service's endpoint
// over TLS), same run: the p50 and p99 of each and what orch adds.
func BenchmarkAggregatedGet(b *testing.B) {
	const gets = 2000
	for range b.N {
		cfg := server(b)
		ctx := context.Background()
		admin := kubernetes.NewForConfigOrDie(rest.CopyConfig(cfg))
		ext, caPEM := benchExtensionServer(b)
		host, port, _ := net.SplitHostPort(ext.Listener.Addr().String())
		target, _ := strconv.Atoi(port)
		if _, err := admin.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "ext"},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 443, TargetPort: intstr.FromInt32(int32(target))}}}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		if _, err := admin.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: "ext", Labels: map[string]string{discoveryv1.LabelServiceName: "ext"}},
			AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{{Addresses: []string{host}}},
			Ports: []discoveryv1.EndpointPort{{Port: ptr.To(int32(target)), Protocol: ptr.To(corev1.ProtocolTCP)}}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		body, _ := json.Marshal(&apiregistrationv1.APIService{ObjectMeta: metav1.ObjectMeta{Name: "v1.bench.orch.test"}, Spec: apiregistrationv1.APIServiceSpec{
			Group: "bench.orch.test", Version: "v1", GroupPriorityMinimum: 1000, VersionPriority: 15, CABundle: caPEM,
			Service: &apiregistrationv1.ServiceReference{Namespace: "default", Name: "ext"}}})
		rc := admin.Discovery().RESTClient()
		if err := rc.Post().AbsPath("/apis/apiregistration.k8s.io/v1/apiservices").Body(body).SetHeader("Content-Type", "application/json").Do(ctx).Error(); err != nil {
			b.Fatal(err)
		}
		const path = "/apis/bench.orch.test/v1/namespaces/default/things/one"
		for deadline := time.Now().Add(30 * time.Second); ; {
			if _, err := rc.Get().AbsPath(path).DoRaw(ctx); err == nil {
				break
			}
			if time.Now().After(deadline) {
				b.Fatal("the aggregated API never answered through orch")
			}
			time.Sleep(50 * time.Millisecond)
		}
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(caPEM)
		direct := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: "ext.default.svc", MinVersion: tls.VersionTLS12}}}
		measure := func(get func() error) []time.Duration {
			lat := make([]time.Duration, 0, gets)
			for range gets {
				start := time.Now()
				if err := get(); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			return lat
		}
		straight := latencies(measure(func() error {
			resp, err := direct.Get(ext.URL + path)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body) // read whole: the connection is kept
				_ = resp.Body.Close()
			}
			return err
		}))
		through := latencies(measure(func() error { _, err := rc.Get().AbsPath(path).DoRaw(ctx); return err }))
		b.ReportMetric(ms(straight[0]), "p50-direct-ms")
		b.ReportMetric(ms(straight[1]), "p99-direct-ms")
		b.ReportMetric(ms(through[0]), "p50-ms")
		b.ReportMetric(ms(through[1]), "p99-ms")
		b.ReportMetric(ms(through[1]-straight[1]), "added-p99-ms")
	}
}

// benchExtensionServer answers every GET with a small object and the
// discovery of bench.orch.test/v1, over TLS for ext.default.svc, on an
// address of this machine that is not loopback (endpoints may not be).
func benchExtensionServer(b *testing.B) (*httptest.Server, []byte) {
	b.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "bench-ca"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		b.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(2), DNSNames: []string{"ext.default.svc"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, ca, key.Public(), caKey)
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/apis/bench.orch.test/v1" {
			_, _ = w.Write([]byte(`{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"bench.orch.test/v1","resources":[{"name":"things","namespaced":true,"kind":"Thing","verbs":["get"]}]}`))
			return
		}
		_, _ = w.Write([]byte(`{"apiVersion":"bench.orch.test/v1","kind":"Thing","metadata":{"name":"one","namespace":"default"},"spec":{"size":1}}`))
	}))
	var host string
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() && !ipn.IP.IsLinkLocalUnicast() {
			host = ipn.IP.String()
			break
		}
	}
	if host == "" {
		b.Skip("no address of this machine but loopback for an endpoint")
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		b.Fatal(err)
	}
	_ = srv.Listener.Close()
	srv.Listener = ln
	srv.TLS = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	srv.StartTLS()
	b.Cleanup(srv.Close)
	return srv, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
}
