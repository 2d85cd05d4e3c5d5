package api_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// TestPodCertificateRequests: certificates.k8s.io/v1 PodCertificateRequests
// as Kubernetes 1.37 serves them: a node asks only for its own pods, with
// their, their accounts' and its own names and UIDs (NodeRestriction);
// Kubernetes' validation of the request and of a signer's answer (the
// leaf for the requested key, times as in the certificate, final once
// issued); answering needs the right to sign; a pod's podCertificate
// source is validated as Kubernetes does.
func TestPodCertificateRequests(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	node, err := ts.client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sa, err := ts.client.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "app"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ts.client.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	pod, err := ts.client.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: corev1.PodSpec{
		NodeName: "n1", ServiceAccountName: "app", Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	stub, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	request := func(name string, mutate func(*certificatesv1.PodCertificateRequest)) *certificatesv1.PodCertificateRequest {
		r := &certificatesv1.PodCertificateRequest{TypeMeta: metav1.TypeMeta{APIVersion: "certificates.k8s.io/v1", Kind: "PodCertificateRequest"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: certificatesv1.PodCertificateRequestSpec{
				SignerName: "example.com/pods", PodName: "web", PodUID: pod.UID, ServiceAccountName: "app", ServiceAccountUID: sa.UID,
				NodeName: "n1", NodeUID: node.UID, MaxExpirationSeconds: ptr.To[int32](86400), StubPKCS10Request: stub}}
		if mutate != nil {
			mutate(r)
		}
		return r
	}
	kubelet := ts.as(t, "system:node:n1", "system:nodes")
	post := func(r *certificatesv1.PodCertificateRequest) (int, string) {
		body, _ := json.Marshal(r)
		return kubelet.do("POST", "/apis/certificates.k8s.io/v1/namespaces/default/podcertificaterequests", jsonType, string(body))
	}
	if code, msg := post(request("web-1", nil)); code != 201 {
		t.Fatalf("the node's request for its pod: %d %s", code, msg)
	}
	for _, tc := range []struct {
		name   string
		mutate func(*certificatesv1.PodCertificateRequest)
		code   int
		want   string
	}{
		{"another node's", func(r *certificatesv1.PodCertificateRequest) { r.Spec.NodeName = "n2" }, 403, `which is not the requesting node "n1"`},
		{"another pod UID", func(r *certificatesv1.PodCertificateRequest) { r.Spec.PodUID = types.UID("x") }, 409, "differs from running pod"},
		{"another account", func(r *certificatesv1.PodCertificateRequest) { r.Spec.ServiceAccountName = "default" }, 403, "contains serviceAccountName"},
		{"a day too long for kubernetes.io", func(r *certificatesv1.PodCertificateRequest) {
			r.Spec.SignerName, r.Spec.MaxExpirationSeconds = "kubernetes.io/pods", ptr.To[int32](86401)
		}, 422, "spec.maxExpirationSeconds: Invalid value: 86401: must be in the range [3600, 86400]"},
		{"no key", func(r *certificatesv1.PodCertificateRequest) { r.Spec.StubPKCS10Request = nil }, 422, "exactly one of (stubPKCS10Request)"},
	} {
		if code, msg := post(request("bad", tc.mutate)); code != tc.code || !strings.Contains(msg, tc.want) {
			t.Errorf("%s: %d %q, want %d %q", tc.name, code, msg, tc.code, tc.want)
		}
	}

	// A signer's answer: a certificate for the requested key.
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "pods-ca"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(48 * time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, _ := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	ca, _ := x509.ParseCertificate(caDER)
	notBefore := time.Now().Truncate(time.Second)
	issue := func(pub any, lifetime time.Duration) *certificatesv1.PodCertificateRequest {
		der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(2), NotBefore: notBefore, NotAfter: notBefore.Add(lifetime)}, ca, pub, caKey)
		if err != nil {
			t.Fatal(err)
		}
		r, err := ts.client.CertificatesV1().PodCertificateRequests("default").Get(ctx, "web-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		r.Status = certificatesv1.PodCertificateRequestStatus{
			Conditions:       []metav1.Condition{{Type: "Issued", Status: metav1.ConditionTrue, Reason: "Reason", Message: "issued", LastTransitionTime: metav1.Now()}},
			CertificateChain: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
			NotBefore:        ptr.To(metav1.NewTime(notBefore)), NotAfter: ptr.To(metav1.NewTime(notBefore.Add(lifetime))),
			BeginRefreshAt: ptr.To(metav1.NewTime(notBefore.Add(lifetime / 2)))}
		return r
	}
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	pcrs := ts.client.CertificatesV1().PodCertificateRequests("default")
	if _, err := pcrs.UpdateStatus(ctx, issue(other.Public(), 2*time.Hour), metav1.UpdateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "leaf certificate was not issued to the requested public key") {
		t.Errorf("a certificate for another key: %v", err)
	}
	if _, err := pcrs.UpdateStatus(ctx, issue(key.Public(), 48*time.Hour), metav1.UpdateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "leaf certificate lifetime must be <= spec.maxExpirationSeconds (86400)") {
		t.Errorf("a certificate longer than asked: %v", err)
	}
	// Who may write status, but not sign for the signer.
	if _, err := ts.client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "pcr-status"}, Rules: []rbacv1.PolicyRule{
		{Verbs: []string{"get", "update"}, APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"podcertificaterequests", "podcertificaterequests/status"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "pcr-status"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "pcr-status"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "mallory"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(ts.config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "mallory", Groups: []string{"system:authenticated"}}
	mallory := kubernetes.NewForConfigOrDie(cfg).CertificatesV1().PodCertificateRequests("default")
	waitFor(t, "mallory's role in force", func() bool {
		_, err := mallory.Get(ctx, "web-1", metav1.GetOptions{})
		return err == nil
	})
	if _, err := mallory.UpdateStatus(ctx, issue(key.Public(), 2*time.Hour), metav1.UpdateOptions{}); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `user "mallory" is not permitted to "sign" for signer "example.com/pods"`) {
		t.Errorf("an answer without the right to sign: %v", err)
	}
	if _, err := pcrs.UpdateStatus(ctx, issue(key.Public(), 2*time.Hour), metav1.UpdateOptions{}); err != nil {
		t.Fatalf("a signer's answer: %v", err)
	}
	again := issue(key.Public(), 3*time.Hour)
	if _, err := pcrs.UpdateStatus(ctx, again, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "immutable after PodCertificateRequest is issued") {
		t.Errorf("a second answer: %v", err)
	}
	// A node does not answer requests.
	if code, msg := kubelet.do("PUT", "/apis/certificates.k8s.io/v1/namespaces/default/podcertificaterequests/web-1/status", jsonType, mustJSON(t, again)); code != 403 {
		t.Errorf("a node answering a request: %d %s", code, msg)
	}

	// A pod's podCertificate source, as Kubernetes validates it.
	bad := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "certs"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}},
		Volumes: []corev1.Volume{{Name: "cert", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
			{PodCertificate: &corev1.PodCertificateProjection{SignerName: "example.com/pods", KeyType: "ECDSAP256", MaxExpirationSeconds: ptr.To[int32](91*86400 + 1), CredentialBundlePath: "creds.pem"}}}}}}}}}
	if _, err := ts.client.CoreV1().Pods("default").Create(ctx, bad, metav1.CreateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "if provided, maxExpirationSeconds must be <= 7862400") {
		t.Errorf("a podCertificate longer than 91 days: %v", err)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
