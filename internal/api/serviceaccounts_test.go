package api_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api/apitest"
	"github.com/orch-dev/orch/internal/api/auth/satoken"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// bearerStatus is the HTTP status of a GET of path with token, from a
// client that trusts the cluster CA and presents no certificate.
func bearerStatus(t *testing.T, ts *testServer, token, path string) int {
	t.Helper()
	req, err := http.NewRequest("GET", ts.srv.URL()+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ts.srv.CACert())
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

func createSA(ctx context.Context, t *testing.T, c kubernetes.Interface, ns, name string, automount *bool) *corev1.ServiceAccount {
	t.Helper()
	sa, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name},
		AutomountServiceAccountToken: automount, ImagePullSecrets: []corev1.LocalObjectReference{{Name: "regcred"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return sa
}

func podAs(name, sa, node string, automount *bool) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{ServiceAccountName: sa, NodeName: node,
		AutomountServiceAccountToken: automount, Containers: []corev1.Container{{Name: "main", Image: "busybox"}},
		InitContainers: []corev1.Container{{Name: "init", Image: "busybox"}}}}
}

// apiAccess is the kube-api-access volume of a pod and whether every
// container mounts it where Kubernetes does.
func apiAccess(pod *corev1.Pod) (*corev1.Volume, bool) {
	for i, v := range pod.Spec.Volumes {
		if !strings.HasPrefix(v.Name, "kube-api-access-") {
			continue
		}
		all := true
		for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
			found := false
			for _, m := range c.VolumeMounts {
				found = found || m.Name == v.Name && m.ReadOnly && m.MountPath == "/var/run/secrets/kubernetes.io/serviceaccount"
			}
			all = all && found
		}
		return &pod.Spec.Volumes[i], all
	}
	return nil, false
}

// TestServiceAccountAdmission: a new pod gets its service account's
// credentials as Kubernetes' ServiceAccount admission gives them — the
// projected kube-api-access volume in every container, unless the pod or
// its account says automountServiceAccountToken: false (the pod's word
// wins) — and the account's image pull secrets; an account that does not
// exist is refused with Kubernetes' message.
func TestServiceAccountAdmission(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	createSA(ctx, t, ts.client, "default", "robot", nil)
	createSA(ctx, t, ts.client, "default", "silent", ptr.To(false))
	for _, tc := range []struct {
		name, sa  string
		automount *bool
		want      bool
	}{
		{"robot", "robot", nil, true},
		{"default-account", "", nil, true},
		{"pod-opts-out", "robot", ptr.To(false), false},
		{"account-opts-out", "silent", nil, false},
		{"pod-opts-back-in", "silent", ptr.To(true), true},
	} {
		pod, err := ts.client.CoreV1().Pods("default").Create(ctx, podAs(tc.name, tc.sa, "", tc.automount), metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		v, mounted := apiAccess(pod)
		if got := v != nil && mounted; got != tc.want {
			t.Errorf("%s: credentials mounted %v, want %v (%+v)", tc.name, got, tc.want, pod.Spec)
		}
		if v != nil {
			p := v.Projected
			if len(p.Sources) != 3 || p.Sources[0].ServiceAccountToken == nil || *p.Sources[0].ServiceAccountToken.ExpirationSeconds != 3607 ||
				p.Sources[1].ConfigMap == nil || p.Sources[1].ConfigMap.Name != "kube-root-ca.crt" || p.Sources[2].DownwardAPI == nil {
				t.Errorf("%s: volume %+v", tc.name, p)
			}
		}
		if tc.sa == "robot" && (len(pod.Spec.ImagePullSecrets) != 1 || pod.Spec.ImagePullSecrets[0].Name != "regcred") {
			t.Errorf("%s: image pull secrets %v, want the account's", tc.name, pod.Spec.ImagePullSecrets)
		}
	}
	_, err := ts.client.CoreV1().Pods("default").Create(ctx, podAs("ghostly", "ghost", "", nil), metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `error looking up service account default/ghost: serviceaccounts "ghost" not found`) {
		t.Errorf("a pod of a missing account: %v", err)
	}
}

// TestServiceAccountTokens: tokens from TokenRequest (kubectl create
// token) and a pod's projected volume authenticate as the account, with
// RBAC deciding what they may do, as in Kubernetes; a token dies with the
// pod it is bound to and with its account; TokenReview answers for them;
// forged, foreign and alg-none tokens are 401.
func TestServiceAccountTokens(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kubectl")
	}
	ts := startServer(t, "")
	ctx := context.Background()
	admin := newKubectl(t, ts)
	admin.run("create", "namespace", "team")
	createSA(ctx, t, ts.client, "team", "robot", nil)
	token := strings.TrimSpace(admin.run("create", "token", "robot", "-n", "team", "--duration=15m"))
	path, robot := tokenUser(t, ts, token)
	rk := kubectl{apitest.NewKubectl(t, path)}
	if out := rk.run("auth", "whoami"); !strings.Contains(out, "system:serviceaccount:team:robot") || !strings.Contains(out, "[system:serviceaccounts system:serviceaccounts:team system:authenticated]") {
		t.Errorf("whoami: %s", out)
	}
	if out, err := rk.try("get", "pods", "-n", "team"); err == nil || !strings.Contains(out, `User "system:serviceaccount:team:robot" cannot list resource "pods"`) {
		t.Errorf("unbound account lists pods: %v %s", err, out)
	}
	admin.run("create", "role", "pod-reader", "--verb=get,list,watch", "--resource=pods", "-n", "team")
	admin.run("create", "rolebinding", "robot-reads", "--role=pod-reader", "--serviceaccount=team:robot", "-n", "team")
	within(t, "the account allowed after its binding", 2*time.Second, func() bool {
		_, err := robot.CoreV1().Pods("team").List(ctx, metav1.ListOptions{})
		return err == nil
	})
	if code := bearerStatus(t, ts, token, "/.well-known/openid-configuration"); code != 200 {
		t.Errorf("issuer discovery with an account's token: %d", code)
	}
	if code := bearerStatus(t, ts, token, "/openid/v1/jwks"); code != 200 {
		t.Errorf("issuer keys with an account's token: %d", code)
	}

	// A token bound to a pod lives while the pod does.
	pod, err := ts.client.CoreV1().Pods("team").Create(ctx, podAs("runner", "robot", "", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bound := strings.TrimSpace(admin.run("create", "token", "robot", "-n", "team", "--bound-object-kind=Pod", "--bound-object-name=runner"))
	if code := bearerStatus(t, ts, bound, "/api/v1/namespaces/team/pods"); code != 200 {
		t.Fatalf("pod-bound token: %d", code)
	}
	review, err := ts.client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: bound}}, metav1.CreateOptions{})
	if err != nil || !review.Status.Authenticated || review.Status.User.Username != "system:serviceaccount:team:robot" ||
		strings.Join(review.Status.User.Extra["authentication.kubernetes.io/pod-uid"], "") != string(pod.UID) {
		t.Errorf("TokenReview of a pod-bound token: %v %+v", err, review.Status)
	}
	if err := ts.client.CoreV1().Pods("team").Delete(ctx, "runner", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	took := within(t, "the deleted pod's token refused", 2*time.Second, func() bool {
		return bearerStatus(t, ts, bound, "/api/v1/namespaces/team/pods") == 401
	})
	t.Logf("a deleted pod's token refused %s after the deletion", took)
	review, err = ts.client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: bound}}, metav1.CreateOptions{})
	if err != nil || review.Status.Authenticated || review.Status.Error == "" {
		t.Errorf("TokenReview of a deleted pod's token: %v %+v", err, review.Status)
	}

	// Tokens that are not the server's.
	parts := strings.Split(token, ".")
	payload, _ := base64.RawURLEncoding.DecodeString(parts[1])
	forged := parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(strings.ReplaceAll(string(payload), `"team"`, `"kube-system"`))) + "." + parts[2]
	otherKeys, err := satoken.LoadOrCreateKeys(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	foreign, err := satoken.NewIssuer("https://kubernetes.default.svc.cluster.local", nil, otherKeys, nil).Issue(satoken.Claims{
		Namespace: "team", ServiceAccountName: "robot", Audiences: []string{"https://kubernetes.default.svc.cluster.local"}, IssuedAt: now, Expiry: now.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	none := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + parts[1] + "."
	for name, bad := range map[string]string{"forged": forged, "another key": foreign, "alg none": none, "garbage": "a.b.c"} {
		if code := bearerStatus(t, ts, bad, "/api/v1/namespaces/team/pods"); code != 401 {
			t.Errorf("%s token: %d, want 401", name, code)
		}
	}
	review, err = ts.client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: []string{"vault"}}}, metav1.CreateOptions{})
	if err != nil || review.Status.Authenticated {
		t.Errorf("TokenReview for another audience: %v %+v", err, review.Status)
	}

	// The account's deletion ends its tokens.
	admin.run("delete", "serviceaccount", "robot", "-n", "team")
	took = within(t, "the deleted account's token refused", 2*time.Second, func() bool {
		return bearerStatus(t, ts, token, "/api/v1/namespaces/team/pods") == 401
	})
	t.Logf("a deleted account's token refused %s after the deletion", took)
}

// TestTokenRequestBadInput: malformed TokenRequests get Kubernetes'
// errors, and a node gets tokens only bound to its own pods.
func TestTokenRequestBadInput(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	createSA(ctx, t, ts.client, "default", "robot", nil)
	createSA(ctx, t, ts.client, "default", "other", nil)
	mine, err := ts.client.CoreV1().Pods("default").Create(ctx, podAs("mine", "robot", "n1", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []*corev1.Pod{podAs("theirs", "robot", "n2", nil), podAs("stranger", "other", "n1", nil)} {
		if _, err := ts.client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	request := func(seconds int64, kind, name string, uid string) *authenticationv1.TokenRequest {
		tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(seconds)}}
		if kind != "" {
			tr.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: kind, APIVersion: "v1", Name: name, UID: types.UID(uid)}
		}
		return tr
	}
	for _, tc := range []struct {
		name, account string
		req           *authenticationv1.TokenRequest
		check         func(error) bool
		message       string
	}{
		{"too short", "robot", request(300, "", "", ""), apierrors.IsInvalid, "spec.expirationSeconds: Invalid value: 300: may not specify a duration less than 10 minutes"},
		{"too long", "robot", request(1<<33, "", "", ""), apierrors.IsInvalid, "larger than 2^32 seconds"},
		{"bound to a configmap", "robot", request(600, "ConfigMap", "x", ""), apierrors.IsInvalid, `spec.boundObjectRef.kind: Unsupported value: "ConfigMap"`},
		{"bound to a missing pod", "robot", request(600, "Pod", "nothere", ""), apierrors.IsNotFound, `pods "nothere" not found`},
		{"bound to a pod of another uid", "robot", request(600, "Pod", "mine", "0000"), apierrors.IsConflict, "does not match the UID in record"},
		{"bound to another account's pod", "other", request(600, "Pod", "mine", ""), apierrors.IsBadRequest, `cannot bind token for serviceaccount "other" to pod running with different serviceaccount name.`},
		{"for a missing account", "ghost", request(600, "", "", ""), apierrors.IsNotFound, `serviceaccounts "ghost" not found`},
	} {
		_, err := ts.client.CoreV1().ServiceAccounts("default").CreateToken(ctx, tc.account, tc.req, metav1.CreateOptions{})
		if !tc.check(err) || !strings.Contains(err.Error(), tc.message) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.message)
		}
	}
	got, err := ts.client.CoreV1().ServiceAccounts("default").CreateToken(ctx, "robot", request(600, "Pod", "mine", string(mine.UID)), metav1.CreateOptions{})
	if err != nil || got.Status.Token == "" || time.Until(got.Status.ExpirationTimestamp.Time) > 11*time.Minute {
		t.Fatalf("a good request: %v %+v", err, got)
	}

	// A node: tokens only bound to its own pods, for their accounts.
	n1 := ts.as(t, "system:node:n1", "system:nodes")
	const tokens = "/api/v1/namespaces/default/serviceaccounts/"
	body := func(pod string) string {
		if pod == "" {
			return `{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{}}`
		}
		return `{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"boundObjectRef":{"kind":"Pod","apiVersion":"v1","name":"` + pod + `"}}}`
	}
	for _, tc := range []struct {
		name, account, pod string
		want               int
		message            string
	}{
		{"its pod's token", "robot", "mine", 201, ""},
		{"a token for no pod", "robot", "", 403, "node requested token not bound to a pod"},
		{"a token for another node's pod", "robot", "theirs", 403, "bound to a pod scheduled on a different node"},
		{"an account none of its pods uses", "ghost", "mine", 403, "no relationship with serviceaccount default/ghost"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n1.t = t
			code, msg := n1.do("POST", tokens+tc.account+"/token", jsonType, body(tc.pod))
			if code != tc.want || !strings.Contains(msg, tc.message) {
				t.Errorf("%d %q, want %d %q", code, msg, tc.want, tc.message)
			}
		})
	}
}
