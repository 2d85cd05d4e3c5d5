package netpolicy

import (
	"bufio"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/iptables"
	"github.com/orch-dev/orch/internal/roottest"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// TestDatapath: the rules police real traffic. A node (a network
// namespace) with three pods on its bridge and a host outside one hop
// away: a policy admits one pod's traffic to another and refuses the
// rest, same node (bridged) and from outside (routed); an egress policy
// lets a pod reach an outside block only, and the answers of connections
// it allowed come back; with the policies gone so are every chain and
// set, and traffic flows again. On both of iptables' back ends.
func TestDatapath(t *testing.T) {
	roottest.Require(t, "network namespaces, iptables and ipsets")
	for _, backend := range []string{"nft", "legacy"} {
		t.Run(backend, func(t *testing.T) {
			roottest.UseIPTables(t, backend)
			testDatapath(t, backend[:1]+strconv.Itoa(os.Getpid()%10000))
		})
	}
}

func testDatapath(t *testing.T, id string) {
	nodeNS := "npn-" + id
	node := roottest.NetNS(t, nodeNS)
	ipn := func(args ...string) { roottest.IP(t, append([]string{"-n", nodeNS}, args...)...) }
	ipn("link", "set", "lo", "up")
	ipn("link", "add", "npbr0", "type", "bridge")
	ipn("addr", "add", "10.42.0.1/24", "dev", "npbr0")
	ipn("link", "set", "npbr0", "up")
	if err := roottest.In(node, func() error {
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
			return err
		}
		// What the agent makes sure of: bridged traffic passes iptables.
		return os.WriteFile("/proc/sys/net/bridge/bridge-nf-call-iptables", []byte("1"), 0o644)
	}); err != nil {
		t.Skipf("no bridge netfilter in a network namespace here: %v", err)
	}
	pods := map[string]string{"a": "10.42.0.5", "b": "10.42.0.6", "c": "10.42.0.7"}
	paths := map[string]string{}
	for i, name := range []string{"a", "b", "c"} {
		ns := fmt.Sprintf("npp%d-%s", i, id)
		paths[name] = roottest.NetNS(t, ns)
		host, peer := fmt.Sprintf("nph%d", i), fmt.Sprintf("npe%d", i)
		ipn("link", "add", host, "type", "veth", "peer", "name", peer, "netns", ns)
		ipn("link", "set", host, "master", "npbr0", "up")
		roottest.IP(t, "-n", ns, "link", "set", "lo", "up")
		roottest.IP(t, "-n", ns, "addr", "add", pods[name]+"/24", "dev", peer)
		roottest.IP(t, "-n", ns, "link", "set", peer, "up")
		roottest.IP(t, "-n", ns, "route", "add", "default", "via", "10.42.0.1")
		roottest.Serve(t, paths[name], pods[name]+":8080", func(c net.Conn) { _, _ = fmt.Fprintf(c, "%s\n", name) })
	}
	outNS := "npo-" + id
	paths["outside"] = roottest.NetNS(t, outNS)
	ipn("link", "add", "npo0", "type", "veth", "peer", "name", "npo1", "netns", outNS)
	ipn("addr", "add", "198.51.100.1/24", "dev", "npo0")
	ipn("link", "set", "npo0", "up")
	roottest.IP(t, "-n", outNS, "addr", "add", "198.51.100.2/24", "dev", "npo1")
	roottest.IP(t, "-n", outNS, "link", "set", "npo1", "up")
	roottest.IP(t, "-n", outNS, "route", "add", "default", "via", "198.51.100.1")
	roottest.Serve(t, paths["outside"], "198.51.100.2:8080", func(c net.Conn) { _, _ = fmt.Fprintf(c, "outside\n") })
	pods["outside"] = "198.51.100.2"

	// reaches says whether from's connection to to's port 8080 is
	// answered by to.
	reaches := func(from, to string) bool {
		var got string
		_ = roottest.In(paths[from], func() error {
			c, err := net.DialTimeout("tcp", pods[to]+":8080", 2*time.Second)
			if err != nil {
				return err
			}
			defer func() { _ = c.Close() }()
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			got, _ = bufio.NewReader(c).ReadString('\n')
			return nil
		})
		return strings.TrimSpace(got) == to
	}
	check := func(step string, want map[[2]string]bool) {
		t.Helper()
		for pair, allowed := range want {
			if got := reaches(pair[0], pair[1]); got != allowed {
				t.Errorf("%s: %s -> %s answered %v, want %v", step, pair[0], pair[1], got, allowed)
			}
		}
	}
	cluster := &Cluster{Namespaces: map[string]labels.Set{"x": {"kubernetes.io/metadata.name": "x"}}}
	for _, name := range []string{"a", "b", "c"} {
		cluster.Pods = append(cluster.Pods, &Pod{Namespace: "x", Name: name, Labels: labels.Set{"pod": name}, IP: pods[name], Local: true})
	}
	var e *Engine
	sync := func(policies ...*networkingv1.NetworkPolicy) {
		t.Helper()
		cluster.Policies = policies
		if err := roottest.In(node, func() error {
			if e == nil {
				ipt, err := iptables.IPv4()
				if err != nil {
					return err
				}
				e = &Engine{cfg: Config{IPTables: ipt, Sets: &KernelSets{}}, log: slog.Default()}
			}
			return e.write(Build(cluster))
		}); err != nil {
			t.Fatalf("sync: %v", err)
		}
	}

	check("no policy", map[[2]string]bool{{"a", "b"}: true, {"outside", "b"}: true, {"b", "outside"}: true})
	onlyFromA := policy("b-from-a", func(s *networkingv1.NetworkPolicySpec) {
		s.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"pod": "b"}}
		s.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{podPeer("a")}, Ports: []networkingv1.NetworkPolicyPort{tcp(8080)}}}
	})
	sync(onlyFromA)
	check("b admits a only", map[[2]string]bool{{"a", "b"}: true, {"c", "b"}: false, {"outside", "b"}: false,
		{"b", "a"}: true, {"b", "c"}: true, {"outside", "c"}: true})
	// A pod relabelled into a peer: its address joins the set, no rule
	// is rewritten.
	before, _ := exec.Command("ip", "netns", "exec", nodeNS, "iptables-save", "-t", "filter").Output()
	cluster.Pods[2].Labels = labels.Set{"pod": "a"}
	sync(onlyFromA)
	check("c labelled as a", map[[2]string]bool{{"c", "b"}: true})
	after, _ := exec.Command("ip", "netns", "exec", nodeNS, "iptables-save", "-t", "filter").Output()
	if strip(before) != strip(after) {
		t.Errorf("a relabelled peer rewrote the rules:\n%s\n---\n%s", before, after)
	}
	cluster.Pods[2].Labels = labels.Set{"pod": "c"}

	aOut := policy("a-out", func(s *networkingv1.NetworkPolicySpec) {
		s.PolicyTypes = egressOnly
		s.Egress = []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{
			{IPBlock: &networkingv1.IPBlock{CIDR: "198.51.100.0/24", Except: []string{"198.51.100.3/32"}}}}}}
	})
	sync(onlyFromA, aOut)
	check("a reaches outside only", map[[2]string]bool{{"a", "outside"}: true, {"a", "b"}: false, {"a", "c"}: false, {"c", "b"}: false,
		// a is not isolated for ingress: answers to what others opened
		// leave it.
		{"c", "a"}: true, {"outside", "a"}: true})

	sync()
	check("policies gone", map[[2]string]bool{{"a", "b"}: true, {"c", "b"}: true, {"outside", "b"}: true, {"a", "c"}: true})
	out, err := exec.Command("ip", "netns", "exec", nodeNS, "iptables-save", "-t", "filter").CombinedOutput()
	if err != nil || strings.Contains(string(out), prefixPod) || strings.Contains(string(out), prefixPolicy) {
		t.Errorf("chains left with no policy (%v):\n%s", err, out)
	}
	if err := roottest.In(node, func() error {
		names, err := (&KernelSets{}).Names()
		if err != nil {
			return err
		}
		if len(names) > 0 {
			return fmt.Errorf("sets left with no policy: %v", names)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
}

// strip drops iptables-save's comments and counters.
func strip(save []byte) string {
	var lines []string
	for _, l := range strings.Split(string(save), "\n") {
		if strings.HasPrefix(l, "#") {
			continue
		}
		if strings.HasPrefix(l, ":") {
			l, _, _ = strings.Cut(l, " [")
		}
		lines = append(lines, l)
	}
	return strings.Join(lines, "\n")
}
