// Package netpolicy enforces NetworkPolicies for a node's own pods, as
// kube-router's policy controller (which k3s embeds) does and with its
// chain and set names: one chain per policed pod, one per policy and
// direction, ipsets of the peers' addresses, all rewritten in one
// iptables-restore per sync and the sets swapped atomically through
// netlink. Unlike it, a pod a policy selects is isolated before its first
// container starts: the kubelet asks (Admit) and waits for its rules.
package netpolicy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/orch-dev/orch/internal/atomicfile"
	"github.com/orch-dev/orch/internal/iptables"
	"github.com/orch-dev/orch/internal/kube"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	networkinglisters "k8s.io/client-go/listers/networking/v1"
	toolscache "k8s.io/client-go/tools/cache"
)

// Config is what a node's policy engine needs.
type Config struct {
	// Informers read every pod, namespace and NetworkPolicy (the
	// agents' service-proxy identity may).
	Informers *kube.Informers
	IPTables  iptables.Interface
	// Sets are the kernel's ipsets; nil is KernelSets.
	Sets     Sets
	NodeName string
	// MinSyncPeriod spaces the syncs informers' changes cause (1 s);
	// SyncPeriod repairs the jump and the top chain even without a change
	// (5 minutes, kube-router's --iptables-sync-period; everything is
	// written again hourly). A pod's admission syncs at once.
	MinSyncPeriod, SyncPeriod time.Duration
	// StatePath keeps what the rules were built from, for an agent that
	// starts while the server is away (after a reboot): its pods are
	// policed as they were. Written at most once a minute, and only when
	// it changed (an SD card wears). Empty keeps nothing.
	StatePath string
	// OfflineAfter is how long the engine waits for the API before it
	// polices from the kept state (5 s, as the pods' manager waits).
	OfflineAfter time.Duration
	Logger       *slog.Logger
}

// saveEvery spaces the state's writes.
const saveEvery = time.Minute

// Engine keeps a node's policy rules in step with the cluster.
type Engine struct {
	cfg        Config
	pods       corelisters.PodLister
	namespaces corelisters.NamespaceLister
	policies   networkinglisters.NetworkPolicyLister
	synced     []toolscache.InformerSynced
	changed    chan struct{}
	// urgent has something when an admission waits for a sync.
	urgent chan struct{}
	log    *slog.Logger

	mu sync.Mutex
	// starting are this node's pods whose sandbox has an address the API
	// does not show yet, by UID.
	starting map[types.UID]startingPod
	// asked counts the syncs asked for by admissions; done is the last
	// of them a finished sync covered, and doneCh is closed (and
	// replaced) each time it moves.
	asked, done uint64
	doneCh      chan struct{}
	// syncErr is why the last sync failed: a pod that cannot be isolated
	// says why it does not start.
	syncErr error

	// kept is the state loaded from StatePath while the API's caches are
	// not filled; nil when online or nothing was kept.
	kept *Cluster

	// The writer's memory, held by the sync loop alone.
	// written is each chain's digest as last written, writtenSets each
	// set's members; nil until a full sync has succeeded.
	written     map[string]uint64
	writtenSets map[string][]string
	// lastFull is when everything was last written; repair asks the next
	// sync to write the jump and the top chain whatever they hold.
	lastFull time.Time
	repair   bool
	// saved is the state as last written to StatePath, unsaved the
	// state a sync built since, waiting for saveEvery to pass.
	saved     []byte
	unsaved   []byte
	lastSaved time.Time
}

type startingPod struct {
	pod *corev1.Pod
	ip  string
}

// New registers the engine's informers; Run syncs.
func New(cfg Config) (*Engine, error) {
	if cfg.MinSyncPeriod == 0 {
		cfg.MinSyncPeriod = time.Second
	}
	if cfg.SyncPeriod == 0 {
		cfg.SyncPeriod = 5 * time.Minute
	}
	if cfg.Sets == nil {
		cfg.Sets = &KernelSets{}
	}
	if cfg.OfflineAfter == 0 {
		cfg.OfflineAfter = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	pods, nss, pols := cfg.Informers.Pods(), cfg.Informers.Namespaces(), cfg.Informers.NetworkPolicies()
	e := &Engine{cfg: cfg, pods: pods.Lister(), namespaces: nss.Lister(), policies: pols.Lister(),
		synced:  []toolscache.InformerSynced{pods.Informer().HasSynced, nss.Informer().HasSynced, pols.Informer().HasSynced},
		changed: make(chan struct{}, 1), urgent: make(chan struct{}, 1), starting: map[types.UID]startingPod{}, doneCh: make(chan struct{}),
		log: cfg.Logger.With("component", "netpolicy")}
	wake := toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { e.wake() }, UpdateFunc: func(any, any) { e.wake() }, DeleteFunc: func(any) { e.wake() },
	}
	for _, inf := range []toolscache.SharedIndexInformer{pods.Informer(), nss.Informer(), pols.Informer()} {
		if _, err := inf.AddEventHandler(wake); err != nil {
			return nil, err
		}
	}
	if err := pods.Informer().SetTransform(slimPod); err != nil {
		return nil, fmt.Errorf("network policy: the pod informer must be its own, not started: %w", err)
	}
	if err := pols.Informer().SetTransform(slimPolicy); err != nil {
		return nil, fmt.Errorf("network policy: the policy informer must be its own, not started: %w", err)
	}
	if err := nss.Informer().SetTransform(slimNamespace); err != nil {
		return nil, fmt.Errorf("network policy: the namespace informer must be its own, not started: %w", err)
	}
	return e, nil
}

func (e *Engine) wake() {
	select {
	case e.changed <- struct{}{}:
	default:
	}
}

// Run syncs until ctx ends: at once when an admission waits, otherwise
// at most two syncs in a row and then one per MinSyncPeriod, and every
// SyncPeriod whatever happened. The rules stay when it ends: pods stay
// isolated while the agent restarts.
func (e *Engine) Run(ctx context.Context) {
	if !e.waitForAPI(ctx) {
		return
	}
	// What the last minute changed is written on the way out, however
	// the loop ends (a stop while a sync waits for the rate limit too).
	defer e.save(true)
	full := time.NewTicker(e.cfg.SyncPeriod)
	defer full.Stop()
	limit := rate.NewLimiter(rate.Every(e.cfg.MinSyncPeriod), 2)
	hurry := false
	for {
		if wait := limit.Reserve().Delay(); wait > 0 && !hurry {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			case <-e.urgent: // an admission does not wait for the limit
				t.Stop()
			}
		}
		if err := e.Sync(); err != nil {
			e.log.Warn("network policy rules not synced: trying again", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			e.wake()
		}
		var ok bool
		if hurry, ok = e.next(ctx, full.C); !ok {
			return
		}
	}
}

// next waits for a reason to sync (hurry: an admission waits), saving the
// kept state meanwhile when its minute comes; false when ctx ends.
func (e *Engine) next(ctx context.Context, full <-chan time.Time) (hurry, ok bool) {
	for {
		var save <-chan time.Time
		if e.unsaved != nil {
			save = time.After(time.Until(e.lastSaved.Add(saveEvery)))
		}
		select {
		case <-ctx.Done():
			return false, false
		case <-e.changed:
			return false, true
		case <-e.urgent:
			return true, true
		case <-full:
			// Hourly, everything is written again (sets read back from the
			// kernel); in between the jump and the top chain are, which
			// repairs what a hand removed at the cost of one chain.
			if time.Since(e.lastFull) >= fullSyncEvery {
				e.forget()
			} else {
				e.repair = true
			}
			return false, true
		case <-save:
			e.save(false)
		}
	}
}

// waitForAPI waits for the informers' caches; while the API does not
// answer it polices the pods from the state kept at StatePath, as they
// were when the node last heard from the server (pods Admit tells of
// with their new addresses).
func (e *Engine) waitForAPI(ctx context.Context) bool {
	wait, cancel := context.WithTimeout(ctx, e.cfg.OfflineAfter)
	ok := toolscache.WaitForCacheSync(wait.Done(), e.synced...)
	cancel()
	if ok || ctx.Err() != nil {
		return ok
	}
	kept, err := e.load()
	if err != nil || kept == nil {
		if err != nil {
			e.log.Warn("network policy state not read", "err", err)
		}
		return toolscache.WaitForCacheSync(ctx.Done(), e.synced...)
	}
	e.mu.Lock()
	e.kept = kept
	e.mu.Unlock()
	e.log.Info("API server away: policing pods as the kept state says", "policies", len(kept.Policies), "pods", len(kept.Pods))
	online := make(chan struct{})
	go func() {
		if toolscache.WaitForCacheSync(ctx.Done(), e.synced...) {
			close(online)
		}
	}()
	for {
		var retry <-chan time.Time
		if err := e.Sync(); err != nil {
			e.log.Warn("network policy rules not synced: trying again", "err", err)
			retry = time.After(time.Second)
		}
		select {
		case <-retry:
		case <-ctx.Done():
			return false
		case <-online:
			e.mu.Lock()
			e.kept = nil
			e.mu.Unlock()
			return true
		case <-e.changed:
		case <-e.urgent:
		}
	}
}

// load reads the state kept at StatePath; nil if there is none.
func (e *Engine) load() (*Cluster, error) {
	if e.cfg.StatePath == "" {
		return nil, nil
	}
	data, err := os.ReadFile(e.cfg.StatePath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var c Cluster
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("%s: %w", e.cfg.StatePath, err)
	}
	e.saved = data
	return &c, nil
}

// keep notes the state a sync from the API built, for save.
func (e *Engine) keep(c *Cluster) {
	if e.cfg.StatePath == "" {
		return
	}
	// What a policy is, not which version of it: an update that changes
	// nothing the rules read writes nothing.
	kept := &Cluster{Namespaces: c.Namespaces, Pods: c.Pods, Policies: make([]*networkingv1.NetworkPolicy, 0, len(c.Policies))}
	for _, p := range c.Policies {
		kept.Policies = append(kept.Policies, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace}, Spec: p.Spec})
	}
	slices.SortFunc(kept.Policies, func(a, b *networkingv1.NetworkPolicy) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	slices.SortFunc(kept.Pods, func(a, b *Pod) int { return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name) })
	data, err := json.Marshal(kept)
	if err != nil {
		e.log.Warn("network policy state not kept", "err", err)
		return
	}
	if bytes.Equal(data, e.saved) {
		e.unsaved = nil
		return
	}
	e.unsaved = data
	e.save(false)
}

// save writes the unsaved state if saveEvery has passed since the last
// write (or now, on the way out).
func (e *Engine) save(now bool) {
	if e.unsaved == nil || !now && time.Since(e.lastSaved) < saveEvery {
		return
	}
	if err := atomicfile.Write(e.cfg.StatePath, e.unsaved, 0o600); err != nil {
		e.log.Warn("network policy state not kept", "err", err)
		return
	}
	e.saved, e.unsaved, e.lastSaved = e.unsaved, nil, time.Now()
}

// Admit is the kubelet's question before a pod's first container starts:
// it records the address the pod's sandbox got and returns once the
// node's rules police it, if any policy selects it. Without the API (its
// caches not filled: an agent started offline) it does not wait, and
// the pod runs as the rules the node kept say.
func (e *Engine) Admit(ctx context.Context, pod *corev1.Pod, ip string) error {
	if pod.Spec.HostNetwork || ip == "" {
		return nil
	}
	e.mu.Lock()
	e.starting[pod.UID] = startingPod{slimmed(pod), ip}
	e.mu.Unlock()
	if !e.online() && e.keptState() == nil {
		return nil
	}
	if !e.selects(pod) {
		// Rules for its address as a peer follow; none police it.
		e.wake()
		return nil
	}
	e.mu.Lock()
	e.asked++
	want, ch := e.asked, e.doneCh
	e.mu.Unlock()
	select {
	case e.urgent <- struct{}{}:
	default:
	}
	for {
		select {
		case <-ctx.Done():
			e.mu.Lock()
			why := e.syncErr
			e.mu.Unlock()
			if why != nil {
				return fmt.Errorf("the network policy rules that isolate the pod are not written: %w", why)
			}
			return fmt.Errorf("the network policy rules that isolate the pod are not written: %w", ctx.Err())
		case <-ch:
		}
		e.mu.Lock()
		done := e.done
		ch = e.doneCh
		e.mu.Unlock()
		if done >= want {
			return nil
		}
	}
}

// Forget drops what Admit recorded of a pod whose sandbox is gone.
func (e *Engine) Forget(uid types.UID) {
	e.mu.Lock()
	_, ok := e.starting[uid]
	delete(e.starting, uid)
	e.mu.Unlock()
	if ok {
		e.wake()
	}
}

// online says whether the informers' caches are filled.
func (e *Engine) online() bool {
	for _, ok := range e.synced {
		if !ok() {
			return false
		}
	}
	return true
}

func (e *Engine) keptState() *Cluster {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.kept
}

// selects says whether a policy of the pod's namespace selects it.
func (e *Engine) selects(pod *corev1.Pod) bool {
	var pols []*networkingv1.NetworkPolicy
	if kept := e.keptState(); kept != nil {
		pols = kept.Policies
	} else {
		var err error
		if pols, err = e.policies.List(labels.Everything()); err != nil {
			return true
		}
	}
	for _, p := range pols {
		if p.Namespace != pod.Namespace {
			continue
		}
		if sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector); err == nil && sel.Matches(labels.Set(pod.Labels)) {
			return true
		}
	}
	return false
}

// Sync writes the rules: the sets first (a rule may not name a set that
// is not there), then the chains in one iptables-restore, then the sets
// and chains no longer matched are removed.
func (e *Engine) Sync() error {
	e.mu.Lock()
	asked := e.asked
	e.mu.Unlock()
	start := time.Now()
	c, fromAPI, err := e.cluster()
	if err != nil {
		return err
	}
	rs := Build(c)
	err = e.write(rs)
	e.mu.Lock()
	e.syncErr = err
	e.mu.Unlock()
	if err != nil {
		return err
	}
	if fromAPI {
		e.keep(c)
	}
	e.mu.Lock()
	if asked > e.done {
		e.done = asked
		close(e.doneCh)
		e.doneCh = make(chan struct{})
	}
	e.mu.Unlock()
	e.log.Debug("network policy rules synced", "policies", len(c.Policies), "pods", len(c.Pods), "isolated", rs.Isolated,
		"sets", len(rs.Sets), "took", time.Since(start).Round(time.Microsecond))
	return nil
}

// cluster is what the informers (and the admissions not yet in them)
// say, or while the API is away what the kept state says; fromAPI tells
// which.
func (e *Engine) cluster() (c *Cluster, fromAPI bool, err error) {
	if kept := e.keptState(); kept != nil {
		return e.keptCluster(kept), false, nil
	}
	c, err = e.clusterFromAPI()
	return c, err == nil, err
}

// keptCluster is the kept state with this node's pods as they are now:
// those Admit told of at their (new) addresses, those it did not as they
// were, unless a pod started since holds their address.
func (e *Engine) keptCluster(kept *Cluster) *Cluster {
	c := &Cluster{Policies: kept.Policies, Namespaces: kept.Namespaces}
	e.mu.Lock()
	defer e.mu.Unlock()
	taken := map[string]bool{}
	for _, s := range e.starting {
		taken[s.ip] = true
		if pp := policyPod(s.pod, s.ip, e.cfg.NodeName); pp != nil {
			c.Pods = append(c.Pods, pp)
		}
	}
	for _, p := range kept.Pods {
		if _, restarted := e.starting[p.UID]; restarted || p.Local && taken[p.IP] {
			continue
		}
		c.Pods = append(c.Pods, p)
	}
	return c
}

func (e *Engine) clusterFromAPI() (*Cluster, error) {
	pols, err := e.policies.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	nss, err := e.namespaces.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	pods, err := e.pods.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	c := &Cluster{Policies: pols, Namespaces: make(map[string]labels.Set, len(nss))}
	for _, ns := range nss {
		c.Namespaces[ns.Name] = ns.Labels
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	seen := make(map[types.UID]bool, len(e.starting))
	for _, p := range pods {
		ip := podIP(p)
		if s, ok := e.starting[p.UID]; ok {
			seen[p.UID] = true
			switch ip {
			case "":
				ip = s.ip
			case s.ip:
				delete(e.starting, p.UID) // the API has it now
			}
		}
		if pp := policyPod(p, ip, e.cfg.NodeName); pp != nil {
			c.Pods = append(c.Pods, pp)
		}
	}
	for uid, s := range e.starting {
		if !seen[uid] {
			// Not in the cache yet (or deleted meanwhile: Forget drops it).
			if pp := policyPod(s.pod, s.ip, e.cfg.NodeName); pp != nil {
				c.Pods = append(c.Pods, pp)
			}
		}
	}
	return c, nil
}

// podIP is a pod's IPv4 address, if it has one and is not done.
func podIP(p *corev1.Pod) string {
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return ""
	}
	for _, a := range p.Status.PodIPs {
		if addr, err := netip.ParseAddr(a.IP); err == nil && addr.Is4() {
			return a.IP
		}
	}
	if addr, err := netip.ParseAddr(p.Status.PodIP); err == nil && addr.Is4() {
		return p.Status.PodIP
	}
	return ""
}

// policyPod is a pod as the rules see it; nil for one with no address of
// its own (host network, not started, done).
func policyPod(p *corev1.Pod, ip, node string) *Pod {
	if p.Spec.HostNetwork || ip == "" || p.DeletionTimestamp != nil && p.Spec.NodeName != node {
		return nil
	}
	pp := &Pod{UID: p.UID, Namespace: p.Namespace, Name: p.Name, Labels: p.Labels, IP: ip, Local: p.Spec.NodeName == node}
	for _, c := range p.Spec.Containers {
		for _, port := range c.Ports {
			if port.Name == "" {
				continue
			}
			if pp.Ports == nil {
				pp.Ports = map[string][]NamedPort{}
			}
			proto := port.Protocol
			if proto == "" {
				proto = corev1.ProtocolTCP
			}
			pp.Ports[port.Name] = append(pp.Ports[port.Name], NamedPort{proto, port.ContainerPort})
		}
	}
	return pp
}

// write brings the kernel to rs, writing only what changed since the
// last sync: sets by their members' difference, chains whose rules
// differ (iptables-nft's restore of a whole large table costs seconds,
// as the service proxy found). After a failure or a full resync it reads
// the sets' members from the kernel and rewrites every chain.
func (e *Engine) write(rs *Ruleset) error {
	e.mu.Lock()
	written, writtenSets := e.written, e.writtenSets
	e.mu.Unlock()
	full, repair := written == nil, e.repair
	e.repair = false
	if repair && !full {
		if err := e.ensureJump(); err != nil {
			return err
		}
	}
	var existingSets []string
	if full {
		names, err := e.cfg.Sets.Names()
		if err != nil {
			return err
		}
		existingSets = names
		writtenSets = map[string][]string{}
		if err := e.ensureJump(); err != nil {
			return err
		}
	} else {
		for name := range writtenSets {
			existingSets = append(existingSets, name)
		}
	}
	newSets := make(map[string][]string, len(rs.Sets))
	for _, name := range slices.Sorted(maps.Keys(rs.Sets)) {
		s := rs.Sets[name]
		if err := e.writeSet(name, s, writtenSets, full); err != nil {
			e.forget()
			return err
		}
		newSets[name] = s.Members
	}
	var existingChains []string
	if full {
		chains, err := e.cfg.IPTables.Chains("filter")
		if err != nil {
			e.forget()
			return err
		}
		existingChains = chains
	} else {
		for c := range written {
			existingChains = append(existingChains, c)
		}
	}
	digests := make(map[string]uint64, len(rs.Chains))
	for _, c := range rs.Chains {
		digests[c] = digest(rs.Rules[c])
	}
	changed := func(c string) bool {
		old, ok := written[c]
		return full || repair && c == chainForward || !ok || old != digests[c]
	}
	text, wrote := restoreText(rs, existingChains, changed)
	if wrote {
		if err := e.cfg.IPTables.Restore("filter", text); err != nil {
			e.forget()
			return err
		}
	}
	for _, name := range existingSets {
		if _, keep := rs.Sets[name]; keep || !ours(name) {
			continue
		}
		if err := e.cfg.Sets.Destroy(name); err != nil {
			e.log.Warn("a set no rule matches is left", "set", name, "err", err)
		}
	}
	e.mu.Lock()
	e.written, e.writtenSets = digests, newSets
	e.mu.Unlock()
	if full {
		e.lastFull = time.Now()
	}
	return nil
}

// fullSyncEvery is how often everything is written again though nothing
// changed, as the service proxy's full resync.
const fullSyncEvery = time.Hour

// writeSet brings one set to s: its known members (or, on a full sync,
// the kernel's) changed one by one, a set not there made whole.
func (e *Engine) writeSet(name string, s *Set, written map[string][]string, full bool) error {
	was, known := written[name]
	if full {
		members, ok, err := e.cfg.Sets.Members(name)
		if err != nil {
			return err
		}
		was, known = members, ok
	}
	switch {
	case !known:
		return e.cfg.Sets.Replace(name, s)
	case slices.Equal(was, s.Members):
		return nil
	default:
		return e.cfg.Sets.Update(name, s, was)
	}
}

// digest is a chain's rules' FNV-1a hash.
func digest(rules []string) uint64 {
	h := fnv.New64a()
	for _, r := range rules {
		_, _ = h.Write([]byte(r))
		_, _ = h.Write([]byte{'\n'})
	}
	return h.Sum64()
}

// forget makes the next sync a full one.
func (e *Engine) forget() {
	e.mu.Lock()
	e.written, e.writtenSets = nil, nil
	e.mu.Unlock()
}

func ours(set string) bool {
	return strings.HasPrefix(set, prefixSrc) || strings.HasPrefix(set, prefixDst) || strings.HasPrefix(set, prefixTemp)
}

// ensureJump puts the jump to the engine's chain first in FORWARD: before
// the service proxy's and the pod network's ACCEPTs, which would let a
// packet through unpoliced.
func (e *Engine) ensureJump() error {
	ipt := e.cfg.IPTables
	if err := ipt.EnsureChain("filter", chainForward); err != nil {
		return err
	}
	jump := []string{"-m", "comment", "--comment", "kube-router netpol - network policies of the pods here", "-j", chainForward}
	rules, err := ipt.Rules("filter", "FORWARD")
	if err != nil {
		return err
	}
	// rules[0] creates the chain; rules[1] is the first rule.
	if len(rules) > 1 && strings.HasSuffix(rules[1], "-j "+chainForward) {
		return nil
	}
	if err := ipt.DeleteRule("filter", "FORWARD", jump...); err != nil {
		return err
	}
	return ipt.EnsureFirstRule("filter", "FORWARD", jump...)
}

// restoreText is the filter table's part for iptables-restore --noflush:
// the chains of rs that changed declared (so flushed) and filled, and the
// chains of ours the kernel has (existing) and rs does not, flushed and
// deleted. wrote is false when there is nothing to write.
func restoreText(rs *Ruleset, existing []string, changed func(string) bool) (text []byte, wrote bool) {
	var buf bytes.Buffer
	buf.WriteString("*filter\n")
	want := make(map[string]bool, len(rs.Chains))
	var write []string
	for _, c := range rs.Chains {
		want[c] = true
		if changed(c) {
			write = append(write, c)
			fmt.Fprintf(&buf, ":%s - [0:0]\n", c)
		}
	}
	var stale []string
	for _, c := range existing {
		if !want[c] && (strings.HasPrefix(c, prefixPod) || strings.HasPrefix(c, prefixPolicy)) {
			stale = append(stale, c)
			fmt.Fprintf(&buf, ":%s - [0:0]\n", c)
		}
	}
	for _, c := range write {
		for _, r := range rs.Rules[c] {
			fmt.Fprintf(&buf, "-A %s %s\n", c, r)
		}
	}
	for _, c := range stale {
		fmt.Fprintf(&buf, "-X %s\n", c)
	}
	buf.WriteString("COMMIT\n")
	return buf.Bytes(), len(write)+len(stale) > 0
}

// slimPod keeps of a pod what the rules read: a thousand pods' specs are
// megabytes a small board need not hold.
func slimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	return slimmed(p), nil
}

func slimmed(p *corev1.Pod) *corev1.Pod {
	out := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, Labels: p.Labels,
		ResourceVersion: p.ResourceVersion, DeletionTimestamp: p.DeletionTimestamp},
		Spec:   corev1.PodSpec{NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork},
		Status: corev1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP, PodIPs: p.Status.PodIPs}}
	for _, c := range p.Spec.Containers {
		var ports []corev1.ContainerPort
		for _, port := range c.Ports {
			if port.Name != "" {
				ports = append(ports, corev1.ContainerPort{Name: port.Name, ContainerPort: port.ContainerPort, Protocol: port.Protocol})
			}
		}
		if len(ports) > 0 {
			out.Spec.Containers = append(out.Spec.Containers, corev1.Container{Name: c.Name, Ports: ports})
		}
	}
	return out
}

// slimPolicy keeps a policy's name and spec (kubectl's last-applied
// annotation alone doubles it).
func slimPolicy(obj any) (any, error) {
	p, ok := obj.(*networkingv1.NetworkPolicy)
	if !ok {
		return obj, nil
	}
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion},
		Spec: p.Spec}, nil
}

// slimNamespace keeps a namespace's name and labels.
func slimNamespace(obj any) (any, error) {
	ns, ok := obj.(*corev1.Namespace)
	if !ok {
		return obj, nil
	}
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns.Name, UID: ns.UID, Labels: ns.Labels, ResourceVersion: ns.ResourceVersion}}, nil
}

// Cleanup removes the engine's chains, the jump to them and its sets, as
// `orch agent --cleanup` does for an uninstall (kube-router leaves them:
// k3s #7244). It returns what it removed, by kind.
func Cleanup(ipt iptables.Interface, sets Sets) (map[string]int, error) {
	removed := map[string]int{}
	n, err := iptables.RemoveOwned(ipt, "filter", func(chain string) bool {
		return chain == chainForward || strings.HasPrefix(chain, prefixPod) || strings.HasPrefix(chain, prefixPolicy)
	}, func(string) bool { return false })
	removed["iptables filter (network policy)"] = n
	if err != nil {
		return removed, fmt.Errorf("filter table: %w", err)
	}
	if sets == nil {
		sets = &KernelSets{}
	}
	names, err := sets.Names()
	if err != nil {
		return removed, err
	}
	var errs []error
	for _, name := range names {
		if !ours(name) {
			continue
		}
		if err := sets.Destroy(name); err != nil {
			errs = append(errs, err)
			continue
		}
		removed["ipsets"]++
	}
	return removed, errors.Join(errs...)
}
