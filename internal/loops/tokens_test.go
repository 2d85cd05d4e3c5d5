package loops_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api"
	"github.com/orch-dev/orch/internal/loops"
	"github.com/orch-dev/orch/internal/loops/hollow"
	"github.com/orch-dev/orch/internal/loops/loopstest"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestRootCAConfigMap: every namespace has kube-root-ca.crt with the
// cluster CA, a new one within a second, and a deleted or changed one is
// put back, as Kubernetes' root-CA publisher keeps it; a rotated CA is
// published in every namespace.
func TestRootCAConfigMap(t *testing.T) {
	var dataDir string
	c := loopstest.StartWithServer(t, func(cfg *api.Config) { dataDir = cfg.DataDir }, nil, hollow.Options{LeaseEvery: -1}, loops.Options{})
	ca := c.Server.CACert()
	holdsCA := func(ns string) func(ctx context.Context) (bool, error) {
		return func(ctx context.Context) (bool, error) {
			cm, err := c.Client.CoreV1().ConfigMaps(ns).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			return err == nil && cm.Data["ca.crt"] == string(ca) && len(cm.Data) == 1, err
		}
	}
	c.Eventually("kube-root-ca.crt in kube-system", 10*time.Second, holdsCA("kube-system"))
	start := time.Now()
	if _, err := c.Client.CoreV1().Namespaces().Create(c.Ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("kube-root-ca.crt in a new namespace", time.Second, holdsCA("team"))
	t.Logf("a new namespace had kube-root-ca.crt %s after its creation", time.Since(start))
	if err := c.Client.CoreV1().ConfigMaps("team").Delete(c.Ctx, "kube-root-ca.crt", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("a deleted kube-root-ca.crt back", 5*time.Second, holdsCA("team"))
	cm, err := c.Client.CoreV1().ConfigMaps("team").Get(c.Ctx, "kube-root-ca.crt", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data = map[string]string{"ca.crt": "not a CA", "extra": "x"}
	if _, err := c.Client.CoreV1().ConfigMaps("team").Update(c.Ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("a changed kube-root-ca.crt put right", 5*time.Second, holdsCA("team"))

	// orch certificate rotate-ca: the new bundle is published everywhere.
	before := ca
	if _, err := api.RotateCA(c.Ctx, dataDir, false, false); err != nil {
		t.Fatal(err)
	}
	if ca = c.Server.CACert(); bytes.Equal(ca, before) || !bytes.Contains(ca, before) {
		t.Fatal("the rotated bundle is not a new CA with the old one")
	}
	c.Eventually("the rotated CA in kube-root-ca.crt", 20*time.Second, holdsCA("team"))
	c.Eventually("the rotated CA in kube-system's kube-root-ca.crt", time.Second, holdsCA("kube-system"))
}

// TestLegacyTokenSecrets: a kubernetes.io/service-account-token Secret
// gets a token (which authenticates as its account), the CA and the
// namespace; it is deleted with its account, and a Secret for an account
// that does not exist is deleted, as Kubernetes' token controller does.
func TestLegacyTokenSecrets(t *testing.T) {
	c := loopstest.Start(t, nil, hollow.Options{LeaseEvery: -1})
	core := c.Client.CoreV1()
	if _, err := core.ServiceAccounts("default").Create(c.Ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "builder"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	secret := func(name, account string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{corev1.ServiceAccountNameKey: account}},
			Type: corev1.SecretTypeServiceAccountToken}
	}
	for _, s := range []*corev1.Secret{secret("builder-token", "builder"), secret("ghost-token", "ghost")} {
		if _, err := core.Secrets("default").Create(c.Ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var token []byte
	c.Eventually("the token Secret filled in", 10*time.Second, func(ctx context.Context) (bool, error) {
		s, err := core.Secrets("default").Get(ctx, "builder-token", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		token = s.Data["token"]
		return len(token) > 0 && bytes.Equal(s.Data["ca.crt"], c.Server.CACert()) && string(s.Data["namespace"]) == "default" &&
			s.Annotations[corev1.ServiceAccountUIDKey] != "", nil
	})
	review, err := core.RESTClient().Post().AbsPath("/apis/authentication.k8s.io/v1/tokenreviews").
		Body(&authenticationv1.TokenReview{TypeMeta: metav1.TypeMeta{APIVersion: "authentication.k8s.io/v1", Kind: "TokenReview"},
			Spec: authenticationv1.TokenReviewSpec{Token: string(token)}}).DoRaw(c.Ctx)
	if err != nil || !bytes.Contains(review, []byte(`"username":"system:serviceaccount:default:builder"`)) {
		t.Errorf("TokenReview of the legacy token: %v %s", err, review)
	}
	gone := func(name string) func(ctx context.Context) (bool, error) {
		return func(ctx context.Context) (bool, error) {
			_, err := core.Secrets("default").Get(ctx, name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		}
	}
	c.Eventually("the Secret of a missing account deleted", 10*time.Second, gone("ghost-token"))
	if err := core.ServiceAccounts("default").Delete(c.Ctx, "builder", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Eventually("the account's token Secret deleted with it", 10*time.Second, gone("builder-token"))
}
