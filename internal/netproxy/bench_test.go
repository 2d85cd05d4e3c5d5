package netproxy

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	goruntime "runtime"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/iptables"
	"github.com/orch-dev/orch/internal/loops/controllertest"
	"github.com/orch-dev/orch/internal/roottest"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// manyServices are n Services of one port with per endpoints each, and
// their EndpointSlices, with what the API gives a proxy in a real
// cluster: kubectl apply's annotation on the Service, the EndpointSlice
// controller's labels, owner and annotation on the slice, a pod reference
// and node on every endpoint.
func manyServices(n, per int) []runtime.Object {
	var objs []runtime.Object
	for i := range n {
		name := fmt.Sprintf("svc-%04d", i)
		svc := service(name, fmt.Sprintf("10.43.%d.%d", i/250, i%250+1), corev1.ServiceTypeClusterIP,
			corev1.ServicePort{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP})
		svc.UID, svc.Labels, svc.Spec.Selector = types.UID(fmt.Sprintf("6f1c2b3a-0000-4000-8000-%012d", i)), map[string]string{"app": name}, map[string]string{"app": name}
		svc.Annotations = map[string]string{corev1.LastAppliedConfigAnnotation: fmt.Sprintf(`{"apiVersion":"v1","kind":"Service","metadata":{"annotations":{},"labels":{"app":%q},"name":%q,"namespace":"default"},"spec":{"ports":[{"name":"http","port":80,"protocol":"TCP","targetPort":8080}],"selector":{"app":%q}}}`, name, name, name)}
		objs = append(objs, svc)
		var addrs []string
		for j := range per {
			addrs = append(addrs, fmt.Sprintf("10.42.%d.%d", j, i%250+1))
		}
		s := slice(name, name+"-1", 8080, "http", addrs...)
		s.Labels[discoveryv1.LabelManagedBy] = "endpointslice-controller.k8s.io"
		s.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: "2026-11-24T10:00:00Z"}
		s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: name, UID: svc.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}
		for j := range s.Endpoints {
			e := &s.Endpoints[j]
			pod := fmt.Sprintf("%s-7d4b9c8f6-%05d", name, j)
			e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: pod, UID: types.UID(fmt.Sprintf("9a8b7c6d-0000-4000-8000-%06d%06d", i, j))}
			e.NodeName, e.Conditions.Serving, e.Conditions.Terminating = ptr.To(fmt.Sprintf("node-%d", j)), ptr.To(true), ptr.To(false)
		}
		objs = append(objs, s)
	}
	return objs
}

// BenchmarkSync: a full sync of 1,000 Services of 10 endpoints each
// (kube-proxy's anchor: under a second), building the rules alone and
// writing them with iptables-restore in a network namespace of its own
// (root): the first, into empty tables (first-sync-ms), full resyncs
// over the rules in place (ms/sync of full), and a sync after one
// Service's endpoints changed; and what the proxy holds for them in
// memory (its informers' objects and the rules).
func BenchmarkSync(b *testing.B) {
	const services, endpoints = 1000, 10
	b.Run("build", func(b *testing.B) {
		n := newFakeNode(b, manyServices(services, endpoints)...)
		var rules int
		for b.Loop() {
			n.p.ports = nil // every Service's ports built, as in a first sync
			ports, err := n.p.servicePorts()
			if err != nil {
				b.Fatal(err)
			}
			rules = buildRules(node{clusterCIDR: "10.42.0.0/16"}, ports, nil).rules
		}
		b.ReportMetric(float64(rules), "rules")
		b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/sync")
	})
	for _, writer := range []string{"iptables-restore", "nft"} {
		for _, mode := range []string{"full", "one-service-changed"} {
			b.Run(writer+"/"+mode, func(b *testing.B) { benchmarkKernelSync(b, writer, mode, services, endpoints) })
		}
	}
	b.Run("memory", func(b *testing.B) {
		// What the proxy keeps between syncs: its informers' objects and
		// the digests of the chains it wrote. The API's own copies are
		// made first, and the rules go to a kernel that keeps nothing.
		for b.Loop() {
			api := controllertest.New(b, manyServices(services, endpoints)...)
			goruntime.GC()
			var before, after goruntime.MemStats
			goruntime.ReadMemStats(&before)
			n := startProxy(b, api)
			n.p.cfg.IPTables = iptables.Discard{}
			if err := n.p.Sync(); err != nil {
				b.Fatal(err)
			}
			goruntime.GC()
			goruntime.ReadMemStats(&after)
			b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "heap-MB")
			goruntime.KeepAlive(n)
		}
	})
}

// benchmarkKernelSync is BenchmarkSync's syncs into a kernel's tables:
// with iptables-restore (the iptables mode) or nft (the nftables mode).
func benchmarkKernelSync(b *testing.B, writer, mode string, services, endpoints int) {
	roottest.Require(b, "a network namespace")
	if _, err := exec.LookPath(map[string]string{"iptables-restore": "iptables-restore", "nft": "nft"}[writer]); err != nil {
		b.Skipf("%s not installed", writer)
	}
	n := newFakeNode(b, manyServices(services, endpoints)...)
	ns := "npbench-" + fmt.Sprint(os.Getpid()%100000)
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		b.Fatalf("%v: %s", err, out)
	}
	defer func() { _ = exec.Command("ip", "netns", "del", ns).Run() }()
	var took []time.Duration
	var first time.Duration
	err := roottest.In("/run/netns/"+ns, func() error {
		if writer == "nft" {
			nft, err := NewNFTables()
			if err != nil {
				return err
			}
			n.p.cfg.Mode, n.p.nft = ModeNFTables, &nftWriter{nft: nft}
		} else {
			ipt, err := iptables.IPv4()
			if err != nil {
				return err
			}
			n.p.cfg.IPTables = ipt
		}
		start := time.Now()
		if err := n.p.Sync(); err != nil { // the first sync, full, into empty tables
			return err
		}
		first = time.Since(start)
		for i := range b.N {
			if mode == "full" {
				n.p.written = nil
				if n.p.nft != nil {
					n.p.nft.ready = false
				}
			} else {
				// One Service's endpoints change, as a rollout does.
				name := fmt.Sprintf("svc-%04d", i%services)
				updated := slice(name, name+"-1", 8080, "http", fmt.Sprintf("10.42.100.%d", i%250+1))
				if _, err := n.api.Client.EndpointSlices("default").Update(context.Background(), updated, metav1.UpdateOptions{}); err != nil {
					return err
				}
				for {
					s, err := n.p.slices.EndpointSlices("default").Get(name + "-1")
					if err == nil && len(s.Endpoints) == 1 {
						break
					}
					time.Sleep(time.Millisecond)
				}
			}
			start := time.Now()
			if err := n.p.sync(mode == "full"); err != nil { // as Run syncs after a change
				return err
			}
			took = append(took, time.Since(start))
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	var sum time.Duration
	for _, d := range took {
		sum += d
	}
	b.ReportMetric(float64(sum.Microseconds())/float64(len(took))/1000, "ms/sync")
	if mode == "full" {
		b.ReportMetric(ms(first), "first-sync-ms")
	}
}
