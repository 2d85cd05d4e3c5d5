// Package upgrade is the loop that rolls a new orch over the cluster, as
// an Upgrade plan asks: the servers' nodes first, one at a time, then the
// agents, Concurrency at a time, each cordoned and (agents) drained
// through the eviction API, then told through its Node which release to
// run (upgradeapi's annotations). The node downloads the binary from the
// API server, swaps it on trial and restarts; the loop takes it as
// upgraded once it is Ready reporting the new version, uncordons it and
// goes on. A node that rolls back, or is not Ready in time, stops the
// plan with the reason in its status. Only one plan runs at a time.
package upgrade

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/listers"
	corelisters "k8s.io/client-go/listers/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/loops/controller"
	"github.com/orch-dev/orch/internal/release"
	"github.com/orch-dev/orch/internal/upgradeapi"
)

// Defaults of a plan that says nothing.
const (
	DefaultNodeTimeout  = 10 * time.Minute
	DefaultDrainTimeout = 5 * time.Minute
	DefaultRate         = 8 << 20 // bytes a second
)

// cordonedAnnotation marks a node the loop cordoned, which it alone
// uncordons: a node its owner cordoned stays so.
const cordonedAnnotation = "upgrade.orch.dev/cordoned"

// finalizer holds a plan under way until the loop has let its nodes go:
// a plan deleted mid-way leaves no node cordoned or told to upgrade (the
// system-upgrade-controller's users meet stranded cordons, suc #71).
const finalizer = "upgrade.orch.dev/release-nodes"

// poll is how often a plan under way is looked at again (drains,
// nodes coming back).
const poll = 2 * time.Second

// Releases says the sha256 of the staged binary of version for platform,
// or why there is none.
type Releases func(ctx context.Context, version, platform string) (sha256 string, err error)

// Options are the loop's.
type Options struct {
	Releases Releases
	// Servers lists the cluster's API servers: one with no Node is
	// upgraded by hand, and agents may not pass it.
	Servers func(ctx context.Context) ([]upgradeapi.Server, error)
	// ServerReady says whether the API server on a server's node is ready
	// (its /readyz: the datastore answers, with several servers its etcd
	// member in the cluster); nil takes a Ready node for a ready server.
	// The next server starts only once the last upgraded one is.
	ServerReady func(ctx context.Context, node *corev1.Node) error
}

// Controller is the upgrade loop.
type Controller struct {
	client   *kube.Client
	upgrades listers.ResourceIndexer[*upgradeapi.Upgrade]
	nodes    corelisters.NodeLister
	pods     corelisters.PodLister
	synced   []toolscache.InformerSynced
	queue    *controller.Queue[string]
	clock    clock.PassiveClock
	opts     Options
	log      *slog.Logger
	// written is each plan as the loop last wrote it: a sync that runs
	// before the informer has seen that write (a Node's event queues it)
	// goes on from there instead of planning again. One worker: no lock.
	written map[string]*upgradeapi.Upgrade
}

// New registers the loop on the factory's informers.
func New(client *kube.Client, factory *kube.Informers, opts Options, env controller.Env) (*Controller, error) {
	env = env.WithDefaults()
	ups, nodes, pods := factory.Upgrades(), factory.Nodes(), factory.Pods()
	c := &Controller{client: client, upgrades: ups.Lister(), nodes: nodes.Lister(), pods: pods.Lister(),
		synced: []toolscache.InformerSynced{ups.Informer().HasSynced, nodes.Informer().HasSynced, pods.Informer().HasSynced},
		queue:  controller.NewQueue[string]("upgrade", env), clock: env.Clock, opts: opts, log: env.Log.With("loop", "upgrade"),
		written: map[string]*upgradeapi.Upgrade{}}
	if err := c.queue.EnqueueObjects(ups.Informer(), func(_, name string) string { return name }); err != nil {
		return nil, err
	}
	all := func(any) {
		list, _ := c.upgrades.List(labels.Everything())
		for _, u := range list {
			if !terminal(u.Status.Phase) {
				c.queue.Add(u.Name)
			}
		}
	}
	if _, err := nodes.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: all, DeleteFunc: all, UpdateFunc: func(_, cur any) { all(cur) },
	}); err != nil {
		return nil, err
	}
	return c, nil
}

// Run syncs until ctx ends.
func (c *Controller) Run(ctx context.Context) {
	c.queue.Run(ctx, 1, c.synced, c.sync)
}

func terminal(phase string) bool {
	return phase == upgradeapi.PhaseSucceeded || phase == upgradeapi.PhaseFailed
}

func nodeDone(phase string) bool {
	return phase == upgradeapi.NodeUpgraded || phase == upgradeapi.NodeSkipped
}

func nodeActive(phase string) bool {
	return phase == upgradeapi.NodeDraining || phase == upgradeapi.NodeUpgrading
}

func (c *Controller) sync(ctx context.Context, name string) error {
	u, err := c.upgrades.Get(name)
	if apierrors.IsNotFound(err) {
		delete(c.written, name)
		return nil
	}
	if err != nil {
		return err
	}
	if w := c.written[name]; w != nil && w.UID == u.UID && revision(w.ResourceVersion) > revision(u.ResourceVersion) {
		u = w
	}
	u = u.DeepCopy() // the informer's is shared
	if u.DeletionTimestamp != nil {
		return c.release(ctx, u)
	}
	if terminal(u.Status.Phase) {
		delete(c.written, name)
		return c.setFinalizer(ctx, u, false)
	}
	if err := c.setFinalizer(ctx, u, true); err != nil {
		return err
	}
	next := u.DeepCopy()
	st := &next.Status
	if err := c.advance(ctx, next); err != nil {
		return err
	}
	done := 0
	for _, n := range st.Nodes {
		if nodeDone(n.Phase) {
			done++
		}
	}
	if len(st.Nodes) > 0 {
		st.Progress = fmt.Sprintf("%d/%d", done, len(st.Nodes))
	}
	if !equalStatus(u.Status, *st) {
		updated, err := c.client.Upgrades().UpdateStatus(ctx, next, metav1.UpdateOptions{})
		if err != nil {
			if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
				c.queue.AddAfter(name, poll)
				return nil
			}
			return fmt.Errorf("upgrade %s status: %w", name, err)
		}
		c.written[name] = updated
	}
	if !terminal(st.Phase) {
		c.queue.AddAfter(name, poll)
	}
	return nil
}

// release lets the nodes of a plan deleted under way go: uncordoned (if
// the loop cordoned them) and no longer told to upgrade; then the plan
// goes.
func (c *Controller) release(ctx context.Context, u *upgradeapi.Upgrade) error {
	if !slices.Contains(u.Finalizers, finalizer) {
		return nil
	}
	for _, n := range u.Status.Nodes {
		if nodeActive(n.Phase) {
			if err := c.uncordon(ctx, n.Name); err != nil {
				return err
			}
			c.log.Info("plan deleted: node let go", "upgrade", u.Name, "node", n.Name, "phase", n.Phase)
		}
	}
	delete(c.written, u.Name)
	return c.setFinalizer(ctx, u, false)
}

// setFinalizer adds or removes the loop's finalizer.
func (c *Controller) setFinalizer(ctx context.Context, u *upgradeapi.Upgrade, want bool) error {
	if slices.Contains(u.Finalizers, finalizer) == want {
		return nil
	}
	finalizers := slices.DeleteFunc(slices.Clone(u.Finalizers), func(f string) bool { return f == finalizer })
	if want {
		finalizers = append(finalizers, finalizer)
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": u.ResourceVersion, "finalizers": finalizers}})
	if err != nil {
		return err
	}
	updated, err := c.client.Upgrades().Patch(ctx, u.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		c.queue.AddAfter(u.Name, poll)
		return nil
	}
	if err != nil {
		return fmt.Errorf("upgrade %s finalizers: %w", u.Name, err)
	}
	c.written[u.Name] = updated
	u.ObjectMeta = updated.ObjectMeta
	return nil
}

// revision is a resourceVersion as the number orch's store makes it (0
// for one that is not).
func revision(rv string) uint64 {
	n, _ := strconv.ParseUint(rv, 10, 64)
	return n
}

func equalStatus(a, b upgradeapi.UpgradeStatus) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

// fail ends the plan with why.
func fail(st *upgradeapi.UpgradeStatus, format string, args ...any) {
	st.Phase, st.Message = upgradeapi.PhaseFailed, fmt.Sprintf(format, args...)
}

// advance moves the plan one step: it plans on first sight, follows the
// nodes under way and starts the next ones.
func (c *Controller) advance(ctx context.Context, u *upgradeapi.Upgrade) error {
	st := &u.Status
	if other := c.runningBefore(u); other != "" {
		fail(st, "the upgrade %s is under way: one plan runs at a time (wait for it, or delete it)", other)
		return nil
	}
	if len(st.Nodes) == 0 {
		if err := c.plan(ctx, u); err != nil || terminal(st.Phase) {
			return err
		}
	}
	now := metav1.NewTime(c.clock.Now())
	for i := range st.Nodes {
		n := &st.Nodes[i]
		if !nodeActive(n.Phase) {
			continue
		}
		if err := c.follow(ctx, u, n, now); err != nil {
			return err
		}
		if n.Phase == upgradeapi.NodeFailed || n.Phase == upgradeapi.NodeRolledBack {
			fail(st, "node %s: %s", n.Name, n.Message)
		}
	}
	if terminal(st.Phase) {
		return nil
	}
	if u.Spec.Paused {
		st.Phase, st.Message = upgradeapi.PhasePaused, "paused: nodes under way finish, no other starts"
		return nil
	}
	st.Phase, st.Message = upgradeapi.PhaseRunning, ""
	// Servers one at a time, before any agent.
	active, serversLeft := 0, false
	for _, n := range st.Nodes {
		if nodeActive(n.Phase) {
			active++
		}
		if n.Role == "server" && !nodeDone(n.Phase) {
			serversLeft = true
		}
	}
	limit := int(max(u.Spec.Concurrency, 1))
	for i := range st.Nodes {
		n := &st.Nodes[i]
		if n.Phase != upgradeapi.NodeWaiting {
			continue
		}
		switch {
		case n.Role == "server" && active > 0, n.Role == "agent" && (serversLeft || active >= limit):
			continue
		}
		if err := c.start(ctx, u, n, now); err != nil {
			return err
		}
		if n.Phase == upgradeapi.NodeFailed {
			fail(st, "node %s: %s", n.Name, n.Message)
			return nil
		}
		active++
		if n.Role == "server" {
			break
		}
	}
	if active == 0 && !slices.ContainsFunc(st.Nodes, func(n upgradeapi.NodeUpgrade) bool { return !nodeDone(n.Phase) }) {
		st.Phase, st.Message = upgradeapi.PhaseSucceeded, fmt.Sprintf("every node runs %s", u.Spec.Version)
		c.log.Info("upgrade done", "upgrade", u.Name, "version", u.Spec.Version)
	}
	return nil
}

// runningBefore names a plan under way created before u, if any.
func (c *Controller) runningBefore(u *upgradeapi.Upgrade) string {
	list, _ := c.upgrades.List(labels.Everything())
	for _, o := range list {
		if o.Name == u.Name || terminal(o.Status.Phase) {
			continue
		}
		if o.CreationTimestamp.Before(&u.CreationTimestamp) || o.CreationTimestamp.Equal(&u.CreationTimestamp) && o.Name < u.Name {
			return o.Name
		}
	}
	return ""
}

// plan picks the nodes and checks the plan can be carried out: every
// node's platform staged, every move allowed by the skew rules, no agent
// passing a server.
func (c *Controller) plan(ctx context.Context, u *upgradeapi.Upgrade) error {
	st := &u.Status
	selector := labels.Everything()
	if u.Spec.NodeSelector != nil {
		s, err := metav1.LabelSelectorAsSelector(u.Spec.NodeSelector)
		if err != nil {
			fail(st, "spec.nodeSelector: %v", err)
			return nil
		}
		selector = s
	}
	all, err := c.nodes.List(labels.Everything())
	if err != nil {
		return err
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Name < all[j].Name })
	var picked []upgradeapi.NodeUpgrade
	agents := false
	for _, node := range all {
		if !selector.Matches(labels.Set(node.Labels)) {
			continue
		}
		n := upgradeapi.NodeUpgrade{Name: node.Name, Role: role(node), From: node.Annotations[upgradeapi.VersionAnnotation], Phase: upgradeapi.NodeWaiting}
		if n.From == "" {
			fail(st, "node %s does not say which orch it runs (%s): it runs an orch too old to upgrade itself; replace its binary by hand", node.Name, upgradeapi.VersionAnnotation)
			return nil
		}
		if n.From == u.Spec.Version {
			n.Phase, n.Message = upgradeapi.NodeSkipped, "already runs "+u.Spec.Version
		} else {
			if err := release.CheckSkew(n.From, u.Spec.Version, u.Spec.Force); err != nil {
				fail(st, "node %s: %v", node.Name, err)
				return nil
			}
			platform := platformOf(node)
			if _, err := c.opts.Releases(ctx, u.Spec.Version, platform); err != nil {
				fail(st, "node %s: %v", node.Name, err)
				return nil
			}
			agents = agents || n.Role == "agent"
		}
		picked = append(picked, n)
	}
	if len(picked) == 0 {
		fail(st, "spec.nodeSelector selects no node")
		return nil
	}
	if agents && !u.Spec.Force {
		// Agents never run a newer orch than the servers.
		for _, node := range all {
			if role(node) != "server" || selector.Matches(labels.Set(node.Labels)) {
				continue
			}
			if release.Older(node.Annotations[upgradeapi.VersionAnnotation], u.Spec.Version) {
				fail(st, "server %s runs %s: agents may not run a newer orch than the servers; select the servers too (%s), or upgrade them first",
					node.Name, node.Annotations[upgradeapi.VersionAnnotation], upgradeapi.ControlPlaneLabel)
				return nil
			}
		}
		if c.opts.Servers != nil {
			servers, err := c.opts.Servers(ctx)
			if err != nil {
				return fmt.Errorf("list the API servers: %w", err)
			}
			for _, s := range servers {
				if s.Node != "" || s.Version != "" && !release.Older(s.Version, u.Spec.Version) {
					continue
				}
				runs := s.Version
				if runs == "" {
					runs = "an orch too old to say its version"
				}
				fail(st, "the server at %s runs %s and has no node to upgrade it through (--disable-agent): replace its binary first; agents may not run a newer orch than the servers", s.Address, runs)
				return nil
			}
		}
	}
	st.Nodes, st.Phase = picked, upgradeapi.PhaseRunning
	c.log.Info("upgrade planned", "upgrade", u.Name, "version", u.Spec.Version, "nodes", len(picked))
	return nil
}

func role(n *corev1.Node) string {
	if _, ok := n.Labels[upgradeapi.ControlPlaneLabel]; ok {
		return "server"
	}
	return "agent"
}

// platformOf is the node's platform as its binary says, or as its labels
// do (ARM nodes that do not say are taken for ARMv7).
func platformOf(n *corev1.Node) string {
	if p := n.Annotations[upgradeapi.PlatformAnnotation]; p != "" {
		return p
	}
	p := n.Labels[corev1.LabelOSStable] + "/" + n.Labels[corev1.LabelArchStable]
	if n.Labels[corev1.LabelArchStable] == "arm" {
		p += "/v7"
	}
	return p
}

// start cordons the node and begins its drain (agents) or its upgrade
// (servers: their pods outlive the restart, and draining the one server
// would leave nowhere for them to go).
func (c *Controller) start(ctx context.Context, u *upgradeapi.Upgrade, n *upgradeapi.NodeUpgrade, now metav1.Time) error {
	node, err := c.nodes.Get(n.Name)
	if apierrors.IsNotFound(err) {
		n.Phase, n.Message = upgradeapi.NodeFailed, "the node is gone"
		return nil
	}
	if err != nil {
		return err
	}
	if err := c.cordon(ctx, node); err != nil {
		return err
	}
	n.Started = &now
	if n.Role == "server" {
		return c.tell(ctx, u, n)
	}
	n.Phase, n.Message = upgradeapi.NodeDraining, "evicting its pods"
	c.log.Info("draining a node to upgrade it", "upgrade", u.Name, "node", n.Name)
	return nil
}

func (c *Controller) cordon(ctx context.Context, node *corev1.Node) error {
	if node.Spec.Unschedulable {
		return nil // cordoned already, by the loop or by its owner
	}
	patch := map[string]any{"metadata": map[string]any{"annotations": map[string]any{cordonedAnnotation: "true"}},
		"spec": map[string]any{"unschedulable": true}}
	return c.patchNode(ctx, node.Name, patch)
}

func (c *Controller) uncordon(ctx context.Context, name string) error {
	node, err := c.nodes.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	patch := map[string]any{"metadata": map[string]any{"annotations": map[string]any{
		upgradeapi.TargetAnnotation: nil, upgradeapi.SHA256Annotation: nil, upgradeapi.TimeoutAnnotation: nil,
		upgradeapi.RateAnnotation: nil, cordonedAnnotation: nil}}}
	if node.Annotations[cordonedAnnotation] == "true" {
		patch["spec"] = map[string]any{"unschedulable": nil}
	}
	return c.patchNode(ctx, name, patch)
}

func (c *Controller) patchNode(ctx context.Context, name string, patch map[string]any) error {
	data, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	if _, err := c.client.Nodes().Patch(ctx, name, types.MergePatchType, data, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("node %s: %w", name, err)
	}
	return nil
}

// tell has the node run the plan's version.
func (c *Controller) tell(ctx context.Context, u *upgradeapi.Upgrade, n *upgradeapi.NodeUpgrade) error {
	node, err := c.nodes.Get(n.Name)
	if err != nil {
		return err
	}
	sum, err := c.opts.Releases(ctx, u.Spec.Version, platformOf(node))
	if err != nil {
		n.Phase, n.Message = upgradeapi.NodeFailed, err.Error()
		return nil
	}
	rate := u.Spec.DownloadBytesPerSecond
	if rate == 0 {
		rate = DefaultRate
	}
	patch := map[string]any{"metadata": map[string]any{"annotations": map[string]any{
		upgradeapi.TargetAnnotation: u.Spec.Version, upgradeapi.SHA256Annotation: sum,
		upgradeapi.TimeoutAnnotation: strconv.Itoa(int(nodeTimeout(u).Seconds())),
		upgradeapi.RateAnnotation:    strconv.FormatInt(rate, 10)}}}
	if err := c.patchNode(ctx, n.Name, patch); err != nil {
		return err
	}
	now := metav1.NewTime(c.clock.Now())
	n.Phase, n.Message, n.Started = upgradeapi.NodeUpgrading, "told to run "+u.Spec.Version, &now
	c.log.Info("node told to upgrade", "upgrade", u.Name, "node", n.Name, "from", n.From, "to", u.Spec.Version)
	return nil
}

func nodeTimeout(u *upgradeapi.Upgrade) time.Duration {
	if u.Spec.NodeTimeout != nil && u.Spec.NodeTimeout.Duration > 0 {
		return u.Spec.NodeTimeout.Duration
	}
	return DefaultNodeTimeout
}

func drainTimeout(u *upgradeapi.Upgrade) time.Duration {
	if u.Spec.Drain.Timeout != nil && u.Spec.Drain.Timeout.Duration > 0 {
		return u.Spec.Drain.Timeout.Duration
	}
	return DefaultDrainTimeout
}

// follow moves a node under way: its drain, then its coming back.
func (c *Controller) follow(ctx context.Context, u *upgradeapi.Upgrade, n *upgradeapi.NodeUpgrade, now metav1.Time) error {
	node, err := c.nodes.Get(n.Name)
	if apierrors.IsNotFound(err) {
		n.Phase, n.Message, n.Finished = upgradeapi.NodeFailed, "the node was deleted", &now
		return nil
	}
	if err != nil {
		return err
	}
	switch n.Phase {
	case upgradeapi.NodeDraining:
		left, err := c.drain(ctx, u, node)
		if err != nil {
			n.Phase, n.Message, n.Finished = upgradeapi.NodeFailed, err.Error(), &now
			return c.uncordon(ctx, n.Name)
		}
		if left != "" {
			if now.Sub(n.Started.Time) > drainTimeout(u) {
				n.Phase, n.Message, n.Finished = upgradeapi.NodeFailed, fmt.Sprintf("drain timed out after %s: %s", drainTimeout(u), left), &now
				return c.uncordon(ctx, n.Name)
			}
			n.Message = left
			return nil
		}
		return c.tell(ctx, u, n)
	case upgradeapi.NodeUpgrading:
		if failed := node.Annotations[upgradeapi.FailedAnnotation]; strings.HasPrefix(failed, u.Spec.Version+":") {
			n.Phase, n.Message, n.Finished = upgradeapi.NodeRolledBack, "rolled back to "+n.From+": "+strings.TrimSpace(strings.TrimPrefix(failed, u.Spec.Version+":")), &now
			c.log.Error("a node rolled back its upgrade", "upgrade", u.Name, "node", n.Name, "reason", n.Message)
			return c.uncordon(ctx, n.Name)
		}
		_, onTrial := node.Annotations[upgradeapi.TrialAnnotation]
		if node.Annotations[upgradeapi.VersionAnnotation] == u.Spec.Version && !onTrial && controller.NodeReady(node) && n.Role == "server" && c.opts.ServerReady != nil {
			if err := c.opts.ServerReady(ctx, node); err != nil {
				n.Message = "runs " + u.Spec.Version + "; its API server is not ready: " + err.Error()
				return nil
			}
		}
		if node.Annotations[upgradeapi.VersionAnnotation] == u.Spec.Version && !onTrial && controller.NodeReady(node) {
			if err := c.uncordon(ctx, n.Name); err != nil {
				return err
			}
			n.Phase, n.Message, n.Finished = upgradeapi.NodeUpgraded, "runs "+u.Spec.Version, &now
			c.log.Info("node upgraded", "upgrade", u.Name, "node", n.Name, "version", u.Spec.Version, "took", now.Sub(n.Started.Time).Round(time.Second))
			return nil
		}
		// The node's own deadline rolls it back; this one covers a node
		// that never answers again.
		if now.Sub(n.Started.Time) > nodeTimeout(u)+2*time.Minute {
			n.Phase, n.Message, n.Finished = upgradeapi.NodeFailed, fmt.Sprintf("not Ready on %s within %s, nor rolled back", u.Spec.Version, nodeTimeout(u)), &now
			return nil
		}
		if v := node.Annotations[upgradeapi.VersionAnnotation]; v == u.Spec.Version {
			n.Message = "runs " + v + " on trial, until Ready"
		}
	}
	return nil
}

// drain evicts the node's pods as kubectl drain --ignore-daemonsets does
// (DaemonSet and mirror pods stay; pods no controller manages and pods
// with emptyDir data only as the plan allows), and says which are left,
// "" when none. An error is a pod the plan does not allow to evict.
func (c *Controller) drain(ctx context.Context, u *upgradeapi.Upgrade, node *corev1.Node) (string, error) {
	pods, err := c.pods.List(labels.Everything())
	if err != nil {
		return "", err
	}
	var left, unmanaged, emptyDir, blocked []string
	var evict []*corev1.Pod
	for _, p := range pods {
		if p.Spec.NodeName != node.Name || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if _, mirror := p.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
			continue
		}
		owner := metav1.GetControllerOf(p)
		if owner != nil && owner.Kind == "DaemonSet" {
			continue
		}
		key := p.Namespace + "/" + p.Name
		if owner == nil && !u.Spec.Drain.Force {
			unmanaged = append(unmanaged, key)
		}
		if hasEmptyDir(p) && !u.Spec.Drain.DeleteEmptyDirData {
			emptyDir = append(emptyDir, key)
		}
		left = append(left, key)
		if p.DeletionTimestamp == nil {
			evict = append(evict, p)
		}
	}
	switch {
	case len(unmanaged) > 0:
		return "", fmt.Errorf("pods no controller manages would not come back: %s (spec.drain.force evicts them)", strings.Join(unmanaged, ", "))
	case len(emptyDir) > 0:
		return "", fmt.Errorf("pods with emptyDir data would lose it: %s (spec.drain.deleteEmptyDirData evicts them)", strings.Join(emptyDir, ", "))
	}
	for _, p := range evict {
		err := c.client.Evict(ctx, p.Namespace, p.Name)
		switch {
		case err == nil, apierrors.IsNotFound(err):
		case apierrors.IsTooManyRequests(err):
			blocked = append(blocked, p.Namespace+"/"+p.Name+" ("+apiMessage(err)+")")
		default:
			return "", fmt.Errorf("evict %s/%s: %w", p.Namespace, p.Name, err)
		}
	}
	if len(left) == 0 {
		return "", nil
	}
	msg := fmt.Sprintf("waiting for %d pods to leave", len(left))
	if len(blocked) > 0 {
		msg += "; budgets hold " + strings.Join(blocked, ", ")
	}
	return msg, nil
}

func apiMessage(err error) string {
	if s, ok := err.(apierrors.APIStatus); ok {
		return s.Status().Message
	}
	return err.Error()
}

func hasEmptyDir(p *corev1.Pod) bool {
	return slices.ContainsFunc(p.Spec.Volumes, func(v corev1.Volume) bool { return v.EmptyDir != nil })
}
