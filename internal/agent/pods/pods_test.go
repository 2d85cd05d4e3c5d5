package pods

import (
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

func ptrTo[T any](v T) *T { return &v }
