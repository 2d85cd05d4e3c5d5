package pods

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
)

// Kubernetes' expansion: defined names are replaced, undefined ones kept,
// $$ escapes.
func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "1", "B": "two"}
	lookup := func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	for in, want := range map[string]string{
		"plain":          "plain",
		"$(A)":           "1",
		"x$(A)y$(B)z":    "x1ytwoz",
		"$(MISSING)":     "$(MISSING)",
		"$$(A)":          "$(A)",
		"$$$(A)":         "$1",
		"cost $5":        "cost $5",
		"$(A":            "$(A",
		"trailing $":     "trailing $",
		"$(A)$(A)":       "11",
		"nested $($(A))": "nested $($(A))",
	} {
		if got := expand(in, lookup); got != want {
			t.Errorf("expand(%q) = %q, want %q", in, got, want)
		}
	}
}

// The service links of Kubernetes: the API server's for everyone, the
// namespace's own unless enableServiceLinks is false, headless ones never.
func TestServiceEnv(t *testing.T) {
	idx := toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, toolscache.Indexers{})
	for _, s := range []*corev1.Service{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "kubernetes"}, Spec: corev1.ServiceSpec{ClusterIP: "10.43.0.1",
			Ports: []corev1.ServicePort{{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP}}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "redis-main"}, Spec: corev1.ServiceSpec{ClusterIP: "10.43.0.7",
			Ports: []corev1.ServicePort{{Port: 6379, Protocol: corev1.ProtocolTCP}}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "headless"}, Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "elsewhere"}, Spec: corev1.ServiceSpec{ClusterIP: "10.43.0.9"}},
	} {
		_ = idx.Add(s)
	}
	m := &Manager{services: corelisters.NewServiceLister(idx)}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop"}}
	env, err := m.serviceEnv(pod)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{
		"KUBERNETES_SERVICE_HOST": "10.43.0.1", "KUBERNETES_SERVICE_PORT": "443", "KUBERNETES_SERVICE_PORT_HTTPS": "443",
		"KUBERNETES_PORT": "tcp://10.43.0.1:443", "KUBERNETES_PORT_443_TCP_ADDR": "10.43.0.1",
		"REDIS_MAIN_SERVICE_HOST": "10.43.0.7", "REDIS_MAIN_SERVICE_PORT": "6379", "REDIS_MAIN_PORT_6379_TCP": "tcp://10.43.0.7:6379",
		"REDIS_MAIN_PORT_6379_TCP_PROTO": "tcp", "REDIS_MAIN_PORT_6379_TCP_PORT": "6379",
	} {
		if env[k] != v {
			t.Errorf("%s = %q, want %q", k, env[k], v)
		}
	}
	for k := range env {
		if strings.HasPrefix(k, "HEADLESS_") || strings.HasPrefix(k, "ELSEWHERE_") {
			t.Errorf("unexpected %s", k)
		}
	}
	pod.Spec.EnableServiceLinks = ptrTo(false)
	env, _ = m.serviceEnv(pod)
	if _, ok := env["REDIS_MAIN_SERVICE_HOST"]; ok || env["KUBERNETES_SERVICE_HOST"] == "" {
		t.Errorf("enableServiceLinks=false: %v", env)
	}
}

// The atomic writer: files behind ..data, unchanged content not
// rewritten, removed keys gone, paths out of the volume refused.
func TestWriteProjection(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "vol")
	files := map[string]projectedFile{"a": {data: []byte("1"), mode: 0o644}, "sub/b": {data: []byte("2"), mode: 0o600}}
	if err := writeProjection(dir, files, false, nil); err != nil {
		t.Fatal(err)
	}
	read := func(p string) string { data, _ := os.ReadFile(filepath.Join(dir, p)); return string(data) }
	if read("a") != "1" || read("sub/b") != "2" {
		t.Fatalf("got a=%q sub/b=%q", read("a"), read("sub/b"))
	}
	if fi, _ := os.Stat(filepath.Join(dir, "sub/b")); fi.Mode().Perm() != 0o600 {
		t.Errorf("sub/b mode %v", fi.Mode())
	}
	first, _ := os.Readlink(filepath.Join(dir, "..data"))
	if err := writeProjection(dir, files, false, nil); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.Readlink(filepath.Join(dir, "..data")); again != first {
		t.Errorf("unchanged content rewritten: %s then %s", first, again)
	}
	time.Sleep(time.Millisecond)
	if err := writeProjection(dir, map[string]projectedFile{"a": {data: []byte("new"), mode: 0o644}}, false, nil); err != nil {
		t.Fatal(err)
	}
	if read("a") != "new" {
		t.Errorf("a = %q after the update", read("a"))
	}
	if _, err := os.Lstat(filepath.Join(dir, "sub")); !os.IsNotExist(err) {
		t.Errorf("sub still there after its key went: %v", err)
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if len(names) != 3 || !slices.Contains(names, "..data") || !slices.Contains(names, "a") {
		t.Errorf("volume holds %v, want a, ..data and one data directory", names)
	}
	for _, bad := range []string{"../escape", "/abs", "..data"} {
		if err := writeProjection(dir, map[string]projectedFile{bad: {data: []byte("x")}}, false, nil); err == nil {
			t.Errorf("path %q accepted", bad)
		}
	}
}

func TestSubPath(t *testing.T) {
	vol := t.TempDir()
	if err := os.Symlink("/etc", filepath.Join(vol, "out")); err != nil {
		t.Fatal(err)
	}
	if p, err := subPath(vol, "new/dir"); err != nil || !strings.HasSuffix(p, "new/dir") {
		t.Errorf("subPath new/dir: %q %v", p, err)
	}
	for _, bad := range []string{"../x", "/etc", "out", "a/../../x"} {
		if _, err := subPath(vol, bad); err == nil {
			t.Errorf("subPath %q accepted", bad)
		}
	}
}

func TestResolvConf(t *testing.T) {
	m := &Manager{cfg: Config{ClusterDNS: "10.43.0.10", ClusterDomain: "cluster.local"}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop"}}
	got, err := m.resolvConf(pod)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(got), "nameserver 10.43.0.10\nsearch shop.svc.cluster.local svc.cluster.local cluster.local") || !strings.HasSuffix(string(got), "options ndots:5\n") {
		t.Errorf("ClusterFirst:\n%s", got)
	}
	pod.Spec.DNSPolicy = corev1.DNSNone
	pod.Spec.DNSConfig = &corev1.PodDNSConfig{Nameservers: []string{"1.1.1.1"}, Searches: []string{"example.com"},
		Options: []corev1.PodDNSConfigOption{{Name: "ndots", Value: ptrTo("2")}, {Name: "edns0"}}}
	got, _ = m.resolvConf(pod)
	if string(got) != "nameserver 1.1.1.1\nsearch example.com\noptions ndots:2 edns0\n" {
		t.Errorf("None with dnsConfig:\n%s", got)
	}
}

func TestCrashBackoff(t *testing.T) {
	for restarts, want := range map[int32]time.Duration{0: 0, 1: 10 * time.Second, 2: 20 * time.Second, 3: 40 * time.Second, 6: 5 * time.Minute, 50: 5 * time.Minute} {
		if got := crashBackoff(restarts); got != want {
			t.Errorf("crashBackoff(%d) = %s, want %s", restarts, got, want)
		}
	}
}

func TestCheckHostPath(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path string
		typ  corev1.HostPathType
		ok   bool
	}{
		{dir, corev1.HostPathDirectory, true},
		{file, corev1.HostPathDirectory, false},
		{file, corev1.HostPathFile, true},
		{filepath.Join(dir, "missing"), corev1.HostPathFile, false},
		{filepath.Join(dir, "made/here"), corev1.HostPathDirectoryOrCreate, true},
		{filepath.Join(dir, "made/file"), corev1.HostPathFileOrCreate, true},
		{file, corev1.HostPathSocket, false},
		{filepath.Join(dir, "anything"), corev1.HostPathUnset, true},
	} {
		err := checkHostPath(&corev1.HostPathVolumeSource{Path: tc.path, Type: &tc.typ})
		if (err == nil) != tc.ok {
			t.Errorf("%s as %q: %v", tc.path, tc.typ, err)
		}
	}
}

func ptrTo[T any](v T) *T { return &v }
