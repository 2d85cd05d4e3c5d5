package dns

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/miekg/dns"
	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/loops/controllertest"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

func service(ns, name, ip string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.ServiceSpec{ClusterIP: ip, ClusterIPs: []string{ip}, Ports: ports}}
}

type ep struct {
	addr, hostname string
	ready          bool
}

func slice(ns, svc string, port int32, portName string, eps ...ep) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: svc + "-abc", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(portName), Port: ptr.To(port), Protocol: ptr.To(corev1.ProtocolTCP)}}}
	for _, e := range eps {
		end := discoveryv1.Endpoint{Addresses: []string{e.addr}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(e.ready)}}
		if e.hostname != "" {
			end.Hostname = ptr.To(e.hostname)
		}
		s.Endpoints = append(s.Endpoints, end)
	}
	return s
}

// fakeCluster is the cluster state of the tests, through the informers
// and indexes the agent uses.
func fakeCluster(t testing.TB, objs ...runtime.Object) Cluster {
	t.Helper()
	api := controllertest.New(t, objs...)
	informers := kube.NewInformers(api.Client, 0)
	c, err := NewCluster(informers)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	informers.Start(ctx)
	t.Cleanup(func() { stop(); informers.Shutdown() })
	if !toolscache.WaitForCacheSync(ctx.Done(), informers.Services().Informer().HasSynced, informers.EndpointSlices().Informer().HasSynced) {
		t.Fatal("informers not synced")
	}
	return c
}

func clusterState(t testing.TB) Cluster {
	web := service("default", "web", "10.43.0.10",
		corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}, corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP})
	db := service("data", "db", corev1.ClusterIPNone, corev1.ServicePort{Name: "pg", Port: 5432})
	lazy := service("data", "lazy", corev1.ClusterIPNone)
	lazy.Spec.PublishNotReadyAddresses = true
	ext := service("default", "search", "")
	ext.Spec.Type, ext.Spec.ExternalName, ext.Spec.ClusterIPs = corev1.ServiceTypeExternalName, "www.example.com", nil
	return fakeCluster(t, web, db, lazy, ext,
		slice("default", "web", 8080, "http", ep{addr: "10.42.0.5", ready: true}),
		slice("data", "db", 5432, "pg", ep{addr: "10.42.0.7", hostname: "db-0", ready: true}, ep{addr: "10.42.1.8", hostname: "db-1", ready: true},
			ep{addr: "10.42.1.9", hostname: "db-2", ready: false}, ep{addr: "10.42.2.3", ready: true}),
		slice("data", "lazy", 80, "", ep{addr: "10.42.0.11", ready: false}))
}

// TestZone: Kubernetes' DNS specification (1.1.0), record by record,
// against a cluster held by the agent's informers.
func TestZone(t *testing.T) {
	z := NewZone("cluster.local", clusterState(t))
	cases := []struct {
		name  string
		qtype uint16
		rcode int
		want  []string // the answer's records, in order, without the TTL and class
	}{
		{"web.default.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, []string{"web.default.svc.cluster.local. A 10.43.0.10"}},
		// Names are matched without case and answered as asked (resolvers
		// that randomise the case check it).
		{"WEB.Default.SVC.cluster.local.", dns.TypeA, dns.RcodeSuccess, []string{"WEB.Default.SVC.cluster.local. A 10.43.0.10"}},
		// The name exists, with no IPv6 address: NODATA, not NXDOMAIN.
		{"web.default.svc.cluster.local.", dns.TypeAAAA, dns.RcodeSuccess, nil},
		{"nope.default.svc.cluster.local.", dns.TypeA, dns.RcodeNameError, nil},
		{"web.elsewhere.svc.cluster.local.", dns.TypeA, dns.RcodeNameError, nil},
		{"default.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, nil},
		{"empty.svc.cluster.local.", dns.TypeA, dns.RcodeNameError, nil},
		// Headless: each ready endpoint; by hostname or dashed address.
		{"db.data.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, []string{"db.data.svc.cluster.local. A 10.42.0.7", "db.data.svc.cluster.local. A 10.42.1.8", "db.data.svc.cluster.local. A 10.42.2.3"}},
		{"db-1.db.data.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, []string{"db-1.db.data.svc.cluster.local. A 10.42.1.8"}},
		{"10-42-2-3.db.data.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, []string{"10-42-2-3.db.data.svc.cluster.local. A 10.42.2.3"}},
		{"db-2.db.data.svc.cluster.local.", dns.TypeA, dns.RcodeNameError, nil}, // not ready
		{"lazy.data.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, []string{"lazy.data.svc.cluster.local. A 10.42.0.11"}},
		{"web-1.web.default.svc.cluster.local.", dns.TypeA, dns.RcodeNameError, nil}, // not headless
		// SRV for named ports: the Service's name, or each endpoint's.
		{"_http._tcp.web.default.svc.cluster.local.", dns.TypeSRV, dns.RcodeSuccess, []string{"_http._tcp.web.default.svc.cluster.local. SRV 0 100 80 web.default.svc.cluster.local."}},
		{"_dns._udp.web.default.svc.cluster.local.", dns.TypeSRV, dns.RcodeSuccess, []string{"_dns._udp.web.default.svc.cluster.local. SRV 0 100 53 web.default.svc.cluster.local."}},
		{"_dns._tcp.web.default.svc.cluster.local.", dns.TypeSRV, dns.RcodeNameError, nil},
		{"_pg._tcp.db.data.svc.cluster.local.", dns.TypeSRV, dns.RcodeSuccess, []string{
			"_pg._tcp.db.data.svc.cluster.local. SRV 0 33 5432 db-0.db.data.svc.cluster.local.",
			"_pg._tcp.db.data.svc.cluster.local. SRV 0 33 5432 db-1.db.data.svc.cluster.local.",
			"_pg._tcp.db.data.svc.cluster.local. SRV 0 33 5432 10-42-2-3.db.data.svc.cluster.local."}},
		{"_http._tcp.web.default.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, nil},
		// ExternalName: a CNAME, whatever the type asked.
		{"search.default.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, []string{"search.default.svc.cluster.local. CNAME www.example.com."}},
		// Pods by address.
		{"10-42-0-5.default.pod.cluster.local.", dns.TypeA, dns.RcodeSuccess, []string{"10-42-0-5.default.pod.cluster.local. A 10.42.0.5"}},
		{"10-42-0-500.default.pod.cluster.local.", dns.TypeA, dns.RcodeNameError, nil},
		// PTR: a cluster IP names its Service; a headless endpoint itself.
		{"10.0.43.10.in-addr.arpa.", dns.TypePTR, dns.RcodeSuccess, []string{"10.0.43.10.in-addr.arpa. PTR web.default.svc.cluster.local."}},
		{"8.1.42.10.in-addr.arpa.", dns.TypePTR, dns.RcodeSuccess, []string{"8.1.42.10.in-addr.arpa. PTR db-1.db.data.svc.cluster.local."}},
		// The specification's version, and the zone's own records.
		{"dns-version.cluster.local.", dns.TypeTXT, dns.RcodeSuccess, []string{`dns-version.cluster.local. TXT "1.1.0"`}},
		{"cluster.local.", dns.TypeSOA, dns.RcodeSuccess, []string{"cluster.local. SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 5"}},
		{"a.b.c.d.e.f.cluster.local.", dns.TypeA, dns.RcodeNameError, nil},
	}
	for _, c := range cases {
		t.Run(c.name+"/"+dns.TypeToString[c.qtype], func(t *testing.T) {
			if !z.Authoritative(c.name, c.qtype) {
				t.Fatal("not the zone's")
			}
			res := z.Answer(dns.Question{Name: c.name, Qtype: c.qtype, Qclass: dns.ClassINET})
			var got []string
			for _, rr := range res.Answer {
				got = append(got, plain(rr))
			}
			if res.Rcode != c.rcode || !slices.Equal(got, c.want) {
				t.Errorf("%s, %q; want %s, %q", dns.RcodeToString[res.Rcode], got, dns.RcodeToString[c.rcode], c.want)
			}
		})
	}
	// Reverse names of addresses the cluster does not hold, and names
	// outside the zone, go upstream.
	for _, name := range []string{"1.0.0.127.in-addr.arpa.", "example.com.", "cluster.local.example.com."} {
		if z.Authoritative(name, dns.TypePTR) {
			t.Errorf("%s is answered as the cluster's", name)
		}
	}
	// An SRV answer's targets have their addresses in the additional section.
	res := z.Answer(dns.Question{Name: "_pg._tcp.db.data.svc.cluster.local.", Qtype: dns.TypeSRV, Qclass: dns.ClassINET})
	if len(res.Extra) != 3 || plain(res.Extra[0]) != "db-0.db.data.svc.cluster.local. A 10.42.0.7" {
		t.Errorf("SRV's additional section: %v", res.Extra)
	}
}

// plain is a record as dig shows it, without its TTL and class.
func plain(rr dns.RR) string {
	f := strings.Fields(rr.String())
	return strings.Join(append([]string{f[0]}, f[3:]...), " ")
}
