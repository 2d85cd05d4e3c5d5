package netproxy

import (
	"context"
	"strings"
	"testing"

	"github.com/orch-dev/orch/internal/loops/controllertest"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/knftables"
)

// nftNode is a proxy in the nftables mode on knftables' fake.
func nftNode(t *testing.T, objs ...runtime.Object) (*Proxy, *knftables.Fake, *controllertest.Fake) {
	t.Helper()
	api := controllertest.New(t, objs...)
	nft := knftables.NewFake(knftables.IPv4Family, nftTable)
	p, err := New(Config{Informers: api.Informers, Mode: ModeNFTables, NFTables: nft, ClusterCIDR: "10.42.0.0/16", NodeName: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	api.Start()
	return p, nft, api
}

// lastTransaction is the text of the last transaction the fake ran.
func lastTransaction(nft *knftables.Fake) string {
	nft.RLock()
	defer nft.RUnlock()
	return nft.LastTransaction.String()
}

func dumpHas(t *testing.T, nft *knftables.Fake, want ...string) {
	t.Helper()
	dump := nft.Dump()
	for _, w := range want {
		if !strings.Contains(dump, w) {
			t.Errorf("no %q in the table:\n%s", w, dump)
		}
	}
}

// TestNFTablesRules: the nftables mode says what the iptables mode says,
// in kube-proxy's nftables layout: a ClusterIP's element in the
// service-ips map going to the Service's chain, which masquerades
// traffic from outside the pod network and DNATs to an endpoint picked
// by a random number from a map (the endpoints in the hairpin set); node
// ports in their map; a Service with no endpoints refused; Local
// policies with no local endpoint dropped; ClientIP affinity with a
// chain and a timed set per endpoint.
func TestNFTablesRules(t *testing.T) {
	web := service("web", "10.43.0.10", corev1.ServiceTypeNodePort, corev1.ServicePort{Name: "http", Port: 80, NodePort: 30080, Protocol: corev1.ProtocolTCP})
	sticky := service("sticky", "10.43.0.11", corev1.ServiceTypeClusterIP, corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP})
	sticky.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	sticky.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}
	empty := service("empty", "10.43.0.12", corev1.ServiceTypeClusterIP, corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP})
	local := service("local", "10.43.0.13", corev1.ServiceTypeNodePort, corev1.ServicePort{Name: "http", Port: 80, NodePort: 30081, Protocol: corev1.ProtocolTCP})
	local.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	localSlice := slice("local", "local-1", 8080, "http", "10.42.1.5")
	localSlice.Endpoints[0].NodeName = ptr.To("elsewhere")
	p, nft, api := nftNode(t, web, sticky, empty, local, localSlice,
		slice("web", "web-1", 8080, "http", "10.42.0.5", "10.42.0.6"), slice("sticky", "sticky-1", 8080, "http", "10.42.0.7"))
	if err := p.Sync(); err != nil {
		t.Fatal(err)
	}
	port := func(name string) *servicePort {
		return &servicePort{name: "default/" + name + ":http", service: types.NamespacedName{Namespace: "default", Name: name}, protocol: corev1.ProtocolTCP}
	}
	svc, ext := nftName(nftPrefixService, port("web"), ""), nftName(nftPrefixExternal, port("web"), "")
	stickySvc, sep := nftName(nftPrefixService, port("sticky"), ""), nftName(nftPrefixEndpoint, port("sticky"), "__10.42.0.7/8080")
	if !strings.HasPrefix(svc, "service-") || !strings.HasSuffix(svc, "-default/web/tcp/http") {
		t.Errorf("service chain name %s, want kube-proxy's service-HASH-default/web/tcp/http", svc)
	}
	dumpHas(t, nft,
		"add element ip kube-proxy service-ips { 10.43.0.10 . tcp . 80 : goto "+svc+" }",
		"add rule ip kube-proxy "+svc+" ip daddr 10.43.0.10 tcp dport 80 ip saddr != 10.42.0.0/16 jump mark-for-masquerade",
		"add rule ip kube-proxy "+svc+" meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.42.0.5 . 8080 , 1 : 10.42.0.6 . 8080 }",
		"add element ip kube-proxy endpoint-hairpin { 10.42.0.5 . 10.42.0.5 }",
		"add rule ip kube-proxy masquerading ct status dnat ip saddr . ip daddr @endpoint-hairpin masquerade fully-random",
		"add element ip kube-proxy service-nodeports { tcp . 30080 : goto "+ext+" }",
		"add rule ip kube-proxy "+ext+" jump mark-for-masquerade",
		"add element ip kube-proxy no-endpoint-services { 10.43.0.12 . tcp . 80 : goto reject-chain }",
		"add element ip kube-proxy no-endpoint-nodeports { tcp . 30081 : drop }",
		"add element ip kube-proxy cluster-ips { 10.43.0.12 }",
		"add rule ip kube-proxy "+stickySvc+" numgen random mod 1 vmap { 0 : goto "+sep+" }",
		"add rule ip kube-proxy "+sep+" ip saddr 10.42.0.7 jump mark-for-masquerade",
		"add rule ip kube-proxy "+sep+" update @affinity-",
		"add rule ip kube-proxy "+sep+" meta l4proto tcp dnat to 10.42.0.7:8080",
		"timeout 60s",
		"type nat hook prerouting priority -100",
	)

	// A change rewrites the chains of the Service that changed, not the
	// others', and flushes the endpoint chain that went; the periodic
	// sync deletes it (a deletion makes nft read the whole table).
	change := func(s *discoveryv1.EndpointSlice, addr string) {
		t.Helper()
		if _, err := api.Client.EndpointSlices("default").Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the informer sees the change", func() bool {
			got, err := p.slices.EndpointSlices("default").Get(s.Name)
			return err == nil && got.Endpoints[0].Addresses[0] == addr
		})
	}
	change(slice("sticky", "sticky-1", 8080, "http", "10.42.0.8"), "10.42.0.8")
	if err := p.sync(false); err != nil {
		t.Fatal(err)
	}
	tx := lastTransaction(nft)
	if !strings.Contains(tx, "flush chain ip kube-proxy "+sep) || strings.Contains(tx, "delete chain") || strings.Contains(tx, "web") ||
		strings.Contains(tx, "filter-input") {
		t.Errorf("the sync after a change:\n%s", tx)
	}
	if err := p.Sync(); err != nil {
		t.Fatal(err)
	}
	tx = lastTransaction(nft)
	if !strings.Contains(tx, "delete chain ip kube-proxy "+sep) || strings.Contains(tx, "web") {
		t.Errorf("the periodic sync's transaction:\n%s", tx)
	}
	if strings.Contains(nft.Dump(), sep) {
		t.Errorf("the gone endpoint's chain is still there")
	}

	// An endpoint of web goes: its hairpin element with it.
	change(slice("web", "web-1", 8080, "http", "10.42.0.6"), "10.42.0.6")
	if err := p.sync(false); err != nil {
		t.Fatal(err)
	}
	tx = lastTransaction(nft)
	if !strings.Contains(tx, "delete element ip kube-proxy endpoint-hairpin { 10.42.0.5 . 10.42.0.5 }") || strings.Contains(tx, "sticky") {
		t.Errorf("the sync after web's change:\n%s", tx)
	}
	dumpHas(t, nft, "add rule ip kube-proxy "+svc+" meta l4proto tcp dnat ip addr . port to numgen random mod 1 map { 0 : 10.42.0.6 . 8080 }")

	// Nothing changed: nothing but the fixed chains written.
	if err := p.Sync(); err != nil {
		t.Fatal(err)
	}
	tx = lastTransaction(nft)
	if !strings.Contains(tx, "add chain ip kube-proxy filter-input") || strings.Contains(tx, "default/") {
		t.Errorf("a sync with no change wrote more than the fixed chains (refreshed):\n%s", tx)
	}
}

// TestNFTablesFullSyncDeletesStale: chains and sets of the table no
// Service wants any more (left from before a restart) go at the first
// sync, and rules a hand added to the fixed chains with them.
func TestNFTablesFullSyncDeletesStale(t *testing.T) {
	p, nft, _ := nftNode(t)
	tx := nft.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Add(&knftables.Chain{Name: "service-AAAAAAAA-default/gone/tcp/http"})
	tx.Add(&knftables.Set{Name: "affinity-AAAAAAAA-default/gone/tcp/http__10.42.0.9/80", Type: "ipv4_addr"})
	tx.Add(&knftables.Rule{Chain: "service-AAAAAAAA-default/gone/tcp/http", Rule: "ip saddr @affinity-AAAAAAAA-default/gone/tcp/http__10.42.0.9/80 drop"})
	tx.Add(&knftables.Chain{Name: nftServices})
	tx.Add(&knftables.Rule{Chain: nftServices, Rule: "ip daddr 192.0.2.1 drop"})
	if err := nft.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	if err := p.Sync(); err != nil {
		t.Fatal(err)
	}
	dump := nft.Dump()
	for _, gone := range []string{"default/gone", "192.0.2.1"} {
		if strings.Contains(dump, gone) {
			t.Errorf("%s left after the first sync:\n%s", gone, dump)
		}
	}
}
