package loops_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/loops/hollow"
	"github.com/orch-dev/orch/internal/loops/loopstest"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
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

// certificateRequest is a PKCS#10 request (PEM) for the subject and IPs,
// and its key.
func certificateRequest(t *testing.T, subject pkix.Name, ips ...net.IP) ([]byte, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: subject, IPAddresses: ips}, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), key
}

func signingRequest(name, signer string, request []byte, usages ...certificatesv1.KeyUsage) *certificatesv1.CertificateSigningRequest {
	return &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: certificatesv1.CertificateSigningRequestSpec{Request: request, SignerName: signer, Usages: usages, ExpirationSeconds: ptr.To[int32](3600)}}
}

func impersonating(t *testing.T, c *loopstest.Cluster, user string, groups ...string) kubernetes.Interface {
	t.Helper()
	cfg := rest.CopyConfig(c.Server.Admin)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: append(groups, "system:authenticated")}
	return kubernetes.NewForConfigOrDie(cfg)
}

func issued(t *testing.T, c *loopstest.Cluster, name string) *x509.Certificate {
	t.Helper()
	var cert *x509.Certificate
	c.Eventually("certificate of "+name+" issued", 10*time.Second, func(ctx context.Context) (bool, error) {
		csr, err := c.Client.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		if err != nil || len(csr.Status.Certificate) == 0 {
			return false, err
		}
		block, _ := pem.Decode(csr.Status.Certificate)
		cert, err = x509.ParseCertificate(block.Bytes)
		return true, err
	})
	return cert
}

// TestCertificateSigningRequests: a node's request for its own client
// certificate is approved and signed by the loops with no person; a
// user's waits for `kubectl certificate approve`, then its certificate
// authenticates her by its CN and O; what Kubernetes refuses is refused
// (a node asking for another node's name, system:masters, approving
// without the right on the signer, a request that does not fit its
// signer fails instead of being signed).
func TestCertificateSigningRequests(t *testing.T) {
	c := loopstest.Start(t, nil, hollow.Options{LeaseEvery: -1})
	csrs := c.Client.CertificatesV1().CertificateSigningRequests()

	// A node renewing its client certificate.
	node := impersonating(t, c, "system:node:edge1", "system:nodes")
	req, _ := certificateRequest(t, pkix.Name{CommonName: "system:node:edge1", Organization: []string{"system:nodes"}})
	if _, err := node.CertificatesV1().CertificateSigningRequests().Create(c.Ctx, signingRequest("node-edge1", certificatesv1.KubeAPIServerClientKubeletSignerName, req,
		certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cert := issued(t, c, "node-edge1")
	if cert.Subject.CommonName != "system:node:edge1" || !slicesEqual(cert.Subject.Organization, []string{"system:nodes"}) ||
		len(cert.ExtKeyUsage) != 1 || cert.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth {
		t.Errorf("node certificate: subject %v, usages %v", cert.Subject, cert.ExtKeyUsage)
	}
	// Kubernetes' conformance bound: no longer than asked plus the backdating.
	if life := cert.NotAfter.Sub(cert.NotBefore); life > time.Hour+5*time.Minute || life < time.Hour {
		t.Errorf("certificate asked for an hour lives %s", life)
	}
	got, _ := csrs.Get(c.Ctx, "node-edge1", metav1.GetOptions{})
	if got.Spec.Username != "system:node:edge1" || got.Status.Conditions[0].Reason != "AutoApproved" {
		t.Errorf("node request: username %q, conditions %+v", got.Spec.Username, got.Status.Conditions)
	}

	// A node may not ask for another node's certificate (NodeRestriction).
	other, _ := certificateRequest(t, pkix.Name{CommonName: "system:node:edge2", Organization: []string{"system:nodes"}}, net.ParseIP("192.0.2.2"))
	_, err := node.CertificatesV1().CertificateSigningRequests().Create(c.Ctx, signingRequest("serving-edge2", certificatesv1.KubeletServingSignerName, other,
		certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth), metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "can only create a node CSR with CN=system:node:edge1") {
		t.Errorf("a node's request for another node's serving certificate: %v", err)
	}
	// Nor may anyone ask the client signer for system:masters.
	masters, _ := certificateRequest(t, pkix.Name{CommonName: "mallory", Organization: []string{"system:masters"}})
	_, err = csrs.Create(c.Ctx, signingRequest("mallory", certificatesv1.KubeAPIServerClientSignerName, masters, certificatesv1.UsageClientAuth), metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "system:masters group is not allowed") {
		t.Errorf("a request for system:masters: %v", err)
	}
	// A request that is not one: the field and why.
	_, err = csrs.Create(c.Ctx, signingRequest("garbage", certificatesv1.KubeAPIServerClientSignerName, []byte("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"),
		certificatesv1.UsageClientAuth), metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.request") {
		t.Errorf("a malformed request: %v", err)
	}
	_, err = csrs.Create(c.Ctx, signingRequest("legacy", "kubernetes.io/legacy-unknown", masters, certificatesv1.UsageClientAuth), metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "the legacy signerName is not allowed") {
		t.Errorf("the legacy signer: %v", err)
	}

	// A user's request waits for a person.
	aliceReq, aliceKey := certificateRequest(t, pkix.Name{CommonName: "alice", Organization: []string{"team"}})
	if _, err := csrs.Create(c.Ctx, signingRequest("alice", certificatesv1.KubeAPIServerClientSignerName, aliceReq, certificatesv1.UsageClientAuth), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if got, _ := csrs.Get(c.Ctx, "alice", metav1.GetOptions{}); len(got.Status.Conditions) != 0 || len(got.Status.Certificate) != 0 {
		t.Fatalf("a user's request was not left pending: %+v", got.Status)
	}
	// Someone who may update approval but not approve for the signer.
	bob := impersonating(t, c, "bob")
	grant(t, c, "bob", rbacv1.PolicyRule{Verbs: []string{"get", "update"}, APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests", "certificatesigningrequests/approval", "certificatesigningrequests/status"}})
	got, _ = csrs.Get(c.Ctx, "alice", metav1.GetOptions{})
	approved := got.DeepCopy()
	approved.Status.Conditions = append(approved.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "KubectlApprove"})
	_, err = bob.CertificatesV1().CertificateSigningRequests().UpdateApproval(c.Ctx, "alice", approved, metav1.UpdateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `user not permitted to approve requests with signerName "kubernetes.io/kube-apiserver-client"`) {
		t.Errorf("approval without the right on the signer: %v", err)
	}
	// A well-formed certificate, so that only the right to sign refuses it.
	forgeKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	forgeTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "alice"}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)}
	forgeDER, err := x509.CreateCertificate(rand.Reader, forgeTmpl, forgeTmpl, forgeKey.Public(), forgeKey)
	if err != nil {
		t.Fatal(err)
	}
	forged := got.DeepCopy()
	forged.Status.Certificate = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: forgeDER})
	_, err = bob.CertificatesV1().CertificateSigningRequests().UpdateStatus(c.Ctx, forged, metav1.UpdateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `user not permitted to sign requests with signerName "kubernetes.io/kube-apiserver-client"`) {
		t.Errorf("a certificate set without the right to sign: %v", err)
	}
	// Approval may not come through status, even from the admin.
	if _, err = csrs.UpdateStatus(c.Ctx, approved, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), `updates may not add a condition of type "Approved"`) {
		t.Errorf("approval through status: %v", err)
	}
	if _, err = csrs.UpdateApproval(c.Ctx, "alice", approved, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	aliceCert := issued(t, c, "alice")
	got, _ = csrs.Get(c.Ctx, "alice", metav1.GetOptions{})
	cfg := rest.AnonymousClientConfig(c.Server.Admin)
	keyDER, err := x509.MarshalECPrivateKey(aliceKey)
	if err != nil {
		t.Fatal(err)
	}
	cfg.CertData, cfg.KeyData = got.Status.Certificate, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	if _, err := tls.X509KeyPair(cfg.CertData, cfg.KeyData); err != nil {
		t.Fatal(err)
	}
	who, err := kubernetes.NewForConfigOrDie(cfg).AuthenticationV1().SelfSubjectReviews().Create(c.Ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if u := who.Status.UserInfo; u.Username != "alice" || !slicesEqual(u.Groups, []string{"team", "system:authenticated"}) {
		t.Errorf("alice's certificate (CN %s) authenticates as %+v", aliceCert.Subject.CommonName, u)
	}

	// Writes through approval and status keep their metadata, as
	// Kubernetes' (its conformance suite patches both with annotations).
	patched, err := csrs.Patch(c.Ctx, "alice", types.MergePatchType, []byte(`{"metadata":{"annotations":{"reviewed":"yes"}},"status":{"conditions":[{"type":"Approved","status":"True","reason":"KubectlApprove"},{"type":"Reviewed","status":"True"}]}}`), metav1.PatchOptions{}, "approval")
	if err != nil || patched.Annotations["reviewed"] != "yes" || len(patched.Status.Conditions) != 2 || len(patched.Status.Certificate) == 0 {
		t.Errorf("a patch of approval: %v, annotations %v, conditions %+v", err, patched.Annotations, patched.Status.Conditions)
	}

	// Approved, but not what its signer signs: Failed, never signed.
	servingReq, _ := certificateRequest(t, pkix.Name{CommonName: "web", Organization: []string{"team"}}, net.ParseIP("192.0.2.9"))
	if _, err := csrs.Create(c.Ctx, signingRequest("wrong-serving", certificatesv1.KubeletServingSignerName, servingReq,
		certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, _ = csrs.Get(c.Ctx, "wrong-serving", metav1.GetOptions{})
	got.Status.Conditions = append(got.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue})
	if _, err := csrs.UpdateApproval(c.Ctx, "wrong-serving", got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("a request that does not fit its signer failed", 10*time.Second, func(ctx context.Context) (bool, error) {
		csr, err := csrs.Get(ctx, "wrong-serving", metav1.GetOptions{})
		for _, cond := range csr.Status.Conditions {
			if cond.Type == certificatesv1.CertificateFailed {
				return cond.Reason == "SignerValidationFailure" && len(csr.Status.Certificate) == 0 && strings.Contains(cond.Message, "system:nodes"), err
			}
		}
		return false, err
	})
}

// grant gives user the rule cluster-wide.
func grant(t *testing.T, c *loopstest.Cluster, user string, rule rbacv1.PolicyRule) {
	t.Helper()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: user + "-grant"}, Rules: []rbacv1.PolicyRule{rule}}
	if _, err := c.Client.RbacV1().ClusterRoles().Create(c.Ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user + "-grant"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}
	if _, err := c.Client.RbacV1().ClusterRoleBindings().Create(c.Ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The authorizer learns of roles and bindings through a watch, as
	// Kubernetes' does: wait until it allows what was granted, as the
	// conformance suite's WaitForNamedAuthorizationUpdate does.
	review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: user,
		ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: rule.Verbs[0], Group: rule.APIGroups[0], Resource: rule.Resources[0]}}}
	c.Eventually(user+"'s grant in force", 10*time.Second, func(ctx context.Context) (bool, error) {
		got, err := c.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
		return err == nil && got.Status.Allowed, err
	})
}

func slicesEqual(a, b []string) bool { return strings.Join(a, "\x00") == strings.Join(b, "\x00") }
