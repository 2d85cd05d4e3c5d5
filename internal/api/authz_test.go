package api_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/api/pki"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// identity is an HTTPS client holding a certificate the cluster CA signed
// for user in groups, as the join endpoint signs nodes'.
type identity struct {
	t      *testing.T
	ts     *testServer
	client *http.Client
}

func (ts *testServer) as(t *testing.T, user string, groups ...string) identity {
	t.Helper()
	ca, err := pki.LoadOrCreateCA(ts.dir + "/server/tls")
	if err != nil {
		t.Fatal(err)
	}
	kp, err := ca.Issue(pki.Request{CommonName: user, Organization: groups, Client: true})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := kp.TLS()
	if err != nil {
		t.Fatal(err)
	}
	return identity{t: t, ts: ts, client: &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}}}
}

// do sends a request and returns its code and the Status message, if any.
func (id identity) do(method, path, contentType, body string, header ...string) (int, string) {
	id.t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, id.ts.srv.URL()+path, strings.NewReader(body))
	if err != nil {
		id.t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	resp, err := id.client.Do(req)
	if err != nil {
		id.t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var st metav1.Status
	_ = json.Unmarshal([]byte(readAll(resp)), &st)
	return resp.StatusCode, st.Message
}

const (
	jsonType  = "application/json"
	mergeType = "application/merge-patch+json"
)

// TestNodeAuthorizerAndRestriction: a node's certificate gets what
// Kubernetes' node authorizer (with selector authorization, 1.32+) and
// NodeRestriction admission give a kubelet, and nothing more: its own
// Node (no node-role labels, no taint changes, no deletion), its own
// Lease, pods only through spec.nodeName=<itself>, the secrets and
// configmaps of its own pods, mirror pods only.
func TestNodeAuthorizerAndRestriction(t *testing.T) {
	ts := startServer(t, "")
	ctx := context.Background()
	core := ts.client.CoreV1()
	for _, name := range []string{"s1", "s2"} {
		if _, err := core.Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, StringData: map[string]string{"k": "v"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	boundPod := func(name, node, secret string) *corev1.Pod {
		c := corev1.Container{Name: "main", Image: "busybox", Env: []corev1.EnvVar{{Name: "S", ValueFrom: &corev1.EnvVarSource{
			SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: secret}, Key: "k"}}}}}
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{c},
			Volumes: []corev1.Volume{{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "c-" + name}}}},
				{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data-" + name}}}}}}
	}
	// Each pod's claim is bound to a volume of its own.
	for _, name := range []string{"mine", "theirs"} {
		size := corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}
		rwo := []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
		if _, err := core.PersistentVolumes().Create(ctx, &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-" + name}, Spec: corev1.PersistentVolumeSpec{
			AccessModes: rwo, Capacity: size, PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/srv/" + name}}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := core.PersistentVolumeClaims("default").Create(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data-" + name}, Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: rwo, Resources: corev1.VolumeResourceRequirements{Requests: size}, VolumeName: "pv-" + name, StorageClassName: new(string)}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []*corev1.Pod{boundPod("mine", "n1", "s1"), boundPod("theirs", "n2", "s2")} {
		if _, err := core.Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	n1 := ts.as(t, "system:node:n1", "system:nodes")
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if code, _ := n1.do("GET", "/api/v1/persistentvolumes/pv-mine", "", ""); code == 200 {
			break // the graph has caught up with the claims
		}
	}
	node := func(name string, labels string) string {
		return `{"apiVersion":"v1","kind":"Node","metadata":{"name":"` + name + `","labels":{` + labels + `}}}`
	}
	mirror := func(name, node, extra string) string {
		return `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"` + name + `","annotations":{"kubernetes.io/config.mirror":"x"}},"spec":{"nodeName":"` + node +
			`","containers":[{"name":"c","image":"busybox"` + extra + `}]}}`
	}
	const pods = "/api/v1/namespaces/default/pods"
	for _, tc := range []struct {
		name, method, path, contentType, body string
		want                                  int
		message                               string
	}{
		{"register another node", "POST", "/api/v1/nodes", jsonType, node("n2", ""), 403, `node "n1" is not allowed to modify node "n2"`},
		{"register with a node-role label", "POST", "/api/v1/nodes", jsonType, node("n1", `"node-role.kubernetes.io/control-plane":""`), 403, "not allowed to modify labels: node-role.kubernetes.io/control-plane"},
		{"register with a node-restriction label", "POST", "/api/v1/nodes", jsonType, node("n1", `"node-restriction.kubernetes.io/trusted":"yes"`), 403, "node-restriction.kubernetes.io/trusted"},
		{"register with kubelet labels and taints", "POST", "/api/v1/nodes", jsonType,
			`{"apiVersion":"v1","kind":"Node","metadata":{"name":"n1","labels":{"topology.kubernetes.io/zone":"a","node.kubernetes.io/pool":"x","example.com/rack":"3"}},"spec":{"taints":[{"key":"edge","effect":"NoSchedule"}]}}`, 201, ""},
		{"label itself a control plane", "PATCH", "/api/v1/nodes/n1", mergeType, `{"metadata":{"labels":{"node-role.kubernetes.io/control-plane":""}}}`, 403, "not allowed to modify labels"},
		{"remove its own taint", "PATCH", "/api/v1/nodes/n1", mergeType, `{"spec":{"taints":null}}`, 403, "not allowed to modify taints"},
		{"add its own label", "PATCH", "/api/v1/nodes/n1", mergeType, `{"metadata":{"labels":{"example.com/disk":"ssd"}}}`, 200, ""},
		{"report its status", "PATCH", "/api/v1/nodes/n1/status", mergeType, `{"status":{"phase":"Running"}}`, 200, ""},
		{"delete itself", "DELETE", "/api/v1/nodes/n1", "", "", 403, "may not delete nodes"},
		{"read RuntimeClasses", "GET", "/apis/node.k8s.io/v1/runtimeclasses", "", "", 200, ""},
		{"make a RuntimeClass", "POST", "/apis/node.k8s.io/v1/runtimeclasses", jsonType, `{"apiVersion":"node.k8s.io/v1","kind":"RuntimeClass","metadata":{"name":"x"},"handler":"x"}`, 403, "can only read runtimeclasses"},
		{"proxy to itself", "GET", "/api/v1/nodes/n1/proxy/stats/summary", "", "", 403, "may not proxy to nodes"},
		{"get another node", "GET", "/api/v1/nodes/n2", "", "", 403, "own Node"},
		{"list all nodes", "GET", "/api/v1/nodes", "", "", 403, "fieldSelector metadata.name=n1"},
		{"list itself", "GET", "/api/v1/nodes?fieldSelector=metadata.name%3Dn1", "", "", 200, ""},
		{"list all pods", "GET", "/api/v1/pods", "", "", 403, "spec.nodeName=n1"},
		{"list another node's pods", "GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dn2", "", "", 403, "spec.nodeName=n1"},
		{"list its pods", "GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1", "", "", 200, ""},
		{"watch its pods", "GET", "/api/v1/pods?watch=1&timeoutSeconds=1&fieldSelector=spec.nodeName%3Dn1", "", "", 200, ""},
		{"get its pod", "GET", pods + "/mine", "", "", 200, ""},
		{"get another node's pod", "GET", pods + "/theirs", "", "", 403, "no relationship with pod default/theirs"},
		{"update another node's pod status", "PATCH", pods + "/theirs/status", mergeType, `{"status":{"message":"x"}}`, 403, "no relationship"},
		{"update its pod's spec", "PATCH", pods + "/mine", mergeType, `{"metadata":{"labels":{"a":"b"}}}`, 403, "update their status"},
		{"get its pod's secret", "GET", "/api/v1/namespaces/default/secrets/s1", "", "", 200, ""},
		{"watch its pod's configmap by name", "GET", "/api/v1/namespaces/default/configmaps?watch=1&timeoutSeconds=1&fieldSelector=metadata.name%3Dc-mine", "", "", 200, ""},
		{"get another node's secret", "GET", "/api/v1/namespaces/default/secrets/s2", "", "", 403, "no relationship with secret default/s2"},
		{"get another node's configmap", "GET", "/api/v1/namespaces/default/configmaps/c-theirs", "", "", 403, "no relationship"},
		{"list secrets", "GET", "/api/v1/namespaces/default/secrets", "", "", 403, "single secrets"},
		{"get its pod's claim", "GET", "/api/v1/namespaces/default/persistentvolumeclaims/data-mine", "", "", 200, ""},
		{"get another node's claim", "GET", "/api/v1/namespaces/default/persistentvolumeclaims/data-theirs", "", "", 403, "no relationship with persistentvolumeclaim default/data-theirs"},
		{"get its pod's volume", "GET", "/api/v1/persistentvolumes/pv-mine", "", "", 200, ""},
		{"get another node's volume", "GET", "/api/v1/persistentvolumes/pv-theirs", "", "", 403, "no relationship with persistentvolume pv-theirs"},
		{"list volumes", "GET", "/api/v1/persistentvolumes", "", "", 403, "single persistentvolumes"},
		{"delete its pod's volume", "DELETE", "/api/v1/persistentvolumes/pv-mine", "", "", 403, "single persistentvolumes"},
		{"create a pod", "POST", pods, jsonType, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"nodeName":"n1","containers":[{"name":"c","image":"busybox"}]}}`, 403, "can only create mirror pods"},
		{"create a mirror pod for another node", "POST", pods, jsonType, mirror("m2", "n2", ""), 403, "spec.nodeName set to itself"},
		{"create a mirror pod that reads a secret", "POST", pods, jsonType, mirror("m3", "n1", `,"envFrom":[{"secretRef":{"name":"s2"}}]`), 403, `reference secret "s2"`},
		{"create a mirror pod", "POST", pods, jsonType, mirror("m1", "n1", ""), 201, ""},
		{"take another node's lease", "POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", jsonType, `{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"n2"}}`, 403, "own lease"},
		{"create its lease", "POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", jsonType, `{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"n1"}}`, 201, ""},
		{"delete another node's pod", "DELETE", pods + "/theirs", "", "", 403, "no relationship"},
		{"delete its pod", "DELETE", pods + "/mine", "", "", 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n1.t = t
			code, msg := n1.do(tc.method, tc.path, tc.contentType, tc.body)
			if code != tc.want || !strings.Contains(msg, tc.message) {
				t.Errorf("%s %s: %d %q, want %d %q", tc.method, tc.path, code, msg, tc.want, tc.message)
			}
		})
	}
	// The graph follows the pods: once its pod is gone (deleted above,
	// graceful deletion done by the test), so is the node's access.
	if err := core.Pods("default").Delete(ctx, "mine", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	n1.t = t
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, _ := n1.do("GET", "/api/v1/namespaces/default/secrets/s1", "", "")
		if code == 403 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node still reads its deleted pod's secret: %d", code)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestImpersonation: Impersonate-* headers (kubectl --as) run the request
// as the named identity once the caller may impersonate it, as Kubernetes
// does; a caller that may not gets 403; the headers are never ignored.
func TestImpersonation(t *testing.T) {
	ts := startServer(t, "")
	admin := ts.as(t, "admin", "system:masters")
	alice := ts.as(t, "alice", "developers")
	n1 := ts.as(t, "system:node:n1", "system:nodes")
	const secrets = "/api/v1/secrets"
	for _, tc := range []struct {
		name    string
		who     identity
		header  []string
		want    int
		message string
	}{
		{"admin as a user without rights", admin, []string{"Impersonate-User", "alice"}, 403, `User "alice" cannot list resource "secrets"`},
		{"admin as a node", admin, []string{"Impersonate-User", "system:node:n1", "Impersonate-Group", "system:nodes"}, 403, `node "n1" can only get single secrets`},
		{"admin as another admin", admin, []string{"Impersonate-User", "bob", "Impersonate-Group", "system:masters"}, 200, ""},
		{"a user as an admin", alice, []string{"Impersonate-User", "admin", "Impersonate-Group", "system:masters"}, 403, `User "alice" cannot impersonate resource "users"`},
		{"a node as an admin", n1, []string{"Impersonate-User", "system:admin", "Impersonate-Group", "system:masters"}, 403, `cannot impersonate resource "users"`},
		{"a node as a service account", n1, []string{"Impersonate-User", "system:serviceaccount:default:default"}, 403, `cannot impersonate resource "serviceaccounts" in API group "" in the namespace "default"`},
		{"groups without a user", admin, []string{"Impersonate-Group", "system:masters"}, 400, "requires impersonating a user"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.who.t = t
			code, msg := tc.who.do("GET", secrets, "", "", tc.header...)
			if code != tc.want || !strings.Contains(msg, tc.message) {
				t.Errorf("%d %q, want %d %q", code, msg, tc.want, tc.message)
			}
		})
	}
	if testing.Short() {
		return
	}
	// Stock kubectl's --as, from the admin kubeconfig.
	out, err := newKubectl(t, ts).try("--as=someone", "get", "secrets", "-A")
	if err == nil || !strings.Contains(out, `User "someone" cannot list resource "secrets"`) {
		t.Errorf("kubectl --as=someone get secrets -A: %v\n%s", err, out)
	}
}
