package netpolicy

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// packet is a new connection's first packet as FORWARD sees it.
type packet struct {
	src, dst string
	proto    string
	port     int
}

// verdict runs the packet through the rules as the kernel would, for
// the few matches Build writes: false when a chain rejects it.
func verdict(t *testing.T, rs *Ruleset, p packet) bool {
	t.Helper()
	mark := false
	var run func(chain string, depth int) (rejected bool)
	run = func(chain string, depth int) bool {
		if depth > 5 {
			t.Fatalf("jumps too deep at %s", chain)
		}
		for _, r := range rs.Rules[chain] {
			fields := splitRule(r)
			matched, target := true, ""
			for i := 0; i < len(fields) && matched; i++ {
				switch f := fields[i]; f {
				case "-s", "-d":
					addr := p.src
					if f == "-d" {
						addr = p.dst
					}
					i++
					matched = inBlock(addr, fields[i])
				case "-p":
					i++
					matched = p.proto == fields[i]
				case "--dport":
					i++
					lo, hi, _ := strings.Cut(fields[i], ":")
					if hi == "" {
						hi = lo
					}
					l, _ := strconv.Atoi(lo)
					h, _ := strconv.Atoi(hi)
					matched = p.port >= l && p.port <= h
				case "--ctstate":
					i++
					matched = false // a new connection
				case "--match-set":
					negate := fields[i-1] == "!"
					name, side := fields[i+1], fields[i+2]
					i += 2
					addr := p.src
					if side == "dst" {
						addr = p.dst
					}
					s := rs.Sets[name]
					if s == nil {
						t.Fatalf("rule %q names set %s, which is not there", r, name)
					}
					in := slices.ContainsFunc(s.Members, func(m string) bool { return inBlock(addr, m) })
					matched = in != negate
				case "--mark":
					negate := fields[i-1] == "!"
					i++
					matched = mark != negate
				case "--comment":
					i++
				case "-j":
					target = fields[i+1]
					i = len(fields)
				}
			}
			if !matched {
				continue
			}
			switch target {
			case "RETURN":
				return false
			case "REJECT":
				return true
			case "MARK":
				mark = strings.Contains(r, "--set-xmark "+allowMark)
			default:
				if run(target, depth+1) {
					return true
				}
			}
		}
		return false
	}
	return !run(chainForward, 0)
}

func splitRule(r string) []string {
	var out []string
	for len(r) > 0 {
		r = strings.TrimLeft(r, " ")
		if strings.HasPrefix(r, `"`) {
			end := strings.Index(r[1:], `"`) + 1
			out = append(out, r[1:end])
			r = r[end+1:]
			continue
		}
		f, rest, _ := strings.Cut(r, " ")
		out = append(out, f)
		r = rest
	}
	return out
}

func inBlock(addr, block string) bool {
	a := netip.MustParseAddr(addr)
	if !strings.Contains(block, "/") {
		return a == netip.MustParseAddr(block)
	}
	return netip.MustParsePrefix(block).Contains(a)
}

// The test cluster: namespaces x and y (labelled ns=x, ns=y), pods a, b
// and c in each (labelled pod=a ...), x's on this node, y's on another;
// b serves a port named "serve-80" on 80, c names it on 81.
func testCluster(policies ...*networkingv1.NetworkPolicy) *Cluster {
	c := &Cluster{Policies: policies, Namespaces: map[string]labels.Set{"x": {"ns": "x"}, "y": {"ns": "y"}}}
	for i, ns := range []string{"x", "y"} {
		for j, name := range []string{"a", "b", "c"} {
			p := &Pod{Namespace: ns, Name: name, Labels: labels.Set{"pod": name}, IP: fmt.Sprintf("10.42.%d.%d", i, j+2), Local: ns == "x"}
			switch name {
			case "b":
				p.Ports = map[string][]NamedPort{"serve-80": {{corev1.ProtocolTCP, 80}}}
			case "c":
				p.Ports = map[string][]NamedPort{"serve-80": {{corev1.ProtocolTCP, 81}}}
			}
			c.Pods = append(c.Pods, p)
		}
	}
	return c
}

func ip(c *Cluster, pod string) string {
	ns, name, _ := strings.Cut(pod, "/")
	for _, p := range c.Pods {
		if p.Namespace == ns && p.Name == name {
			return p.IP
		}
	}
	if a, err := netip.ParseAddr(pod); err == nil {
		return a.String()
	}
	panic("no pod " + pod)
}

func policy(name string, mut func(*networkingv1.NetworkPolicySpec)) *networkingv1.NetworkPolicy {
	p := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: name},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pod": "a"}}}}
	mut(&p.Spec)
	return p
}

func podPeer(pod string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pod": pod}}}
}

func tcp(port int32) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(intstr.FromInt32(port))}
}

var (
	ingressOnly = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	egressOnly  = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
)

// TestBuild checks the rules' verdicts as Kubernetes' NetworkPolicy
// semantics (and its e2e suite's truth tables) say, for connections
// between the test cluster's pods.
func TestBuild(t *testing.T) {
	type conn struct {
		from, to string
		port     int
		proto    string
		allowed  bool
	}
	cases := []struct {
		name     string
		policies []*networkingv1.NetworkPolicy
		conns    []conn
	}{
		{"no policy: everything allowed", nil, []conn{
			{"y/a", "x/a", 80, "tcp", true}, {"x/a", "y/b", 80, "tcp", true}}},
		{"default deny ingress of x/a", []*networkingv1.NetworkPolicy{policy("deny", func(s *networkingv1.NetworkPolicySpec) { s.PolicyTypes = ingressOnly })}, []conn{
			{"x/b", "x/a", 80, "tcp", false}, {"y/a", "x/a", 80, "tcp", false},
			// Not isolated for egress, nor are the other pods.
			{"x/a", "y/b", 80, "tcp", true}, {"x/b", "x/c", 80, "tcp", true}}},
		{"deny all ingress in x", []*networkingv1.NetworkPolicy{policy("deny", func(s *networkingv1.NetworkPolicySpec) {
			s.PodSelector = metav1.LabelSelector{}
		})}, []conn{{"x/b", "x/a", 80, "tcp", false}, {"x/a", "x/c", 80, "tcp", false}, {"y/a", "x/b", 80, "tcp", false}}},
		{"allow from a pod of its namespace", []*networkingv1.NetworkPolicy{policy("from-b", func(s *networkingv1.NetworkPolicySpec) {
			s.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{podPeer("b")}}}
		})}, []conn{{"x/b", "x/a", 80, "tcp", true}, {"x/c", "x/a", 80, "tcp", false}, {"y/b", "x/a", 80, "tcp", false}}},
		{"allow from a namespace", []*networkingv1.NetworkPolicy{policy("from-y", func(s *networkingv1.NetworkPolicySpec) {
			s.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"ns": "y"}}}}}}
		})}, []conn{{"y/b", "x/a", 80, "tcp", true}, {"y/c", "x/a", 80, "udp", true}, {"x/b", "x/a", 80, "tcp", false}}},
		{"namespace and pod selector in one peer: both must match", []*networkingv1.NetworkPolicy{policy("from-y-b", func(s *networkingv1.NetworkPolicySpec) {
			s.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"ns": "y"}}, PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pod": "b"}}}}}}
		})}, []conn{{"y/b", "x/a", 80, "tcp", true}, {"y/c", "x/a", 80, "tcp", false}, {"x/b", "x/a", 80, "tcp", false}}},
		{"ports: one TCP port", []*networkingv1.NetworkPolicy{policy("port-80", func(s *networkingv1.NetworkPolicySpec) {
			s.Ingress = []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{tcp(80)}}}
		})}, []conn{{"y/b", "x/a", 80, "tcp", true}, {"y/b", "x/a", 81, "tcp", false}, {"y/b", "x/a", 80, "udp", false}}},
		{"ports: a range", []*networkingv1.NetworkPolicy{policy("range", func(s *networkingv1.NetworkPolicySpec) {
			p := tcp(80)
			p.EndPort = ptr.To[int32](82)
			s.Ingress = []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{p}}}
		})}, []conn{{"x/b", "x/a", 80, "tcp", true}, {"x/b", "x/a", 82, "tcp", true}, {"x/b", "x/a", 83, "tcp", false}}},
		{"ports: UDP and any port of a protocol", []*networkingv1.NetworkPolicy{policy("udp", func(s *networkingv1.NetworkPolicySpec) {
			s.Ingress = []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{
				{Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To(intstr.FromInt32(53))}, {Protocol: ptr.To(corev1.ProtocolSCTP)}}}}
		})}, []conn{{"x/b", "x/a", 53, "udp", true}, {"x/b", "x/a", 53, "tcp", false}, {"x/b", "x/a", 9, "sctp", true}}},
		{"a named port resolves on the pods the policy selects", []*networkingv1.NetworkPolicy{policy("named", func(s *networkingv1.NetworkPolicySpec) {
			s.PodSelector = metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "pod", Operator: metav1.LabelSelectorOpIn, Values: []string{"b", "c"}}}}
			s.Ingress = []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: ptr.To(intstr.FromString("serve-80"))}}}}
		})}, []conn{{"x/a", "x/b", 80, "tcp", true}, {"x/a", "x/b", 81, "tcp", false}, {"x/a", "x/c", 81, "tcp", true}, {"x/a", "x/c", 80, "tcp", false}}},
		{"the union of two policies", []*networkingv1.NetworkPolicy{
			policy("from-b", func(s *networkingv1.NetworkPolicySpec) {
				s.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{podPeer("b")}}}
			}),
			policy("from-c-81", func(s *networkingv1.NetworkPolicySpec) {
				s.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{podPeer("c")}, Ports: []networkingv1.NetworkPolicyPort{tcp(81)}}}
			})}, []conn{{"x/b", "x/a", 80, "tcp", true}, {"x/c", "x/a", 81, "tcp", true}, {"x/c", "x/a", 80, "tcp", false}}},
		{"ipBlock with an exception", []*networkingv1.NetworkPolicy{policy("block", func(s *networkingv1.NetworkPolicySpec) {
			s.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{IPBlock: &networkingv1.IPBlock{CIDR: "10.42.1.0/24", Except: []string{"10.42.1.3/32"}}}}}}
		})}, []conn{{"y/a", "x/a", 80, "tcp", true}, {"y/b", "x/a", 80, "tcp", false}, {"x/b", "x/a", 80, "tcp", false}}},
		{"egress deny all", []*networkingv1.NetworkPolicy{policy("no-egress", func(s *networkingv1.NetworkPolicySpec) { s.PolicyTypes = egressOnly })}, []conn{
			{"x/a", "y/b", 80, "tcp", false}, {"x/a", "192.0.2.1", 443, "tcp", false},
			// Not isolated for ingress.
			{"y/b", "x/a", 80, "tcp", true}}},
		{"egress to a namespace and outside by block", []*networkingv1.NetworkPolicy{policy("egress", func(s *networkingv1.NetworkPolicySpec) {
			s.PolicyTypes = egressOnly
			s.Egress = []networkingv1.NetworkPolicyEgressRule{
				{To: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"ns": "y"}}}}},
				{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "192.0.2.0/24"}}}, Ports: []networkingv1.NetworkPolicyPort{tcp(443)}}}
		})}, []conn{{"x/a", "y/c", 80, "tcp", true}, {"x/a", "x/b", 80, "tcp", false}, {"x/a", "192.0.2.1", 443, "tcp", true}, {"x/a", "192.0.2.1", 80, "tcp", false}}},
		{"egress to a named port resolves on the peers", []*networkingv1.NetworkPolicy{policy("egress-named", func(s *networkingv1.NetworkPolicySpec) {
			s.PolicyTypes = egressOnly
			s.Egress = []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: ptr.To(intstr.FromString("serve-80"))}}}}
		})}, []conn{{"x/a", "y/b", 80, "tcp", true}, {"x/a", "y/c", 81, "tcp", true}, {"x/a", "y/c", 80, "tcp", false}, {"x/a", "y/a", 80, "tcp", false}}},
		{"ingress and egress of two local pods: both must allow", []*networkingv1.NetworkPolicy{
			policy("a-out", func(s *networkingv1.NetworkPolicySpec) {
				s.PolicyTypes = egressOnly
				s.Egress = []networkingv1.NetworkPolicyEgressRule{{}} // anything
			}),
			policy("b-in", func(s *networkingv1.NetworkPolicySpec) {
				s.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"pod": "b"}}
				s.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{podPeer("c")}}}
			})}, []conn{{"x/a", "x/b", 80, "tcp", false}, {"x/c", "x/b", 80, "tcp", true}, {"x/a", "x/c", 80, "tcp", true}}},
		{"another node's pods are its to police", []*networkingv1.NetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Namespace: "y", Name: "deny"},
			Spec: networkingv1.NetworkPolicySpec{PolicyTypes: ingressOnly}}}, []conn{{"x/a", "y/a", 80, "tcp", true}}},
		{"a policy of another namespace", []*networkingv1.NetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Namespace: "z", Name: "deny"},
			Spec: networkingv1.NetworkPolicySpec{PolicyTypes: ingressOnly}}}, []conn{{"y/a", "x/a", 80, "tcp", true}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := testCluster(tc.policies...)
			rs := Build(c)
			for _, cn := range tc.conns {
				got := verdict(t, rs, packet{src: ip(c, cn.from), dst: ip(c, cn.to), proto: cn.proto, port: cn.port})
				if got != cn.allowed {
					t.Errorf("%s -> %s %s/%d: allowed %v, want %v\nrules:\n%s", cn.from, cn.to, cn.proto, cn.port, got, cn.allowed, dump(rs))
				}
			}
		})
	}
}

// TestBuildStableNames: pods coming and going change sets' members, not
// the rules (so a pod's start rewrites no chain but its own).
func TestBuildStableNames(t *testing.T) {
	pol := policy("from-y", func(s *networkingv1.NetworkPolicySpec) {
		s.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
			{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"ns": "y"}}}}}}
	})
	c := testCluster(pol)
	before := Build(c)
	c.Pods = append(c.Pods, &Pod{Namespace: "y", Name: "d", Labels: labels.Set{"pod": "d"}, IP: "10.42.1.9"})
	after := Build(c)
	if a, b := dump(before), dump(after); a != b {
		t.Errorf("a peer pod more changed the rules:\n%s\n---\n%s", a, b)
	}
	for name, s := range after.Sets {
		if len(s.Members) != len(before.Sets[name].Members)+1 {
			t.Errorf("set %s: %v, then %v", name, before.Sets[name].Members, s.Members)
		}
	}
}

// dump is the whole ruleset as iptables-restore would take it.
func dump(rs *Ruleset) string {
	text, _ := restoreText(rs, nil, func(string) bool { return true })
	return string(text)
}

// TestBuildBadInput: what validation refuses, stored before or sent
// around it, and what it allows but is odd, gives correct rules for the
// rest: a selector matching nothing allows nothing, overlapping blocks
// allow their union, an exception outside its block excepts nothing, an
// IPv6 block on an IPv4 node and a broken selector are left out, never
// written as rule text that would fail the whole restore.
func TestBuildBadInput(t *testing.T) {
	nobody := policy("from-nobody", func(s *networkingv1.NetworkPolicySpec) {
		s.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{podPeer("nobody")}}}
	})
	overlapping := policy("overlapping", func(s *networkingv1.NetworkPolicySpec) {
		s.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"pod": "b"}}
		s.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
			{IPBlock: &networkingv1.IPBlock{CIDR: "10.42.1.0/24", Except: []string{"10.42.1.2/32"}}},
			{IPBlock: &networkingv1.IPBlock{CIDR: "10.42.1.2/31"}},                                     // allows back what the first excepts
			{IPBlock: &networkingv1.IPBlock{CIDR: "10.42.0.0/24", Except: []string{"192.168.0.0/16"}}}, // except outside
		}}}
	})
	hostile := policy("hostile", func(s *networkingv1.NetworkPolicySpec) {
		s.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"pod": "c"}}
		s.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
			{IPBlock: &networkingv1.IPBlock{CIDR: "fd00::/8"}},
			{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.1/33 -j ACCEPT"}},
			{PodSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "pod", Operator: "Near"}}}}}}}
	})
	broken := policy("broken-selector", func(s *networkingv1.NetworkPolicySpec) {
		s.PodSelector = metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "pod", Operator: "Near"}}}
	})
	c := testCluster(nobody, overlapping, hostile, broken)
	rs := Build(c)
	for _, tc := range []struct {
		from, to string
		allowed  bool
	}{
		{"y/a", "x/a", false}, {"x/b", "x/a", false}, // a: a peer selector of nobody
		{"y/a", "x/b", true}, {"y/b", "x/b", true}, {"y/c", "x/b", true}, {"x/a", "x/b", true}, // b: the union
		{"192.168.1.1", "x/b", false},
		{"y/a", "x/c", false}, {"x/a", "x/c", false}, // c: isolated, nothing valid allows
	} {
		if got := verdict(t, rs, packet{src: ip(c, tc.from), dst: ip(c, tc.to), proto: "tcp", port: 80}); got != tc.allowed {
			t.Errorf("%s -> %s: allowed %v, want %v", tc.from, tc.to, got, tc.allowed)
		}
	}
	if text := dump(rs); strings.Contains(text, "fd00") || strings.Contains(text, "ACCEPT") || strings.Contains(text, "/33") {
		t.Errorf("bad values became rule text:\n%s", text)
	}
}

// TestBuildTenThousandPolicies: ten thousand policies over the test
// cluster's pods build, each pod's chain naming every policy that
// selects it, in well under the second kube-router takes for far fewer.
func TestBuildTenThousandPolicies(t *testing.T) {
	var pols []*networkingv1.NetworkPolicy
	for i := range 10000 {
		pols = append(pols, policy(fmt.Sprintf("p-%d", i), func(s *networkingv1.NetworkPolicySpec) {
			s.Ingress = []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{tcp(int32(1000 + i%50000))}}}
		}))
	}
	c := testCluster(pols...)
	start := time.Now()
	rs := Build(c)
	took := time.Since(start)
	podChain := hashName(prefixPod, "x", "a")
	if n := len(rs.Rules[podChain]); n < 10000 {
		t.Errorf("x/a's chain has %d rules, want one per policy", n)
	}
	if !verdict(t, rs, packet{src: ip(c, "y/a"), dst: ip(c, "x/a"), proto: "tcp", port: 10999}) ||
		verdict(t, rs, packet{src: ip(c, "y/a"), dst: ip(c, "x/a"), proto: "tcp", port: 999}) {
		t.Error("the 10,000th policy's port is not allowed, or a port no policy names is")
	}
	t.Logf("10,000 policies built in %v", took)
}
