package api_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/orch-dev/orch/internal/api"
	"github.com/orch-dev/orch/internal/store/etcdstore/etcdtest"
	"github.com/orch-dev/orch/internal/upgradeapi"
)

// TestExternalDatastore: with --datastore-endpoint the cluster's state is
// in an external etcd over mutual TLS, under Kubernetes' /registry keys;
// lists, watches and the events of the memory tier go through it (events
// on leases of their TTL), and a server restarted on it finds what it had.
func TestExternalDatastore(t *testing.T) {
	e := etcdtest.Start(t, etcdtest.Options{TLS: true})
	dir := t.TempDir()
	datastore := func(c *api.Config) {
		c.Datastore = api.Datastore{Endpoint: e.Endpoint, CAFile: e.CAFile, CertFile: e.CertFile, KeyFile: e.KeyFile}
	}
	ts := startServerWith(t, dir, 0, datastore)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	w, err := ts.client.CoreV1().ConfigMaps("default").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	cm, err := ts.client.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "kept"}, Data: map[string]string{"k": "v"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-w.ResultChan():
		if ev.Type != watch.Added || ev.Object.(*corev1.ConfigMap).Name != "kept" {
			t.Fatalf("watch got %v %T", ev.Type, ev.Object)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no watch event within 10s")
	}
	// A stale update is refused as Kubernetes refuses it: etcd's
	// compare-and-swap on the mod revision.
	stale := cm.DeepCopy()
	cm.Data["k"] = "v2"
	if _, err := ts.client.CoreV1().ConfigMaps("default").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	stale.Data["k"] = "lost"
	if _, err := ts.client.CoreV1().ConfigMaps("default").Update(ctx, stale, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
		t.Fatalf("stale update: %v, want a conflict", err)
	}
	if _, err := ts.client.CoreV1().Events("default").Create(ctx, &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: "ev"},
		InvolvedObject: corev1.ObjectReference{Kind: "ConfigMap", Namespace: "default", Name: "kept"},
		Reason:         "Test", Message: "shared by every server",
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, TLS: clientTLS(t, e)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cli.Close() }()
	for _, key := range []string{"/registry/configmaps/default/kept", "/registry/events/default/ev", "/registry/namespaces/kube-system"} {
		resp, err := cli.Get(ctx, key)
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("etcd has no %s: %v %v", key, resp, err)
		}
		// etcd deletes events itself --event-ttl (2 s in these tests) after
		// their last write, and at most a twentieth of it later, as it
		// does kube-apiserver's; state has no lease.
		lease := clientv3.LeaseID(resp.Kvs[0].Lease)
		if key != "/registry/events/default/ev" {
			if lease != 0 {
				t.Errorf("%s is on lease %x", key, lease)
			}
			continue
		}
		ttl, err := cli.TimeToLive(ctx, lease)
		if err != nil || ttl.GrantedTTL != 3 {
			t.Errorf("the event's lease: granted for %d s (%v); want 3 (2.1 rounded up)", ttl.GrantedTTL, err)
		}
	}

	// orch snapshot save asks etcd for its snapshot (the file etcdutl
	// restores); what every server must hold alike is not changed on one.
	snap, err := api.SaveSnapshot(ctx, dir, "ha", t.TempDir())
	if err != nil || snap.Size == 0 || snap.Revision == 0 {
		t.Fatalf("snapshot of the datastore: %+v, %v", snap, err)
	}
	if _, err := api.RotateToken(ctx, dir, ""); err == nil || !strings.Contains(err.Error(), "sharing a datastore") {
		t.Errorf("token rotation on a datastore: %v, want a refusal", err)
	}
	if _, err := api.RotateCA(ctx, dir, false, false); err == nil || !strings.Contains(err.Error(), "sharing a datastore") {
		t.Errorf("CA rotation on a datastore: %v, want a refusal", err)
	}
	if _, err := api.SecretsEncrypt(ctx, dir, "rotate"); err == nil || !strings.Contains(err.Error(), "sharing a datastore") {
		t.Errorf("encryption key rotation on a datastore: %v, want a refusal", err)
	}

	ts.stop()
	again := startServerWith(t, dir, 0, datastore)
	got, err := again.client.CoreV1().ConfigMaps("default").Get(ctx, "kept", metav1.GetOptions{})
	if err != nil || got.Data["k"] != "v2" {
		t.Fatalf("after a restart: %+v, %v", got, err)
	}
	if _, err := again.client.CoreV1().Events("default").Get(ctx, "ev", metav1.GetOptions{}); err != nil {
		t.Fatalf("the event did not survive the restart in etcd: %v", err)
	}
}

// Wrong datastore settings stop the server at start with what to fix.
func TestExternalDatastoreRefusals(t *testing.T) {
	e := etcdtest.Start(t, etcdtest.Options{TLS: true})
	cases := []struct {
		name string
		ds   api.Datastore
		want string
	}{
		{"SQL", api.Datastore{Endpoint: "mysql://user:pass@tcp(10.0.0.1:3306)/orch"}, "etcd client URLs"},
		{"no scheme", api.Datastore{Endpoint: "10.0.0.1:2379"}, "etcd client URLs"},
		{"mixed schemes", api.Datastore{Endpoint: "https://a:2379,http://b:2379"}, "mixes http and https"},
		{"TLS files on http", api.Datastore{Endpoint: "http://127.0.0.1:2379", CAFile: e.CAFile}, "need https://"},
		{"cert without key", api.Datastore{Endpoint: e.Endpoint, CAFile: e.CAFile, CertFile: e.CertFile}, "go together"},
		{"no client certificate", api.Datastore{Endpoint: e.Endpoint, CAFile: e.CAFile}, "certificate required"},
		{"untrusted server", api.Datastore{Endpoint: e.Endpoint, CertFile: e.CertFile, KeyFile: e.KeyFile}, "certificate signed by unknown authority"},
		{"nothing listening", api.Datastore{Endpoint: "http://127.0.0.1:1"}, "connection refused"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // those that reach etcd wait out the dial timeout
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			defer cancel()
			_, err := api.New(ctx, api.Config{DataDir: t.TempDir(), BindAddress: "127.0.0.1", AdvertiseAddress: "192.0.2.10", Datastore: tc.ds,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err == nil {
				t.Fatal("the server started")
			}
			t.Log(err)
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not say %q", err, tc.want)
			}
		})
	}
}

func clientTLS(t *testing.T, e *etcdtest.Etcd) *tls.Config {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(e.CertFile, e.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := os.ReadFile(e.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool}
}

// TestServersShareOneCluster: a second server on the same datastore with
// the same token takes the cluster's identity from it (k3s's external
// datastore HA): one CA, one service-account issuer, one state; a server
// without the token, with another one or with other networks is refused.
func TestServersShareOneCluster(t *testing.T) {
	e := etcdtest.Start(t, etcdtest.Options{})
	const token = "shared-cluster-secret-0123456789"
	on := func(tok string) func(*api.Config) {
		return func(c *api.Config) {
			c.Datastore, c.Token = api.Datastore{Endpoint: e.Endpoint}, tok
		}
	}
	first := startServerWith(t, "", 0, on(token))
	second := startServerWith(t, "", 0, func(c *api.Config) {
		on(token)(c)
		c.AdvertiseAddress, c.Version, c.NodeName = "192.0.2.11", "v0.9.1", "board2"
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// The kubernetes Service reaches every live server (kube-apiserver's
	// lease endpoint reconciler); one that stops takes itself out.
	endpoints := func() string {
		ep, err := first.client.CoreV1().Endpoints("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil || len(ep.Subsets) != 1 {
			return fmt.Sprint(err)
		}
		var ips []string
		for _, a := range ep.Subsets[0].Addresses {
			ips = append(ips, a.IP)
		}
		slice, err := first.client.DiscoveryV1().EndpointSlices("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil || len(slice.Endpoints) != len(ips) {
			return fmt.Sprintf("slice %v", err)
		}
		return strings.Join(ips, ",")
	}
	if got := endpoints(); got != "192.0.2.10,192.0.2.11" {
		t.Fatalf("kubernetes endpoints %s, want both servers", got)
	}
	// Each server's key says which orch it runs and its Node, for the
	// upgrade loop's skew rule (a server without a Node is not upgraded
	// by a plan, and agents may not pass it).
	deadline := time.Now().Add(10 * time.Second)
	for {
		servers, err := first.srv.Servers(ctx)
		if err == nil && len(servers) == 2 && servers[1] == (upgradeapi.Server{Address: "192.0.2.11", Version: "v0.9.1", Node: "board2"}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the servers as the first sees them: %+v %v", servers, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	defer func() {
		second.stop()
		if got := endpoints(); got != "192.0.2.10" {
			t.Errorf("kubernetes endpoints %s after the second server stopped, want the first only", got)
		}
	}()

	for _, name := range []string{"tls/ca.crt", "tls/ca.key", "tls/front-proxy/ca.crt", "tls/service.key", "token"} {
		a, errA := os.ReadFile(filepath.Join(first.dir, "server", name))
		b, errB := os.ReadFile(filepath.Join(second.dir, "server", name))
		if errA != nil || errB != nil || !bytes.Equal(a, b) {
			t.Fatalf("server/%s differs between the servers (%v, %v)", name, errA, errB)
		}
	}
	if _, err := first.client.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "one"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := second.client.CoreV1().ConfigMaps("default").Get(ctx, "one", metav1.GetOptions{}); err != nil {
		t.Fatalf("the second server does not see the first's write: %v", err)
	}
	// A service-account token one server issues, the other accepts.
	if _, err := first.client.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "app"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := first.client.CoreV1().ServiceAccounts("default").CreateToken(ctx, "app", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(second.config)
	cfg.BearerToken = tr.Status.Token
	// (It learns of the ServiceAccount by its watch, a moment later.)
	deadline = time.Now().Add(10 * time.Second)
	for {
		review, err := kubernetes.NewForConfigOrDie(cfg).AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err == nil && review.Status.UserInfo.Username == "system:serviceaccount:default:app" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the second server does not accept the first's token: %+v, %v", review, err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Services created at once through both servers get addresses and
	// node ports of their own: each server's allocator alone would hand
	// out the same ones.
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 20 {
		for j, srv := range []*testServer{first, second} {
			wg.Go(func() {
				_, err := srv.client.CoreV1().Services("default").Create(ctx, &corev1.Service{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("svc-%d-%d", j, i)},
					Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Ports: []corev1.ServicePort{{Port: 80}}},
				}, metav1.CreateOptions{})
				errs <- err
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	services, err := first.client.CoreV1().Services("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ips, ports := map[string]string{}, map[int32]string{}
	for _, svc := range services.Items {
		if other, ok := ips[svc.Spec.ClusterIP]; ok {
			t.Errorf("%s and %s share cluster IP %s", other, svc.Name, svc.Spec.ClusterIP)
		}
		ips[svc.Spec.ClusterIP] = svc.Name
		for _, p := range svc.Spec.Ports {
			if p.NodePort == 0 {
				continue
			}
			if other, ok := ports[p.NodePort]; ok {
				t.Errorf("%s and %s share node port %d", other, svc.Name, p.NodePort)
			}
			ports[p.NodePort] = svc.Name
		}
	}
	// An address another server's Service holds is refused by name.
	secondsIP := func() string {
		svc, err := second.client.CoreV1().Services("default").Get(ctx, "svc-1-19", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return svc.Spec.ClusterIP
	}
	if _, err := first.client.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "taken"},
		Spec:       corev1.ServiceSpec{ClusterIP: secondsIP(), Ports: []corev1.ServicePort{{Port: 80}}},
	}, metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
		t.Errorf("a cluster IP another Service holds: %v, want Invalid", err)
	}

	cases := []struct {
		name   string
		adjust func(*api.Config)
		want   string
	}{
		{"no token", on(""), "start this server with its token"},
		{"another token", on("another-secret-0123456789abcdef"), "made with another token"},
		{"other networks", func(c *api.Config) { on(token)(c); c.ServiceCIDR = "10.96.0.0/16" }, "networks differ"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := api.Config{DataDir: t.TempDir(), BindAddress: "127.0.0.1", AdvertiseAddress: "192.0.2.10", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
			tc.adjust(&cfg)
			_, err := api.New(ctx, cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("start: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

// TestMoveIntoDatastore: a server that ran on its own store, started on an
// empty datastore, takes what it had there (once); its CA stays, so its
// nodes and kubeconfigs keep working.
func TestMoveIntoDatastore(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	alone := startServerWith(t, dir, 0, nil)
	if _, err := alone.client.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "from-before"}, Data: map[string]string{"k": "v"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ca, err := os.ReadFile(filepath.Join(dir, "server", "tls", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	alone.stop()

	e := etcdtest.Start(t, etcdtest.Options{})
	datastore := func(c *api.Config) { c.Datastore = api.Datastore{Endpoint: e.Endpoint} }
	moved := startServerWith(t, dir, 0, datastore)
	got, err := moved.client.CoreV1().ConfigMaps("default").Get(ctx, "from-before", metav1.GetOptions{})
	if err != nil || got.Data["k"] != "v" {
		t.Fatalf("after the move: %+v, %v", got, err)
	}
	if now, _ := os.ReadFile(filepath.Join(dir, "server", "tls", "ca.crt")); !bytes.Equal(now, ca) {
		t.Fatal("the server's CA changed in the move")
	}
	if _, err := moved.client.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "after"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := moved.client.CoreV1().ConfigMaps("default").Delete(ctx, "from-before", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	moved.stop()
	// Once: started again, it does not bring the old store's objects back
	// over the datastore's.
	again := startServerWith(t, dir, 0, datastore)
	if _, err := again.client.CoreV1().ConfigMaps("default").Get(ctx, "after", metav1.GetOptions{}); err != nil {
		t.Fatalf("after a restart: %v", err)
	}
	if _, err := again.client.CoreV1().ConfigMaps("default").Get(ctx, "from-before", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a deleted object came back from the old store: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "server", "db", "moved-to-datastore")); err != nil {
		t.Fatal(err)
	}
}
