package agent

import (
	"context"
	"log/slog"
	"path/filepath"

	"github.com/orch-dev/orch/internal/agent/pods"
	"github.com/orch-dev/orch/internal/iptables"
	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/netproxy/netpolicy"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// nodePolicies is the node's NetworkPolicy engine and its informers,
// which read every pod, namespace and policy with the service proxy's
// identity (kube-router's rights in k3s).
type nodePolicies struct {
	engine    *netpolicy.Engine
	informers *kube.Informers
	log       *slog.Logger
}

// networkPolicies makes the node's engine; nil when the node leaves
// policies to another enforcer or has no iptables.
func networkPolicies(client *kube.Client, cfg Config, log *slog.Logger) *nodePolicies {
	if cfg.DisableNetworkPolicy {
		return nil
	}
	ipt, err := iptables.IPv4()
	if err != nil {
		log.Error("no iptables: NetworkPolicies are not enforced on this node", "err", err)
		return nil
	}
	informers := kube.NewInformers(client, 0)
	e, err := netpolicy.New(netpolicy.Config{Informers: informers, IPTables: ipt, NodeName: cfg.NodeName, Logger: log,
		StatePath: filepath.Join(cfg.DataDir, "agent", "netpolicy.json")})
	if err != nil {
		log.Error("network policy", "err", err)
		return nil
	}
	return &nodePolicies{engine: e, informers: informers, log: log}
}

// run keeps the rules until ctx ends; they stay after it, as the
// service proxy's do. A kernel that cannot enforce is said on the Node:
// its pods that a policy selects do not start (Admit says why).
func (n *nodePolicies) run(ctx context.Context, events kube.EventRecorder, node string) {
	ensureBridgeNetfilter(n.log) // the pods' bridged traffic must pass the rules
	if err := netpolicy.KernelSupport(); err != nil {
		n.log.Error("NetworkPolicies cannot be enforced on this node: pods a policy selects will not start", "err", err)
		events.Eventf(pods.NodeRef(node), nil, corev1.EventTypeWarning, "NetworkPolicyUnenforceable", "Enforce", "NetworkPolicies cannot be enforced here: %v", err)
	}
	n.informers.Start(ctx)
	defer n.informers.Shutdown()
	n.engine.Run(ctx)
}

// policer is the engine as the pod manager asks it; nil without one.
func (n *nodePolicies) policer() pods.Policer {
	if n == nil {
		return nil
	}
	return n.engine
}

// NodeNetworkPolicyUnavailable is the Node condition that says whether
// the node can enforce NetworkPolicies (True: it cannot), as
// NetworkUnavailable says whether its pod network is there.
const NodeNetworkPolicyUnavailable corev1.NodeConditionType = "NetworkPolicyUnavailable"

// networkPolicyCondition is the node's NetworkPolicyUnavailable
// condition from check (netpolicy.KernelSupport); none for a node that
// leaves policies to another enforcer.
func networkPolicyCondition(cfg Config, check func() error) (corev1.NodeCondition, bool) {
	if cfg.DisableNetworkPolicy {
		return corev1.NodeCondition{}, false
	}
	now := metav1.Now()
	c := corev1.NodeCondition{Type: NodeNetworkPolicyUnavailable, Status: corev1.ConditionFalse, Reason: "NetworkPolicyEnforced",
		Message: "the node enforces NetworkPolicies for its pods", LastHeartbeatTime: now, LastTransitionTime: now}
	if err := check(); err != nil {
		c.Status, c.Reason, c.Message = corev1.ConditionTrue, "NetworkPolicyUnenforceable", err.Error()+": pods a NetworkPolicy selects do not start here"
	}
	return c, true
}
