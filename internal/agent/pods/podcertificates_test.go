package pods

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/agent/volumes"
	"github.com/orch-dev/orch/internal/api"
	"github.com/orch-dev/orch/internal/api/apitest"
	"github.com/orch-dev/orch/internal/api/pki"
	"github.com/orch-dev/orch/internal/kube"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

// TestPodCertificate: a node serves a podCertificate source as the
// kubelet does, against a real API server with its own identity (the node
// authorizer and NodeRestriction in the way): the pod waits while a
// PodCertificateRequest for a key made on the node names the pod, its
// account and the node; once a signer issues it, the key and chain are
// served (the key the certificate's), and again without a new request; a
// denied request is asked again.
func TestPodCertificate(t *testing.T) {
	var dir string
	srv := apitest.StartWith(t, func(c *api.Config) { dir = c.DataDir })
	ctx := context.Background()
	admin := srv.Client
	node, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"app"} {
		if _, err := admin.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pod, err := admin.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: corev1.PodSpec{
		NodeName: "n1", ServiceAccountName: "app", Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sa, err := admin.CoreV1().ServiceAccounts("default").Get(ctx, "app", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pki.LoadOrCreateCA(filepath.Join(dir, "server", "tls"))
	if err != nil {
		t.Fatal(err)
	}
	kp, err := ca.Issue(pki.Request{CommonName: "system:node:n1", Organization: []string{"system:nodes"}, Client: true})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(srv.Admin)
	cfg.CertData, cfg.KeyData = kp.CertPEM, kp.KeyPEM
	nodeClient, err := kube.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m := &Manager{api: nodeClient, cfg: Config{Node: "n1"}, podCerts: podCertificates{clock: clock.RealClock{}}}
	src := &corev1.PodCertificateProjection{SignerName: "example.com/pods", KeyType: "ECDSAP256", MaxExpirationSeconds: ptr.To[int32](7200),
		UserAnnotations: map[string]string{"example.com/role": "web"}}
	waitingFor := func(index int) {
		t.Helper()
		_, _, err := m.sources("default").PodCertificate(ctx, pod, "certs", index, src)
		var ve *volumes.Error
		if !errors.As(err, &ve) || ve.Reason != "ContainerCreating" || !strings.Contains(ve.Message, "waiting for PodCertificateRequest") {
			t.Fatalf("before the signer answered: %v", err)
		}
	}
	waitingFor(0)
	list, err := admin.CertificatesV1().PodCertificateRequests("default").List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("requests: %v %d", err, len(list.Items))
	}
	req := list.Items[0]
	if req.Spec.PodUID != pod.UID || req.Spec.NodeUID != node.UID || req.Spec.ServiceAccountUID != sa.UID || req.Spec.NodeName != "n1" ||
		*req.Spec.MaxExpirationSeconds != 7200 || req.Spec.UnverifiedUserAnnotations["example.com/role"] != "web" ||
		len(req.OwnerReferences) != 1 || req.OwnerReferences[0].UID != pod.UID {
		t.Errorf("request %+v", req)
	}
	// The signer: a certificate for the request's key.
	stub, err := x509.ParseCertificateRequest(req.Spec.StubPKCS10Request)
	if err != nil {
		t.Fatal(err)
	}
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	now := time.Now().Truncate(time.Second)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "pods"}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, _ := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	podCA, _ := x509.ParseCertificate(caDER)
	leafDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(2), NotBefore: now, NotAfter: now.Add(2 * time.Hour)}, podCA, stub.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	req.Status = certificatesv1.PodCertificateRequestStatus{
		Conditions:       []metav1.Condition{{Type: "Issued", Status: metav1.ConditionTrue, Reason: "Issued", Message: "ok", LastTransitionTime: metav1.Now()}},
		CertificateChain: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER})),
		NotBefore:        ptr.To(metav1.NewTime(now)), NotAfter: ptr.To(metav1.NewTime(now.Add(2 * time.Hour))), BeginRefreshAt: ptr.To(metav1.NewTime(now.Add(time.Hour)))}
	if _, err := admin.CertificatesV1().PodCertificateRequests("default").UpdateStatus(ctx, &req, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	key, chain, err := m.sources("default").PodCertificate(ctx, pod, "certs", 0, src)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(key)
	priv, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(leafDER)
	if !priv.(*ecdsa.PrivateKey).PublicKey.Equal(leaf.PublicKey) || string(chain) != req.Status.CertificateChain {
		t.Error("the served key is not the certificate's, or the chain is not the signer's")
	}
	if _, _, err := m.sources("default").PodCertificate(ctx, pod, "certs", 0, src); err != nil {
		t.Fatal(err)
	}
	if list, _ := admin.CertificatesV1().PodCertificateRequests("default").List(ctx, metav1.ListOptions{}); len(list.Items) != 1 {
		t.Errorf("%d requests after the credentials were served again, want 1", len(list.Items))
	}

	// Denied: told, and asked again.
	waitingFor(1)
	list, _ = admin.CertificatesV1().PodCertificateRequests("default").List(ctx, metav1.ListOptions{})
	for i := range list.Items {
		r := &list.Items[i]
		if len(r.Status.Conditions) > 0 {
			continue
		}
		r.Status.Conditions = []metav1.Condition{{Type: "Denied", Status: metav1.ConditionTrue, Reason: "Policy", Message: "not this pod", LastTransitionTime: metav1.Now()}}
		if _, err := admin.CertificatesV1().PodCertificateRequests("default").UpdateStatus(ctx, r, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	_, _, err = m.sources("default").PodCertificate(ctx, pod, "certs", 1, src)
	if err == nil || !strings.Contains(err.Error(), "Denied: not this pod") {
		t.Errorf("a denied request: %v", err)
	}
	waitingFor(1)
	if list, _ := admin.CertificatesV1().PodCertificateRequests("default").List(ctx, metav1.ListOptions{}); len(list.Items) != 3 {
		t.Errorf("%d requests after a denial, want 3 (asked again)", len(list.Items))
	}
}
