package api_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestPodAndServiceProxy: pods/NAME:PORT/proxy/PATH and
// services/NAME:PORT/proxy/PATH pass a request of any method, with its
// query, to the pod (a ready endpoint of the Service) and its answer back,
// as kube-apiserver does (kubectl proxy and the dashboard use them); a
// pod without an address is a 503; a viewer may not proxy.
func TestPodAndServiceProxy(t *testing.T) {
	// Endpoints may not be loopback addresses: the backend listens on all
	// of the machine's, and is reached at a non-loopback one.
	host := ""
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			host = n.IP.String()
			break
		}
	}
	if host == "" {
		t.Skip("no non-loopback IPv4 address to reach a backend at")
	}
	listener, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	backend := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/page/" {
			w.Header().Set("Content-Type", "text/html")
			w.Header().Set("Access-Control-Allow-Origin", "*")
			_, _ = fmt.Fprint(w, `<a href="/rewriteme">test</a><img src="relative.png">`)
			return
		}
		body, _ := io.ReadAll(r.Body)
		_, _ = fmt.Fprintf(w, "%s %s?%s %s auth=%q", r.Method, r.URL.Path, r.URL.RawQuery, body, r.Header.Get("Authorization"))
	}))
	backend.Listener = listener
	backend.Start()
	defer backend.Close()
	_, port, _ := net.SplitHostPort(backend.Listener.Addr().String())
	ts := startServer(t, "")
	ctx := context.Background()
	core := ts.client.CoreV1()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: map[string]string{"app": "web"}}, Spec: corev1.PodSpec{NodeName: "n1",
		Containers: []corev1.Container{{Name: "c", Image: "x", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 1}}}}}}
	created, err := core.Pods("default").Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	admin := ts.as(t, "admin", "system:masters")
	if code, body := admin.do("GET", "/api/v1/namespaces/default/pods/web:"+port+"/proxy/", "", ""); code != http.StatusServiceUnavailable {
		t.Fatalf("a pod without an address: %d %s", code, body)
	}
	created.Status.PodIP, created.Status.Phase = host, corev1.PodRunning
	if _, err := core.Pods("default").UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	raw := func(method, path, body string) (int, string) {
		req, _ := http.NewRequestWithContext(ctx, method, ts.srv.URL()+path, strings.NewReader(body))
		resp, err := admin.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := raw("POST", "/api/v1/namespaces/default/pods/web:"+port+"/proxy/echo?msg=hi", "payload")
	if code != 200 || body != `POST /echo?msg=hi payload auth=""` {
		t.Fatalf("pods/proxy: %d %s", code, body)
	}
	// No port named: the first a container declares, as in Kubernetes
	// (the conformance suite's "serve a basic image" reads so).
	portNumber, _ := strconv.Atoi(port)
	first := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "first"}, Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{
		{Name: "plain", Image: "x"}, {Name: "serving", Image: "x", Ports: []corev1.ContainerPort{{ContainerPort: int32(portNumber)}, {ContainerPort: 2}}}}}}
	if first, err = core.Pods("default").Create(ctx, first, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	first.Status.PodIP, first.Status.Phase = host, corev1.PodRunning
	if _, err := core.Pods("default").UpdateStatus(ctx, first, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if code, body := raw("GET", "/api/v1/namespaces/default/pods/first/proxy/hostname", ""); code != 200 || body != `GET /hostname?  auth=""` {
		t.Errorf("pods/proxy with no port: %d %s", code, body)
	}
	// An HTML answer's absolute links go through the proxy, its relative
	// ones are left, its CORS headers dropped, as kube-apiserver's proxy
	// does (Kubernetes' conformance spec "should proxy through a service
	// and a pod" checks the links).
	page := "/api/v1/namespaces/default/pods/web:" + port + "/proxy/page/"
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, ts.srv.URL()+page, nil)
	resp, err := admin.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	html, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if want := `<a href="/api/v1/namespaces/default/pods/web:` + port + `/proxy/rewriteme">test</a><img src="relative.png">`; string(html) != want {
		t.Errorf("an HTML page through pods/proxy:\n got %s\nwant %s", html, want)
	}
	if cors := resp.Header.Get("Access-Control-Allow-Origin"); cors != "" {
		t.Errorf("the pod's CORS header came through: %q", cors)
	}
	// The proxy's root without its trailing slash is moved there (GET and
	// HEAD; other methods go through), as on Kubernetes.
	noRedirect := *admin.client
	noRedirect.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	for _, method := range []string{http.MethodGet, http.MethodHead, http.MethodPost} {
		root := "/api/v1/namespaces/default/pods/web:" + port + "/proxy"
		req, _ := http.NewRequestWithContext(ctx, method, ts.srv.URL()+root+"?method="+method, nil)
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		switch method {
		case http.MethodPost:
			if resp.StatusCode != http.StatusOK {
				t.Errorf("POST to the proxy's root: %s", resp.Status)
			}
		default:
			if resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != root+"/?method="+method {
				t.Errorf("%s to the proxy's root: %s, Location %q", method, resp.Status, resp.Header.Get("Location"))
			}
		}
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
	if _, err := core.Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var target int32
	_, _ = fmt.Sscan(port, &target)
	slice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "web-x", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: &target, Protocol: ptr.To(corev1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{host}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}}}
	if _, err := ts.client.DiscoveryV1().EndpointSlices("default").Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	code, body = raw("GET", "/api/v1/namespaces/default/services/web:http/proxy/status", "")
	if code != 200 || !strings.HasPrefix(body, "GET /status?") {
		t.Fatalf("services/proxy: %d %s", code, body)
	}
	viewer := ts.as(t, "viewer")
	// The view role's rules (get, list and watch of pods, not pods/proxy),
	// without the aggregation loop this server runs without.
	reader := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "pod-reader"},
		Rules: []rbacv1.PolicyRule{{Verbs: []string{"get", "list", "watch"}, APIGroups: []string{""}, Resources: []string{"pods", "services"}}}}
	if _, err := ts.client.RbacV1().ClusterRoles().Create(ctx, reader, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "viewer-view"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: reader.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "viewer"}}}
	if _, err := ts.client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Refused for want of the proxy right, not before the binding is known.
	waitFor(t, "the viewer's binding in force", func() bool {
		code, _ := viewer.do("GET", "/api/v1/namespaces/default/pods/web", "", "")
		return code == http.StatusOK
	})
	if code, body := viewer.do("GET", "/api/v1/namespaces/default/pods/web:"+port+"/proxy/", "", ""); code != http.StatusForbidden {
		t.Fatalf("a viewer proxying: %d %s", code, body)
	}
}
