package netproxy

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/iptables"
	"github.com/orch-dev/orch/internal/loops/controllertest"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	testingclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
)

func service(name, ip string, typ corev1.ServiceType, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.ServiceSpec{ClusterIP: ip, Type: typ, Ports: ports}}
}

func slice(svc, name string, port int32, portName string, addrs ...string) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(portName), Port: ptr.To(port), Protocol: ptr.To(corev1.ProtocolTCP)}}}
	for _, a := range addrs {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	return s
}

type fakeNode struct {
	api *controllertest.Fake
	ipt *iptables.Fake
	p   *Proxy
}

func newFakeNode(t testing.TB, objs ...runtime.Object) *fakeNode {
	t.Helper()
	return startProxy(t, controllertest.New(t, objs...))
}

// startProxy runs a proxy's informers against api, on an iptables Fake.
func startProxy(t testing.TB, api *controllertest.Fake) *fakeNode {
	t.Helper()
	ipt := iptables.NewFake()
	p, err := New(Config{Informers: api.Informers, IPTables: ipt, ClusterCIDR: "10.42.0.0/16"})
	if err != nil {
		t.Fatal(err)
	}
	api.Start()
	return &fakeNode{api: api, ipt: ipt, p: p}
}

func (n *fakeNode) rules(t *testing.T, table, chain string) []string {
	t.Helper()
	rules, err := n.ipt.Rules(table, chain)
	if err != nil {
		t.Fatal(err)
	}
	return rules
}

func contains(rules []string, substr string) bool {
	return slices.ContainsFunc(rules, func(r string) bool { return strings.Contains(r, substr) })
}

// TestSyncFromTheAPI: what the API holds becomes rules: a Service's
// ClusterIP DNATs to its EndpointSlices' addresses on the slice port of
// the same name; headless and ExternalName Services get none, nor do
// those labelled for another proxy (service.kubernetes.io/service-proxy-name,
// as kube-proxy leaves them); the built-in chains jump to the proxy's
// once however often it syncs.
func TestSyncFromTheAPI(t *testing.T) {
	web := service("web", "10.43.0.10", corev1.ServiceTypeClusterIP, corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP})
	headless := service("db", corev1.ClusterIPNone, corev1.ServiceTypeClusterIP, corev1.ServicePort{Port: 5432})
	external := service("ext", "", corev1.ServiceTypeExternalName)
	external.Spec.ExternalName = "example.com"
	others := service("others", "10.43.0.11", corev1.ServiceTypeClusterIP, corev1.ServicePort{Port: 80})
	others.Labels = map[string]string{labelServiceProxyName: "cilium"}
	n := newFakeNode(t, web, headless, external, others, slice("others", "others-abc", 8080, "", "10.42.0.6"),
		slice("web", "web-abc", 8080, "http", "10.42.0.5", "10.42.1.7"),
		slice("web", "web-def", 9090, "metrics", "10.42.0.5"),
		slice("db", "db-abc", 5432, "", "10.42.0.9"))
	// A pod network's ACCEPT, there before the proxy's first sync.
	if err := n.ipt.EnsureRule("filter", "FORWARD", "-s", "10.42.0.0/16", "-j", "ACCEPT"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := n.p.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	// The proxy's jumps come first, as kube-proxy's: a pod's connection
	// to a Service with no endpoints is refused before any ACCEPT.
	if forward := n.rules(t, "filter", "FORWARD"); !strings.Contains(forward[1], "-j KUBE-") || !strings.HasSuffix(forward[len(forward)-1], "-j ACCEPT") {
		t.Errorf("FORWARD:\n%s", strings.Join(forward, "\n"))
	}
	sp := &servicePort{name: "default/web:http", protocol: corev1.ProtocolTCP}
	svc := n.rules(t, "nat", sp.serviceChain())
	if !contains(svc, "-j "+sp.endpointChain(endpoint{ip: "10.42.0.5", port: 8080})) || !contains(svc, "-j "+sp.endpointChain(endpoint{ip: "10.42.1.7", port: 8080})) || contains(svc, "9090") {
		t.Errorf("web's chain:\n%s", strings.Join(svc, "\n"))
	}
	if sep := n.rules(t, "nat", sp.endpointChain(endpoint{ip: "10.42.1.7", port: 8080})); !contains(sep, "-j DNAT --to-destination 10.42.1.7:8080") {
		t.Errorf("an endpoint's chain:\n%s", strings.Join(sep, "\n"))
	}
	services := n.rules(t, "nat", chainServices)
	if contains(services, "default/db") || contains(services, "default/ext") || contains(services, "default/others") {
		t.Errorf("headless, ExternalName or another proxy's Services got rules:\n%s", strings.Join(services, "\n"))
	}
	for _, j := range jumps {
		rules := n.rules(t, j.table, j.chain)
		want := "-A " + j.chain + " " + strings.Join(j.rule, " ")
		if count := len(slices.DeleteFunc(slices.Clone(rules), func(r string) bool { return r != want })); count != 1 {
			t.Errorf("%s %s holds the jump %d times:\n%s", j.table, j.chain, count, strings.Join(rules, "\n"))
		}
	}
}

// TestHostileObjects: values no API server should have let in (an older
// or a hostile one) never become rule text: an address carrying iptables
// words, a cluster IP that is none, ports out of range, a port name with
// a quote. The good Service beside them keeps its rules.
func TestHostileObjects(t *testing.T) {
	good := service("good", "10.43.0.10", corev1.ServiceTypeClusterIP, corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP})
	badIP := service("bad-ip", "10.43.0.11 -j ACCEPT", corev1.ServiceTypeClusterIP, corev1.ServicePort{Port: 80, Protocol: corev1.ProtocolTCP})
	badPorts := service("bad-ports", "10.43.0.12", corev1.ServiceTypeNodePort,
		corev1.ServicePort{Name: "big", Port: 70000, Protocol: corev1.ProtocolTCP},
		corev1.ServicePort{Name: `q" -j DROP`, Port: 81, Protocol: corev1.ProtocolTCP},
		corev1.ServicePort{Name: "np", Port: 82, NodePort: -1, Protocol: corev1.ProtocolTCP})
	badPorts.Spec.ExternalIPs = []string{"198.51.100.7", "198.51.100.8/0 -j ACCEPT"}
	n := newFakeNode(t, good, badIP, badPorts,
		slice("good", "good-1", 8080, "http", "10.42.0.5", "10.42.0.6 -j ACCEPT", "not-an-ip"),
		slice("bad-ports", "bad-ports-1", 8080, "np", "10.42.0.7"))
	if err := n.p.Sync(); err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"nat", "filter"} {
		chains, err := n.ipt.Chains(table)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range chains {
			for _, r := range n.rules(t, table, c) {
				for _, bad := range []string{"-j ACCEPT\"", "10.42.0.6", "not-an-ip", "10.43.0.11", "70000", `q"`, "198.51.100.8", "--dport -1"} {
					if strings.Contains(r, bad) {
						t.Errorf("%s %s: %s", table, c, r)
					}
				}
			}
		}
	}
	sp := &servicePort{name: "default/good:http", protocol: corev1.ProtocolTCP}
	if svc := n.rules(t, "nat", sp.serviceChain()); !contains(svc, sp.endpointChain(endpoint{ip: "10.42.0.5", port: 8080})) {
		t.Errorf("the good Service's chain:\n%s", strings.Join(svc, "\n"))
	}
	if services := n.rules(t, "nat", chainServices); !contains(services, "-d 198.51.100.7/32") || !contains(services, "default/bad-ports:np cluster IP") {
		t.Errorf("what is valid of a Service with bad parts keeps its rules:\n%s", strings.Join(services, "\n"))
	}
}

// TestSlim: the proxy's informers keep of Services and EndpointSlices
// only what it reads (its memory with many of them), and what it reads
// survives.
func TestSlim(t *testing.T) {
	objs := manyServices(1, 2)
	n := newFakeNode(t, objs...)
	eventually(t, "the informers synced", func() bool { return n.p.synced[0]() && n.p.synced[1]() })
	svc, err := n.p.services.Services("default").Get("svc-0000")
	if err != nil {
		t.Fatal(err)
	}
	if svc.Annotations != nil || svc.Spec.Selector != nil || svc.Labels != nil || svc.Spec.ClusterIP != "10.43.0.1" || len(svc.Spec.Ports) != 1 {
		t.Errorf("the Service as the proxy keeps it: %+v", svc)
	}
	s, err := n.p.slices.EndpointSlices("default").Get("svc-0000-1")
	if err != nil {
		t.Fatal(err)
	}
	e := s.Endpoints[1]
	if s.Annotations != nil || s.OwnerReferences != nil || len(s.Labels) != 1 || s.Labels[discoveryv1.LabelServiceName] != "svc-0000" {
		t.Errorf("the slice's metadata as the proxy keeps it: %+v", s.ObjectMeta)
	}
	if e.TargetRef != nil || e.Addresses[0] != "10.42.1.1" || *e.NodeName != "node-1" || !*e.Conditions.Ready || !*e.Conditions.Serving || *e.Conditions.Terminating {
		t.Errorf("an endpoint as the proxy keeps it: %+v", e)
	}
}

// TestRunFollowsChanges: the running proxy rewrites the rules when a
// Service goes away (its chains deleted) and when rules are removed by
// hand (the periodic full sync puts them back).
func TestRunFollowsChanges(t *testing.T) {
	web := service("web", "10.43.0.10", corev1.ServiceTypeClusterIP, corev1.ServicePort{Port: 80, Protocol: corev1.ProtocolTCP})
	n := newFakeNode(t, web, slice("web", "web-abc", 8080, "", "10.42.0.5"))
	n.p.cfg.MinSyncPeriod, n.p.cfg.SyncPeriod = 10*time.Millisecond, 200*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.p.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	sp := &servicePort{name: "default/web", protocol: corev1.ProtocolTCP}
	hasChain := func() bool {
		chains, _ := n.ipt.Chains("nat")
		return slices.Contains(chains, sp.serviceChain())
	}
	eventually(t, "web's chain made", hasChain)

	// Someone flushes KUBE-SERVICES by hand: the full sync repairs it.
	if err := n.ipt.Restore("nat", []byte("*nat\n:KUBE-SERVICES - [0:0]\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "KUBE-SERVICES repaired", func() bool {
		rules, _ := n.ipt.Rules("nat", chainServices)
		return contains(rules, "-j "+sp.serviceChain())
	})

	if err := n.api.Client.Services("default").Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "web's chain deleted", func() bool { return !hasChain() })
}

// counting is an iptables Fake that counts the nat table's restores.
type counting struct {
	*iptables.Fake
	nat atomic.Int32
}

func (c *counting) Restore(table string, data []byte) error {
	if table == "nat" {
		c.nat.Add(1)
	}
	return c.Fake.Restore(table, data)
}

// TestSyncRateLimit: as kube-proxy's bounded frequency runner (burst 2),
// a change after a quiet spell is synced at once, and so is a second,
// while a third in a row waits MinSyncPeriod.
func TestSyncRateLimit(t *testing.T) {
	web := service("web", "10.43.0.10", corev1.ServiceTypeClusterIP, corev1.ServicePort{Port: 80, Protocol: corev1.ProtocolTCP})
	n := newFakeNode(t, web, slice("web", "web-abc", 8080, "", "10.42.0.5"))
	clock := testingclock.NewFakeClock(time.Now())
	ipt := &counting{Fake: n.ipt}
	n.p.cfg.Clock, n.p.cfg.IPTables = clock, ipt
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.p.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	settled := func() int32 {
		for {
			before := ipt.nat.Load()
			time.Sleep(100 * time.Millisecond)
			if after := ipt.nat.Load(); after == before && after > 0 {
				return after
			}
		}
	}
	base := settled() // the first sync, and one for the informers' first events
	clock.Step(5 * time.Second)
	for i, addr := range []string{"10.42.0.6", "10.42.0.7"} {
		if _, err := n.api.Client.EndpointSlices("default").Update(context.Background(), slice("web", "web-abc", 8080, "", addr), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "a sync at once", func() bool { return ipt.nat.Load() == base+int32(i)+1 })
	}
	if _, err := n.api.Client.EndpointSlices("default").Update(context.Background(), slice("web", "web-abc", 8080, "", "10.42.0.8"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := settled(); got != base+2 {
		t.Fatalf("%d syncs before MinSyncPeriod passed, want %d", got-base, 2)
	}
	clock.Step(time.Second)
	eventually(t, "the third sync, a second later", func() bool { return ipt.nat.Load() == base+3 })
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// recording is an iptables Fake that keeps what each restore wrote.
type recording struct {
	*iptables.Fake
	restores map[string][]string
}

func (r *recording) Restore(table string, data []byte) error {
	r.restores[table] = append(r.restores[table], string(data))
	return r.Fake.Restore(table, data)
}

// TestPartialSync: after the first, full, sync a sync writes only the
// chains that changed and the top-level ones, and deletes the chains it
// no longer wants; chains removed by hand make the restore fail, and the
// next sync is a full one that puts them back.
func TestPartialSync(t *testing.T) {
	a := service("a", "10.43.0.10", corev1.ServiceTypeClusterIP, corev1.ServicePort{Port: 80, Protocol: corev1.ProtocolTCP})
	b := service("b", "10.43.0.11", corev1.ServiceTypeClusterIP, corev1.ServicePort{Port: 80, Protocol: corev1.ProtocolTCP})
	n := newFakeNode(t, a, b, slice("a", "a-1", 8080, "", "10.42.0.5"), slice("b", "b-1", 8080, "", "10.42.0.6"))
	rec := &recording{Fake: n.ipt, restores: map[string][]string{}}
	n.p.cfg.IPTables = rec
	spA, spB := &servicePort{name: "default/a", protocol: corev1.ProtocolTCP}, &servicePort{name: "default/b", protocol: corev1.ProtocolTCP}
	if err := n.p.Sync(); err != nil {
		t.Fatal(err)
	}
	last := func() string { r := rec.restores["nat"]; return r[len(r)-1] }
	if !strings.Contains(last(), ":"+spA.serviceChain()) || !strings.Contains(last(), ":"+spB.serviceChain()) {
		t.Fatalf("the first sync is not full:\n%s", last())
	}

	// b gains an endpoint: b's chains are written, a's are not.
	if _, err := n.api.Client.EndpointSlices("default").Update(context.Background(), slice("b", "b-1", 8080, "", "10.42.0.6", "10.42.0.7"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the informer sees b's new endpoint", func() bool {
		s, err := n.p.slices.EndpointSlices("default").Get("b-1")
		return err == nil && len(s.Endpoints) == 2
	})
	if err := n.p.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := last(); !strings.Contains(got, ":"+spB.serviceChain()) || strings.Contains(got, ":"+spA.serviceChain()) || !strings.Contains(got, ":KUBE-SERVICES") {
		t.Errorf("a partial sync after b changed wrote:\n%s", got)
	}
	if rules := n.rules(t, "nat", spB.serviceChain()); !contains(rules, spB.endpointChain(endpoint{ip: "10.42.0.7", port: 8080})) {
		t.Errorf("b's chain after the partial sync:\n%s", strings.Join(rules, "\n"))
	}

	// a goes: its chains are deleted by a partial sync.
	if err := n.api.Client.Services("default").Delete(context.Background(), "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the informer sees a gone", func() bool { _, err := n.p.services.Services("default").Get("a"); return err != nil })
	if err := n.p.Sync(); err != nil {
		t.Fatal(err)
	}
	if chains, _ := n.ipt.Chains("nat"); slices.Contains(chains, spA.serviceChain()) {
		t.Error("a's chain still there after a partial sync")
	}

	// b's chain removed by hand: the restore that jumps to it fails, and
	// the next sync is full and puts it back.
	if err := n.ipt.Restore("nat", []byte("*nat\n:KUBE-SERVICES - [0:0]\n:"+spB.serviceChain()+" - [0:0]\n-X "+spB.serviceChain()+"\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	if err := n.p.Sync(); err == nil {
		t.Error("a sync jumping to a chain removed by hand succeeded")
	}
	if err := n.p.Sync(); err != nil {
		t.Fatal(err)
	}
	if chains, _ := n.ipt.Chains("nat"); !slices.Contains(chains, spB.serviceChain()) {
		t.Error("the full sync after a failure did not put b's chain back")
	}
}

// TestLoadBalancerAddresses: a LoadBalancer Service's status addresses
// (ServiceLB gives it its nodes') take its port as external IPs do.
func TestLoadBalancerAddresses(t *testing.T) {
	lb := service("lb", "10.43.0.20", corev1.ServiceTypeLoadBalancer, corev1.ServicePort{Port: 80, NodePort: 30080, Protocol: corev1.ProtocolTCP})
	lb.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.11"}, {Hostname: "lb.example.com"}}
	n := newFakeNode(t, lb, slice("lb", "lb-1", 8080, "", "10.42.0.5"))
	if err := n.p.Sync(); err != nil {
		t.Fatal(err)
	}
	sp := &servicePort{name: "default/lb", protocol: corev1.ProtocolTCP}
	services := n.rules(t, "nat", chainServices)
	if !contains(services, `-d 192.0.2.11/32 -p tcp -m comment --comment "default/lb external IP" -m tcp --dport 80 -j `+sp.externalChain()) {
		t.Errorf("no rule for the load balancer's address:\n%s", strings.Join(services, "\n"))
	}
	if !contains(n.rules(t, "nat", chainNodePorts), "--dport 30080 -j "+sp.externalChain()) {
		t.Error("no node port rule for the LoadBalancer Service")
	}
}
