package api_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

func certPEM(t *testing.T, cn string, isCA bool) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour),
		IsCA: isCA, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// TestClusterTrustBundles: certificates.k8s.io/v1 ClusterTrustBundles as
// Kubernetes 1.37 serves them: the API server's CA published under
// kubernetes.io/kube-apiserver-serving; Kubernetes' validation (names by
// signer, CA certificates only, each once); a bundle linked to a signer
// written only by who may attest for it; nodes read them, never write.
func TestClusterTrustBundles(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	ctbs := ts.client.CertificatesV1().ClusterTrustBundles()
	waitFor(t, "the API server's trust bundle", func() bool {
		list, err := ctbs.List(ctx, metav1.ListOptions{FieldSelector: "spec.signerName=kubernetes.io/kube-apiserver-serving"})
		return err == nil && len(list.Items) == 1 && strings.HasPrefix(list.Items[0].Name, "kubernetes.io:kube-apiserver-serving:") &&
			list.Items[0].Spec.TrustBundle == string(ts.srv.CACert())
	})
	ca := certPEM(t, "team-ca", true)
	bundle := func(name, signer, pemData string) *certificatesv1.ClusterTrustBundle {
		return &certificatesv1.ClusterTrustBundle{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: certificatesv1.ClusterTrustBundleSpec{SignerName: signer, TrustBundle: pemData}}
	}
	if _, err := ctbs.Create(ctx, bundle("team", "", ca), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := ctbs.Create(ctx, bundle("example.com:team:one", "example.com/team", ca), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		b    *certificatesv1.ClusterTrustBundle
		want string
	}{
		{"a signer's without its prefix", bundle("one", "example.com/team", ca), "must be named with prefix example.com:team:"},
		{"no signer, a colon", bundle("a:b", "", ca), `without signer name must not have ":" in its name`},
		{"a leaf certificate", bundle("leaf", "", certPEM(t, "leaf", false)), "entry 0 does not have the CA bit set"},
		{"twice the same", bundle("twice", "", ca+ca), "duplicate trust anchor (indices [0 1])"},
		{"nothing", bundle("empty", "", ""), "at least one trust anchor must be provided"},
	} {
		_, err := ctbs.Create(ctx, tc.b, metav1.CreateOptions{})
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}

	// Who may create bundles but not attest for the signer.
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "bundle-writer"}, Rules: []rbacv1.PolicyRule{
		{Verbs: []string{"create", "update", "get"}, APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"clustertrustbundles"}}}}
	if _, err := ts.client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "bundle-writer"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "bundle-writer"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "writer"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(ts.config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "writer", Groups: []string{"system:authenticated"}}
	writer := kubernetes.NewForConfigOrDie(cfg).CertificatesV1().ClusterTrustBundles()
	waitFor(t, "the writer's role in force", func() bool {
		_, err := writer.Create(ctx, bundle("writers", "", ca), metav1.CreateOptions{})
		return err == nil
	})
	_, err := writer.Create(ctx, bundle("example.com:team:two", "example.com/team", ca), metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `user not permitted to attest for signerName "example.com/team"`) {
		t.Errorf("a signer's bundle without attest: %v", err)
	}

	// A node reads bundles (the kubelet projects them), and writes none.
	node := ts.as(t, "system:node:n1", "system:nodes")
	if code, msg := node.do("GET", "/apis/certificates.k8s.io/v1/clustertrustbundles/team", "", ""); code != 200 {
		t.Errorf("a node reading a bundle: %d %s", code, msg)
	}
	if code, _ := node.do("DELETE", "/apis/certificates.k8s.io/v1/clustertrustbundles/team", "", ""); code != 403 {
		t.Errorf("a node deleting a bundle: %d", code)
	}
}
