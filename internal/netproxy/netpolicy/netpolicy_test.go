package netpolicy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orch-dev/orch/internal/iptables"
	"github.com/orch-dev/orch/internal/loops/controllertest"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

// fakeSets keeps sets in memory.
type fakeSets struct {
	mu   sync.Mutex
	sets map[string][]string
}

func (f *fakeSets) Names() ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var names []string
	for n := range f.sets {
		names = append(names, n)
	}
	return names, nil
}

func (f *fakeSets) Members(name string) ([]string, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.sets[name]
	return slices.Clone(m), ok, nil
}

func (f *fakeSets) Replace(name string, s *Set) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sets[name] = slices.Clone(s.Members)
	return nil
}

func (f *fakeSets) Update(name string, s *Set, was []string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !slices.Equal(f.sets[name], was) {
		return fmt.Errorf("set %s holds %v, not %v", name, f.sets[name], was)
	}
	f.sets[name] = slices.Clone(s.Members)
	return nil
}

func (f *fakeSets) all() [][]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out [][]string
	for _, m := range f.sets {
		out = append(out, m)
	}
	return out
}

func (f *fakeSets) Destroy(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.sets, name)
	return nil
}

type fakeNode struct {
	api  *controllertest.Fake
	ipt  *iptables.Fake
	sets *fakeSets
	e    *Engine
	stop func()
}

func startEngine(t *testing.T, objs ...runtime.Object) *fakeNode {
	return startEngineWith(t, true, "", objs...)
}

// startEngineWith runs an engine on an API that answers (online) or
// never does, keeping its state at statePath.
func startEngineWith(t *testing.T, online bool, statePath string, objs ...runtime.Object) *fakeNode {
	t.Helper()
	api := controllertest.New(t, objs...)
	n := &fakeNode{api: api, ipt: iptables.NewFake(), sets: &fakeSets{sets: map[string][]string{}}}
	e, err := New(Config{Informers: api.Informers, IPTables: n.ipt, Sets: n.sets, NodeName: "n1", MinSyncPeriod: time.Millisecond,
		StatePath: statePath, OfflineAfter: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	n.e = e
	if online {
		api.Start()
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.Run(ctx) }()
	n.stop = func() { cancel(); <-done }
	t.Cleanup(n.stop)
	return n
}

func (n *fakeNode) forward(t *testing.T) string {
	t.Helper()
	rules, err := n.ipt.Rules("filter", chainForward)
	if err != nil || len(rules) < 2 {
		return "" // rules[0] makes the chain
	}
	return strings.Join(rules[1:], "\n")
}

func namespace(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelMetadataName: name}}}
}

func pod(name, ip, node string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: name, UID: types.UID("uid-" + name), Labels: labels},
		Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip}}
}

// TestAdmitIsolatesBeforeStart: a pod a policy selects is policed once
// Admit returns, before the API has its address (its first container
// starts after Admit: the spec's "isolated before it starts", which
// kube-router leaves to a race, k3s #947); a pod no policy selects is not
// held; a forgotten sandbox's rules go.
func TestAdmitIsolatesBeforeStart(t *testing.T) {
	deny := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "deny-web"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
	n := startEngine(t, namespace("x"), deny)
	waitFor(t, "the first sync", n.e.wrote)

	web := pod("web-1", "", "n1", map[string]string{"app": "web"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.e.Admit(ctx, web, "10.42.0.9"); err != nil {
		t.Fatal(err)
	}
	if got := n.forward(t); !strings.Contains(got, "-d 10.42.0.9") {
		t.Fatalf("Admit returned before the pod's rules were in place: KUBE-ROUTER-FORWARD is\n%s", got)
	}

	other := pod("db-1", "", "n1", map[string]string{"app": "db"})
	start := time.Now()
	if err := n.e.Admit(ctx, other, "10.42.0.10"); err != nil {
		t.Fatal(err)
	}
	if time.Since(start) > 500*time.Millisecond || strings.Contains(n.forward(t), "10.42.0.10") {
		t.Errorf("a pod no policy selects: held %v, rules %s", time.Since(start), n.forward(t))
	}

	n.e.Forget(web.UID)
	waitFor(t, "the forgotten pod's rules to go", func() bool { return !strings.Contains(n.forward(t), "10.42.0.9") })
}

// TestSyncFollowsTheAPI: pods, namespaces and policies as the informers
// see them: a pod's labels changing into a policy's selector isolates it,
// another node's pods are never policed here but are peers, and a
// deleted policy takes its chains and sets with it.
func TestSyncFollowsTheAPI(t *testing.T) {
	fromY := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "from-y"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: "y"}}}}}}}}
	peer := pod("client", "10.42.1.5", "n2", nil)
	peer.Namespace = "y"
	n := startEngine(t, namespace("x"), namespace("y"), fromY, pod("web-1", "10.42.0.9", "n1", map[string]string{"app": "db"}),
		pod("web-2", "10.42.1.9", "n2", map[string]string{"app": "web"}), peer)
	waitFor(t, "the first sync", n.e.wrote)
	if got := n.forward(t); got != "" {
		t.Fatalf("no local pod is selected, yet:\n%s", got)
	}
	relabelled := pod("web-1", "10.42.0.9", "n1", map[string]string{"app": "web"})
	if _, err := n.api.Client.Pods("x").Update(context.Background(), relabelled, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the relabelled pod's rules", func() bool { return strings.Contains(n.forward(t), "-d 10.42.0.9") })
	if strings.Contains(n.forward(t), "10.42.1.9") {
		t.Errorf("another node's pod is policed here:\n%s", n.forward(t))
	}
	if !slices.ContainsFunc(n.sets.all(), func(m []string) bool { return slices.Equal(m, []string{"10.42.1.5"}) }) {
		t.Errorf("no set holds the peer namespace's pod: %v", n.sets.all())
	}
	if err := n.api.Client.NetworkPolicies("x").Delete(context.Background(), "from-y", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the policy's rules and sets to go", func() bool {
		chains, _ := n.ipt.Chains("filter")
		return n.forward(t) == "" && len(n.sets.all()) == 0 && !slices.ContainsFunc(chains, func(c string) bool { return strings.HasPrefix(c, prefixPolicy) })
	})
}

// wrote says whether a sync has written the rules.
func (e *Engine) wrote() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.written != nil
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestOfflineStartPolicesFromKeptState: an agent started while the server
// is away (a reboot: the kernel's rules are gone, pods start again at new
// addresses) polices its pods as the state it kept says: a restarted pod
// is isolated at its new address before it runs, its peers on other
// nodes are still allowed.
func TestOfflineStartPolicesFromKeptState(t *testing.T) {
	fromY := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "from-y"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: "y"}}}}}}}}
	peer := pod("client", "10.42.1.5", "n2", nil)
	peer.Namespace = "y"
	web := pod("web-1", "10.42.0.9", "n1", map[string]string{"app": "web"})
	state := filepath.Join(t.TempDir(), "netpolicy.json")
	first := startEngineWith(t, true, state, namespace("x"), namespace("y"), fromY, web, peer)
	waitFor(t, "the first sync", func() bool { return strings.Contains(first.forward(t), "-d 10.42.0.9") })
	first.stop() // the node goes down; what it knew is written on the way
	if _, err := os.Stat(state); err != nil {
		t.Fatalf("no state kept: %v", err)
	}

	again := startEngineWith(t, false, state)
	waitFor(t, "the kept state's rules", func() bool { return strings.Contains(again.forward(t), "-d 10.42.0.9") })
	restarted := web.DeepCopy()
	restarted.Status = corev1.PodStatus{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := again.e.Admit(ctx, restarted, "10.42.0.20"); err != nil {
		t.Fatal(err)
	}
	if got := again.forward(t); !strings.Contains(got, "-d 10.42.0.20") || strings.Contains(got, "10.42.0.9") {
		t.Errorf("the restarted pod is not policed at its new address alone:\n%s", got)
	}
	if !slices.ContainsFunc(again.sets.all(), func(m []string) bool { return slices.Equal(m, []string{"10.42.1.5"}) }) {
		t.Errorf("the kept peer is in no set: %v", again.sets.all())
	}
}

// brokenSets is a kernel without ip sets.
type brokenSets struct{ fakeSets }

func (*brokenSets) Replace(string, *Set) error {
	return errors.New("ipset create: protocol not supported")
}

// TestAdmitFailsLoudly: on a node that cannot enforce (no ip sets), a pod
// a policy selects does not start, and says why, instead of running
// unpoliced (k3s skips the policy controller in silence: k3s #3327).
func TestAdmitFailsLoudly(t *testing.T) {
	deny := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "deny-web"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{podPeer("client")}}}}}
	api := controllertest.New(t, namespace("x"), deny)
	e, err := New(Config{Informers: api.Informers, IPTables: iptables.NewFake(), Sets: &brokenSets{}, NodeName: "n1", MinSyncPeriod: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	api.Start()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitFor(t, "the caches", e.online)
	actx, acancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer acancel()
	err = e.Admit(actx, pod("web-1", "", "n1", map[string]string{"app": "web"}), "10.42.0.9")
	if err == nil || !strings.Contains(err.Error(), "protocol not supported") {
		t.Errorf("Admit on a node without ip sets: %v, want the reason", err)
	}
}
