package netpolicy

import (
	"context"
	"fmt"
	"net"
	"os"
	goruntime "runtime"
	"slices"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/iptables"
	"github.com/orch-dev/orch/internal/loops/controllertest"
	"github.com/orch-dev/orch/internal/roottest"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

const (
	benchNamespaces = 50
	benchPodsPerNS  = 20 // 1,000 pods, all on this node
	benchPolicies   = 1000
)

// benchCluster is the 1,000 policies over 1,000 pods of one node:
// 50 namespaces of 20 pods (app=app-0..9, two of each); 20 policies per
// namespace, each selecting one app and admitting, on one port, an app of
// its own namespace and a namespace by label.
func benchCluster() []runtime.Object {
	var objs []runtime.Object
	for n := range benchNamespaces {
		ns := fmt.Sprintf("team-%02d", n)
		objs = append(objs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, UID: types.UID(ns),
			Labels: map[string]string{corev1.LabelMetadataName: ns, "tier": fmt.Sprint(n % 5)}}})
		for p := range benchPodsPerNS {
			app := fmt.Sprintf("app-%d", p%10)
			objs = append(objs, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("%s-%d", app, p/10),
				UID: types.UID(fmt.Sprintf("%s-%d", ns, p)), Labels: map[string]string{"app": app}},
				Spec:   corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}},
				Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: fmt.Sprintf("10.42.%d.%d", n, p+2)}})
		}
		for i := range benchPolicies / benchNamespaces {
			objs = append(objs, benchPolicy(ns, i, 8080))
		}
	}
	return objs
}

func benchPolicy(ns string, i int, port int32) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("policy-%d", i)},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app-%d", i%10)}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{
					{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app-%d", (i+1)%10)}}},
					{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": fmt.Sprint(i % 5)}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(intstr.FromInt32(port))}}}}}}
}

// benchEngine is an engine over the bench cluster, its caches filled.
func benchEngine(b *testing.B, ipt iptables.Interface, sets Sets) (*Engine, *controllertest.Fake) {
	api := controllertest.New(b, benchCluster()...)
	e, err := New(Config{Informers: api.Informers, IPTables: ipt, Sets: sets, NodeName: "n1"})
	if err != nil {
		b.Fatal(err)
	}
	api.Start()
	for !e.online() {
		time.Sleep(time.Millisecond)
	}
	return e, api
}

// BenchmarkSync: the targets for 1,000 policies over 1,000 pods
// of one node: building the rules (ms/build), a full sync into a network
// namespace of its own with the real iptables-restore and ipsets (root:
// first-sync-ms into empty tables, then ms/sync of full resyncs), a sync
// after one policy changed (target under 100 ms; full sync under 1 s),
// a pod's admission to its rules in place (p99-ms), and what the engine
// holds (heap-MB, target under 10 MB).
func BenchmarkSync(b *testing.B) {
	b.Run("build", func(b *testing.B) {
		e, _ := benchEngine(b, iptables.NewFake(), &fakeSets{sets: map[string][]string{}})
		c, _, err := e.cluster()
		if err != nil {
			b.Fatal(err)
		}
		var rs *Ruleset
		for b.Loop() {
			rs = Build(c)
		}
		rules := 0
		for _, r := range rs.Rules {
			rules += len(r)
		}
		b.ReportMetric(float64(rules), "rules")
		b.ReportMetric(float64(len(rs.Sets)), "sets")
		b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/build")
	})
	for _, mode := range []string{"full", "one-policy-changed", "admit"} {
		b.Run("kernel/"+mode, func(b *testing.B) {
			roottest.Require(b, "a network namespace")
			ns := roottest.NetNS(b, "npbench-"+fmt.Sprint(os.Getpid()%100000))
			var took []time.Duration
			var first time.Duration
			ipt, err := iptables.IPv4()
			if err != nil {
				b.Fatal(err)
			}
			// The API outside the namespace (its loopback is down); the
			// syncs inside it, on its thread.
			e, api := benchEngine(b, ipt, &KernelSets{})
			err = roottest.In(ns, func() error {
				start := time.Now()
				if err := e.Sync(); err != nil {
					return err
				}
				first = time.Since(start)
				for i := range b.N {
					switch mode {
					case "full":
						e.forget()
						start := time.Now()
						if err := e.Sync(); err != nil {
							return err
						}
						took = append(took, time.Since(start))
					case "one-policy-changed":
						ns := fmt.Sprintf("team-%02d", i%benchNamespaces)
						changed := benchPolicy(ns, 0, int32(9000+i%1000))
						if _, err := api.Client.NetworkPolicies(ns).Update(context.Background(), changed, metav1.UpdateOptions{}); err != nil {
							return err
						}
						for {
							p, err := e.policies.NetworkPolicies(ns).Get(changed.Name)
							if err == nil && p.Spec.Ingress[0].Ports[0].Port.IntVal == changed.Spec.Ingress[0].Ports[0].Port.IntVal {
								break
							}
							time.Sleep(time.Millisecond)
						}
						start := time.Now()
						if err := e.Sync(); err != nil {
							return err
						}
						took = append(took, time.Since(start))
					case "admit":
						// A new pod a policy selects, its sandbox up: the time
						// until its container may start. The sync runs here,
						// on the namespace's thread, as the engine's loop
						// would at once (a goroutine of its own would write
						// the host's tables).
						pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-00", Name: fmt.Sprintf("new-%d", i),
							UID: types.UID(fmt.Sprintf("new-%d", i)), Labels: map[string]string{"app": "app-0"}}, Spec: corev1.PodSpec{NodeName: "n1"}}
						admitted := make(chan error, 1)
						start := time.Now()
						go func() { admitted <- e.Admit(context.Background(), pod, fmt.Sprintf("10.42.200.%d", i%250+1)) }()
						for !e.urgentAsked() {
							goruntime.Gosched()
						}
						if err := e.Sync(); err != nil {
							return err
						}
						if err := <-admitted; err != nil {
							return err
						}
						took = append(took, time.Since(start))
						e.Forget(pod.UID)
					}
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			slices.Sort(took)
			var sum time.Duration
			for _, d := range took {
				sum += d
			}
			b.ReportMetric(float64(sum.Microseconds())/float64(len(took))/1000, "ms/sync")
			b.ReportMetric(float64(took[(len(took)*99)/100].Microseconds())/1000, "p99-ms")
			if mode == "full" {
				b.ReportMetric(float64(first.Microseconds())/1000, "first-sync-ms")
			}
		})
	}
	b.Run("memory", func(b *testing.B) {
		// What the engine keeps between syncs: its informers' (slimmed)
		// objects and the rules it wrote; the API's own copies are made
		// first.
		for b.Loop() {
			api := controllertest.New(b, benchCluster()...)
			goruntime.GC()
			var before, after goruntime.MemStats
			goruntime.ReadMemStats(&before)
			e, err := New(Config{Informers: api.Informers, IPTables: iptables.Discard{}, Sets: &fakeSets{sets: map[string][]string{}}, NodeName: "n1"})
			if err != nil {
				b.Fatal(err)
			}
			api.Start()
			for !e.online() {
				time.Sleep(time.Millisecond)
			}
			if err := e.Sync(); err != nil {
				b.Fatal(err)
			}
			goruntime.GC()
			goruntime.ReadMemStats(&after)
			b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "heap-MB")
			goruntime.KeepAlive(e)
		}
	})
}

// urgentAsked says whether an admission waits for a sync.
func (e *Engine) urgentAsked() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.asked > e.done
}

// BenchmarkConnectionRate: new TCP connections per second from one pod
// to another on a node's bridge (root: network namespaces, the real
// iptables and ipsets) with no policy, then with 100 policies selecting
// the server (the one that admits the client on its port last), in the
// same run: conns/s of each and the ratio (target at least 90 %).
func BenchmarkConnectionRate(b *testing.B) {
	roottest.Require(b, "network namespaces, iptables and ipsets")
	id := fmt.Sprint(os.Getpid() % 10000)
	nodeNS := "npr-" + id
	node := roottest.NetNS(b, nodeNS)
	roottest.IP(b, "-n", nodeNS, "link", "set", "lo", "up")
	roottest.IP(b, "-n", nodeNS, "link", "add", "nprbr0", "type", "bridge")
	roottest.IP(b, "-n", nodeNS, "addr", "add", "10.42.0.1/24", "dev", "nprbr0")
	roottest.IP(b, "-n", nodeNS, "link", "set", "nprbr0", "up")
	if err := roottest.In(node, func() error {
		return os.WriteFile("/proc/sys/net/bridge/bridge-nf-call-iptables", []byte("1"), 0o644)
	}); err != nil {
		b.Skipf("no bridge netfilter in a network namespace here: %v", err)
	}
	ips := map[string]string{"client": "10.42.0.5", "server": "10.42.0.6"}
	paths := map[string]string{}
	for i, name := range []string{"client", "server"} {
		ns := fmt.Sprintf("nprp%d-%s", i, id)
		paths[name] = roottest.NetNS(b, ns)
		roottest.IP(b, "-n", nodeNS, "link", "add", fmt.Sprintf("nprh%d", i), "type", "veth", "peer", "name", "eth0", "netns", ns)
		roottest.IP(b, "-n", nodeNS, "link", "set", fmt.Sprintf("nprh%d", i), "master", "nprbr0", "up")
		roottest.IP(b, "-n", ns, "link", "set", "lo", "up")
		roottest.IP(b, "-n", ns, "addr", "add", ips[name]+"/24", "dev", "eth0")
		roottest.IP(b, "-n", ns, "link", "set", "eth0", "up")
	}
	roottest.Serve(b, paths["server"], ips["server"]+":8080", func(net.Conn) {})
	// 3,000 connections a measure: the client's ports in TIME_WAIT stay
	// far from running out over a run of several.
	const conns = 3000
	if err := roottest.In(paths["client"], func() error {
		return os.WriteFile("/proc/sys/net/ipv4/tcp_tw_reuse", []byte("1"), 0o644)
	}); err != nil {
		b.Fatal(err)
	}
	rate := func() float64 {
		var took time.Duration
		err := roottest.In(paths["client"], func() error {
			start := time.Now()
			for range conns {
				c, err := net.DialTimeout("tcp", ips["server"]+":8080", time.Second)
				if err != nil {
					return err
				}
				_ = c.Close()
			}
			took = time.Since(start)
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		return conns / took.Seconds()
	}
	cluster := &Cluster{Namespaces: map[string]labels.Set{"x": {}}, Pods: []*Pod{
		{Namespace: "x", Name: "client", Labels: labels.Set{"app": "client"}, IP: ips["client"], Local: true},
		{Namespace: "x", Name: "server", Labels: labels.Set{"app": "server"}, IP: ips["server"], Local: true}}}
	for i := range 100 {
		port := int32(9000 + i)
		if i == 99 {
			port = 8080
		}
		cluster.Policies = append(cluster.Policies, policy(fmt.Sprintf("p-%02d", i), func(s *networkingv1.NetworkPolicySpec) {
			s.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}}
			s.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
				Ports: []networkingv1.NetworkPolicyPort{tcp(port)}}}
		}))
	}
	write := func(c *Cluster) {
		if err := roottest.In(node, func() error {
			ipt, err := iptables.IPv4()
			if err != nil {
				return err
			}
			e := &Engine{cfg: Config{IPTables: ipt, Sets: &KernelSets{}}}
			return e.write(Build(c))
		}); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		write(&Cluster{})
		none := rate()
		write(cluster)
		policed := rate()
		b.ReportMetric(none, "conns/s-none")
		b.ReportMetric(policed, "conns/s-100-policies")
		b.ReportMetric(100*policed/none, "ratio-%")
	}
}
