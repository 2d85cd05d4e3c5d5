package netpolicy

import (
	"bytes"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// The chains and sets kube-router's policy controller makes (k3s embeds
// it), with its names, so that a k3s user's `iptables-save | grep
// KUBE-ROUTER` and `ipset list` read the same here.
const (
	chainForward = "KUBE-ROUTER-FORWARD"
	prefixPod    = "KUBE-POD-FW-"
	prefixPolicy = "KUBE-NWPLCY-"
	prefixSrc    = "KUBE-SRC-"
	prefixDst    = "KUBE-DST-"

	// allowMark is set on a packet a policy allows and cleared once its
	// pod's chain has looked at it: kube-router's bit, clear of
	// kube-proxy's masquerade (0x4000) and drop (0x8000) bits.
	allowMark = "0x10000/0x10000"
	clearMark = "0x0/0x10000"
)

// Pod is what the rules need of a pod: where it is, who it is and the
// ports it names.
type Pod struct {
	UID       types.UID
	Namespace string
	Name      string
	Labels    labels.Set
	IP        string
	// Local is on this node: its traffic is this node's to police.
	Local bool
	// Ports are its containers' ports by name.
	Ports map[string][]NamedPort
}

// NamedPort is a container port a policy may name.
type NamedPort struct {
	Protocol corev1.Protocol
	Port     int32
}

// Cluster is what the node knows of the cluster: every policy, the
// namespaces' labels and the pods with an address (this node's and the
// peers').
type Cluster struct {
	Policies   []*networkingv1.NetworkPolicy
	Namespaces map[string]labels.Set
	Pods       []*Pod
}

// Set is an ipset the rules match on: hash:ip of pods' addresses, or
// hash:net of an ipBlock's exceptions.
type Set struct {
	Net     bool
	Members []string
}

// Type is the set's ipset type.
func (s *Set) Type() string {
	if s.Net {
		return "hash:net"
	}
	return "hash:ip"
}

// Ruleset is a node's policy rules: the filter table's chains in
// iptables-restore form (without the table's header and COMMIT, which
// the writer adds with the chains to delete) and the sets they match.
type Ruleset struct {
	// Chains are the chains in the order they are written, each with
	// its rules.
	Chains []string
	Rules  map[string][]string
	Sets   map[string]*Set
	// Isolated is how many local pods a policy selects.
	Isolated int
}

// hashName is kube-proxy's and kube-router's chain naming: the prefix and
// 16 characters of the base32 SHA-256 of what names the chain, so names
// stay within iptables' 28 and ipset's 31 characters.
func hashName(prefix string, parts ...string) string {
	sum := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return prefix + base32.StdEncoding.EncodeToString(sum[:])[:16]
}

// Build computes a node's rules from what it knows of the cluster, as
// Kubernetes says NetworkPolicies behave: a pod no policy selects is not
// isolated; one selected by a policy of a type is isolated in that
// direction and allowed what the union of those policies' rules allow;
// replies of allowed connections pass; traffic from the node itself
// (probes) does not pass FORWARD and so is always allowed, and so is a
// pod's traffic to its node. Each rule matches after the service
// proxy's DNAT, so a policy applies through a ClusterIP as to the pod.
func Build(c *Cluster) *Ruleset {
	b := &builder{c: c, rs: &Ruleset{Rules: map[string][]string{}, Sets: map[string]*Set{}}}
	return b.build()
}

type builder struct {
	c           *Cluster
	rs          *Ruleset
	byNamespace map[string][]*Pod
	// peers are the pods each peer selects, by peerKey: policies often
	// name the same peers.
	peers map[string][]*Pod
}

type direction string

const (
	ingress direction = "ingress"
	egress  direction = "egress"
)

func (b *builder) build() *Ruleset {
	b.byNamespace, b.peers = map[string][]*Pod{}, map[string][]*Pod{}
	for _, p := range b.c.Pods {
		b.byNamespace[p.Namespace] = append(b.byNamespace[p.Namespace], p)
	}
	policies := slices.Clone(b.c.Policies)
	slices.SortFunc(policies, func(a, b *networkingv1.NetworkPolicy) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	// Which policies of each direction select each local pod.
	type selected struct{ in, out []string }
	byPod := map[*Pod]*selected{}
	for _, pol := range policies {
		sel, err := metav1.LabelSelectorAsSelector(&pol.Spec.PodSelector)
		if err != nil {
			continue // validation refuses these; an old object is left out, not the sync
		}
		var targets []*Pod
		for _, p := range b.byNamespace[pol.Namespace] {
			if p.Local && sel.Matches(p.Labels) {
				targets = append(targets, p)
			}
		}
		if len(targets) == 0 {
			continue
		}
		for _, dir := range policyDirections(pol) {
			chain := b.policyChain(pol, dir, targets)
			for _, t := range targets {
				s := byPod[t]
				if s == nil {
					s = &selected{}
					byPod[t] = s
				}
				if dir == ingress {
					s.in = append(s.in, chain)
				} else {
					s.out = append(s.out, chain)
				}
			}
		}
	}
	var forward []string
	var pods []*Pod
	for p := range byPod {
		pods = append(pods, p)
	}
	slices.SortFunc(pods, func(a, b *Pod) int { return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name) })
	var podChains []string
	for _, p := range pods {
		s := byPod[p]
		chain := hashName(prefixPod, p.Namespace, p.Name)
		podChains = append(podChains, chain)
		var rules []string
		for _, d := range []struct {
			match    string
			policies []string
		}{{"-d " + p.IP, s.in}, {"-s " + p.IP, s.out}} {
			if len(d.policies) == 0 {
				continue
			}
			forward = append(forward, fmt.Sprintf("%s -m comment --comment %q -j %s", d.match, "pod "+p.Namespace+"/"+p.Name, chain))
			// Every policy has its say, then a packet none allowed is
			// refused. (A check after each policy to end the walk early
			// costs more than it saves when the last one allows: 100
			// policies, BenchmarkConnectionRate.)
			rules = append(rules, d.match+" -j MARK --set-xmark "+clearMark)
			for _, pc := range d.policies {
				rules = append(rules, d.match+" -j "+pc)
			}
			rules = append(rules, d.match+" -m mark ! --mark "+allowMark+" -j REJECT")
		}
		b.rs.Rules[chain] = rules
	}
	b.rs.Isolated = len(pods)
	if len(forward) > 0 {
		// Replies of allowed connections, and every later packet of one,
		// pass at once: only a connection's first packet walks the
		// pods' jumps.
		forward = append([]string{"-m conntrack --ctstate RELATED,ESTABLISHED -j RETURN"}, forward...)
		// The mark is the pods' chains' business: it leaves with none.
		forward = append(forward, "-j MARK --set-xmark "+clearMark)
	}
	b.rs.Rules[chainForward] = forward
	policyChains := make([]string, 0, len(b.rs.Rules))
	for c := range b.rs.Rules {
		if strings.HasPrefix(c, prefixPolicy) {
			policyChains = append(policyChains, c)
		}
	}
	slices.Sort(policyChains)
	b.rs.Chains = append(append([]string{chainForward}, podChains...), policyChains...)
	return b.rs
}

// policyDirections are the directions a policy isolates its pods in.
func policyDirections(p *networkingv1.NetworkPolicy) []direction {
	var dirs []direction
	types := p.Spec.PolicyTypes
	if len(types) == 0 { // defaulted by the API server; an old object
		types = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
		if len(p.Spec.Egress) > 0 {
			types = append(types, networkingv1.PolicyTypeEgress)
		}
	}
	for _, t := range types {
		switch t {
		case networkingv1.PolicyTypeIngress:
			dirs = append(dirs, ingress)
		case networkingv1.PolicyTypeEgress:
			dirs = append(dirs, egress)
		}
	}
	return dirs
}

// rule is one ingress or egress rule, direction-neutral: peers are the
// sources of an ingress rule and the destinations of an egress one.
type rule struct {
	peers []networkingv1.NetworkPolicyPeer
	ports []networkingv1.NetworkPolicyPort
}

func rulesOf(p *networkingv1.NetworkPolicy, dir direction) []rule {
	var rules []rule
	if dir == ingress {
		for _, r := range p.Spec.Ingress {
			rules = append(rules, rule{r.From, r.Ports})
		}
	} else {
		for _, r := range p.Spec.Egress {
			rules = append(rules, rule{r.To, r.Ports})
		}
	}
	return rules
}

// policyChain writes the chain of one policy's rules of one direction:
// each rule marks what it allows. Its name depends on the policy alone,
// so a change of its pods rewrites it in place.
func (b *builder) policyChain(pol *networkingv1.NetworkPolicy, dir direction, targets []*Pod) string {
	chain := hashName(prefixPolicy, pol.Namespace, pol.Name, string(dir))
	// The peer's side of the packet, and the side of the pods the policy
	// selects.
	peerSide, ownSide, setPrefix := "src", "dst", prefixSrc
	if dir == egress {
		peerSide, ownSide, setPrefix = "dst", "src", prefixDst
	}
	comment := fmt.Sprintf("-m comment --comment %q ", "policy "+pol.Namespace+"/"+pol.Name+" "+string(dir))
	var rules []string
	for i, r := range rulesOf(pol, dir) {
		ruleKey := []string{"policy", pol.Namespace, pol.Name, string(dir), strconv.Itoa(i)}
		// The rule's peers: pods (a set of their addresses), blocks of
		// addresses, or anything when it names none.
		var podPeers []*Pod
		var peerMatches []string
		anyPeer := len(r.peers) == 0
		if anyPeer {
			peerMatches = []string{""}
		}
		for _, peer := range r.peers {
			if blk := peer.IPBlock; blk != nil {
				cidr, err := netip.ParsePrefix(blk.CIDR)
				if err != nil || !cidr.Addr().Is4() {
					continue // an IPv4 node's rules; validation refuses the rest
				}
				match := "-" + peerSide[:1] + " " + cidr.Masked().String()
				if len(blk.Except) > 0 {
					var except []string
					for _, e := range blk.Except {
						if p, err := netip.ParsePrefix(e); err == nil && p.Addr().Is4() {
							except = append(except, p.Masked().String())
						}
					}
					slices.Sort(except)
					except = slices.Compact(except)
					name := hashName(setPrefix, append([]string{"except", blk.CIDR}, except...)...)
					b.rs.Sets[name] = &Set{Net: true, Members: except}
					match += " -m set ! --match-set " + name + " " + peerSide
				}
				peerMatches = append(peerMatches, match)
				continue
			}
			// One set per selector, shared by every policy that selects
			// peers alike, and made even while it selects nobody: pods it
			// comes to select change its members, not the rules.
			key := peerKey(pol.Namespace, peer)
			pods, ok := b.peers[key]
			if !ok {
				pods = b.peerPods(pol.Namespace, peer)
				b.peers[key] = pods
			}
			podPeers = append(podPeers, pods...)
			match := b.podSet(setPrefix, pods, key) + " " + peerSide
			if !slices.Contains(peerMatches, match) {
				peerMatches = append(peerMatches, match)
			}
		}
		podPeers = unique(podPeers)
		if len(r.ports) == 0 {
			for _, m := range peerMatches {
				rules = append(rules, join(comment, m, "-j MARK --set-xmark "+allowMark))
			}
			continue
		}
		for k, port := range r.ports {
			proto := strings.ToLower(string(ptr.Deref(port.Protocol, corev1.ProtocolTCP)))
			switch {
			case port.Port == nil:
				for _, m := range peerMatches {
					rules = append(rules, join(comment, "-p "+proto, m, "-j MARK --set-xmark "+allowMark))
				}
			case port.Port.Type == intstr.Int:
				dport := strconv.Itoa(int(port.Port.IntVal))
				if port.EndPort != nil && *port.EndPort > port.Port.IntVal {
					dport += ":" + strconv.Itoa(int(*port.EndPort))
				}
				for _, m := range peerMatches {
					rules = append(rules, join(comment, "-p "+proto, "-m "+proto+" --dport "+dport, m, "-j MARK --set-xmark "+allowMark))
				}
			default:
				rules = append(rules, b.namedPortRules(comment, dir, port.Port.StrVal, ptr.Deref(port.Protocol, corev1.ProtocolTCP),
					targets, podPeers, anyPeer, peerMatches, ownSide, append(ruleKey, "port", strconv.Itoa(k))...)...)
			}
		}
	}
	b.rs.Rules[chain] = rules
	return chain
}

// namedPortRules resolve a port name, as Kubernetes says: on the pods the
// policy selects for ingress, on the peer pods for egress (an ipBlock
// has no named ports). Pods that resolve it to the same number share one
// set and one rule.
func (b *builder) namedPortRules(comment string, dir direction, name string, proto corev1.Protocol, targets, podPeers []*Pod,
	anyPeer bool, peerMatches []string, ownSide string, key ...string) []string {
	p := strings.ToLower(string(proto))
	var rules []string
	if dir == ingress {
		for _, port := range groupByPort(targets, name, proto) {
			own := b.podSet(prefixDst, port.pods, append(key, strconv.Itoa(int(port.port)))...) + " " + ownSide
			for _, m := range peerMatches {
				rules = append(rules, join(comment, "-p "+p, "-m "+p+" --dport "+strconv.Itoa(int(port.port)), m, own, "-j MARK --set-xmark "+allowMark))
			}
		}
		return rules
	}
	peers := podPeers
	if anyPeer {
		peers = b.c.Pods
	}
	for _, port := range groupByPort(peers, name, proto) {
		set := b.podSet(prefixDst, port.pods, append(key, strconv.Itoa(int(port.port)))...)
		rules = append(rules, join(comment, "-p "+p, "-m "+p+" --dport "+strconv.Itoa(int(port.port)), set+" dst", "-j MARK --set-xmark "+allowMark))
	}
	return rules
}

type portGroup struct {
	port int32
	pods []*Pod
}

func groupByPort(pods []*Pod, name string, proto corev1.Protocol) []portGroup {
	by := map[int32][]*Pod{}
	for _, p := range pods {
		for _, np := range p.Ports[name] {
			if np.Protocol == proto {
				by[np.Port] = append(by[np.Port], p)
				break
			}
		}
	}
	groups := make([]portGroup, 0, len(by))
	for port, ps := range by {
		groups = append(groups, portGroup{port, ps})
	}
	slices.SortFunc(groups, func(a, b portGroup) int { return int(a.port - b.port) })
	return groups
}

// peerPods are the pods a peer of podSelector and namespaceSelector
// selects: the policy's namespace without a namespace selector, every
// pod of the namespaces selected without a pod selector.
func (b *builder) peerPods(namespace string, peer networkingv1.NetworkPolicyPeer) []*Pod {
	podSel := labels.Everything()
	if peer.PodSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(peer.PodSelector)
		if err != nil {
			return nil
		}
		podSel = sel
	}
	namespaces := []string{namespace}
	if peer.NamespaceSelector != nil {
		nsSel, err := metav1.LabelSelectorAsSelector(peer.NamespaceSelector)
		if err != nil {
			return nil
		}
		namespaces = namespaces[:0]
		for ns, l := range b.c.Namespaces {
			if nsSel.Matches(l) {
				namespaces = append(namespaces, ns)
			}
		}
	}
	var pods []*Pod
	for _, ns := range namespaces {
		for _, p := range b.byNamespace[ns] {
			if podSel.Matches(p.Labels) {
				pods = append(pods, p)
			}
		}
	}
	return pods
}

// podSet is the match of a set of the pods' addresses. Its name depends
// on what selects them (key), not on who they are: pods coming and going
// change the set's members, not the rules, and peers selected alike in
// several policies share one set.
func (b *builder) podSet(prefix string, pods []*Pod, key ...string) string {
	name := hashName(prefix, key...)
	if _, ok := b.rs.Sets[name]; ok {
		return "-m set --match-set " + name
	}
	ips := make([]string, 0, len(pods))
	for _, p := range pods {
		ips = append(ips, p.IP)
	}
	slices.Sort(ips)
	b.rs.Sets[name] = &Set{Members: slices.Compact(ips)}
	return "-m set --match-set " + name
}

// peerKey names what a peer selects, for podSet.
func peerKey(namespace string, peer networkingv1.NetworkPolicyPeer) string {
	key := "ns=" + namespace
	if peer.NamespaceSelector != nil {
		key = "namespaces=" + metav1.FormatLabelSelector(peer.NamespaceSelector)
	}
	if peer.PodSelector != nil {
		key += " pods=" + metav1.FormatLabelSelector(peer.PodSelector)
	}
	return key
}

func unique(pods []*Pod) []*Pod {
	seen := make(map[*Pod]bool, len(pods))
	out := pods[:0]
	for _, p := range pods {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}

// join makes one rule of its non-empty parts.
func join(parts ...string) string {
	var buf bytes.Buffer
	for _, p := range parts {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if buf.Len() > 0 {
			buf.WriteByte(' ')
		}
		buf.WriteString(p)
	}
	return buf.String()
}
