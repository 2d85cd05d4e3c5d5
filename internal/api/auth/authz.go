package auth

import (
	"context"
	"errors"
	"fmt"
	"github.com/orch-dev/orch/internal/gatewayapi"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/selection"
)

// Attributes are what a request asks to do.
type Attributes struct {
	Verb        string
	Group       string
	Namespace   string
	Resource    string
	Subresource string
	Name        string
	// FieldSelector of a list or watch: a node may watch one secret by name.
	FieldSelector string
	IsResource    bool
	Path          string
}

// Graph answers the node authorizer's questions about pods: which node
// a pod is bound to, and whether a pod on a node uses an object.
type Graph interface {
	PodNode(ctx context.Context, namespace, name string) (string, error)
	Uses(ctx context.Context, node, resource, namespace, name string) (bool, error)
	// UsesVolume: a pod on node uses the claim the volume is bound to.
	UsesVolume(ctx context.Context, node, pv string) (bool, error)
	// ServesSecret: an Ingress the nodes serve names the Secret for TLS.
	ServesSecret(ctx context.Context, namespace, name string) (bool, error)
}

// Decision is what one rule of the chain says about a request.
type Decision int

// The decisions, as Kubernetes' authorizers give them: the first Allow or
// Deny in the chain decides; NoOpinion passes the request on.
const (
	NoOpinion Decision = iota
	Allow
	Deny
)

// Rule is one authorizer of the chain. why explains a Deny, or what a
// NoOpinion would not allow (the answer if no later rule allows it).
type Rule interface {
	Decide(ctx context.Context, u User, a Attributes) (d Decision, why string)
}

// RuleFunc is a Rule.
type RuleFunc func(ctx context.Context, u User, a Attributes) (Decision, string)

// Decide implements Rule.
func (f RuleFunc) Decide(ctx context.Context, u User, a Attributes) (Decision, string) {
	return f(ctx, u, a)
}

// Authorizer decides requests by a chain of rules, as kube-apiserver's
// union of authorizers: the privileged (system:masters and the server's
// own loops), the node authorizer, then whatever is added (RBAC).
type Authorizer struct {
	rules []Rule
}

// NewAuthorizer returns the built-in chain, asking graph about nodes'
// pods, followed by extra rules.
func NewAuthorizer(graph Graph, extra ...Rule) *Authorizer {
	nodes := &nodeAuthorizer{graph: graph}
	return &Authorizer{rules: append([]Rule{RuleFunc(masters), nodes}, extra...)}
}

// Authorize returns nil if u may do a, or the reason it may not (which
// may be empty: RBAC does not say why it grants nothing).
func (z *Authorizer) Authorize(ctx context.Context, u User, a Attributes) error {
	if d, why := z.Decide(ctx, u, a); d != Allow {
		return errors.New(why)
	}
	return nil
}

// Decide is the chain's decision on a, with the reasons of the rules
// that had none to give.
func (z *Authorizer) Decide(ctx context.Context, u User, a Attributes) (Decision, string) {
	var reasons []string
	for _, r := range z.rules {
		switch d, why := r.Decide(ctx, u, a); d {
		case Allow:
			return Allow, ""
		case Deny:
			return Deny, why
		default:
			if why != "" {
				reasons = append(reasons, why)
			}
		}
	}
	return NoOpinion, strings.Join(reasons, "; ")
}

// Privileged says whether u may do anything, RBAC's escalation checks
// included: system:masters, Kubernetes' privileged group. The loops'
// identity is not: RBAC gives it its role.
func Privileged(u User) bool { return u.InGroup(GroupMasters) }

// masters allows the privileged everything.
func masters(_ context.Context, u User, _ Attributes) (Decision, string) {
	if Privileged(u) {
		return Allow, ""
	}
	return NoOpinion, ""
}

// nodeAuthorizer is the chain's node rule: it allows what a kubelet may
// do, and has no opinion on the rest (nor on users who are not nodes).
type nodeAuthorizer struct {
	graph Graph
}

func (z *nodeAuthorizer) Decide(ctx context.Context, u User, a Attributes) (Decision, string) {
	if !u.InGroup(GroupNodes) || !strings.HasPrefix(u.Name, NodeUserPrefix) {
		return NoOpinion, ""
	}
	if err := z.authorizeNode(ctx, strings.TrimPrefix(u.Name, NodeUserPrefix), a); err != nil {
		return NoOpinion, err.Error()
	}
	return Allow, ""
}

func readOnly(verb string) bool { return verb == "get" || verb == "list" || verb == "watch" }

// authorizeNode is Kubernetes' node authorizer with selector
// authorization (1.32+), and the rules its system:node role adds: a node
// reads its own Node, lists and watches pods only with
// spec.nodeName=<itself>, gets pods bound to it and the secrets,
// configmaps and claims they use, and writes its own Node, Lease, pod
// statuses, mirror pods and events, and asks for certificates
// (CertificateSigningRequests). What a node may write into those
// objects is NodeRestriction admission's to check.
func (z *nodeAuthorizer) authorizeNode(ctx context.Context, node string, a Attributes) error {
	deny := func(why string) error { return fmt.Errorf("node %q %s", node, why) }
	if !a.IsResource {
		return nil
	}
	switch a.Group + "/" + a.Resource {
	case "/nodes":
		switch {
		case a.Verb == "create" && a.Subresource == "":
			return nil // NodeRestriction: only its own
		case a.Verb == "list" || a.Verb == "watch":
			if selectsOnly(a.FieldSelector, "metadata.name", node) {
				return nil
			}
			return deny("can only list and watch its own Node (fieldSelector metadata.name=" + node + ")")
		case a.Verb == "delete" || a.Verb == "deletecollection":
			return deny("may not delete nodes")
		case a.Subresource == "proxy":
			return deny("may not proxy to nodes")
		case a.Name == node:
			return nil
		}
		return deny("can only read and modify its own Node object")
	case "coordination.k8s.io/leases":
		if a.Namespace == corev1.NamespaceNodeLease && (a.Name == node || a.Verb == "create") && a.Verb != "list" && a.Verb != "watch" && a.Verb != "deletecollection" {
			return nil
		}
		return deny("can only access its own Lease in " + corev1.NamespaceNodeLease)
	case "/pods":
		switch {
		case a.Verb == "list" || a.Verb == "watch":
			if a.Subresource == "" && selectsOnly(a.FieldSelector, "spec.nodeName", node) {
				return nil
			}
			return deny("can only list and watch pods with fieldSelector spec.nodeName=" + node)
		case a.Verb == "create" && a.Subresource == "":
			return nil // NodeRestriction: only mirror pods bound to it
		case a.Name == "":
			return deny("may not " + a.Verb + " pods")
		case a.Verb == "get" && a.Subresource == "",
			a.Verb == "delete" && a.Subresource == "",
			(a.Verb == "update" || a.Verb == "patch") && a.Subresource == "status",
			a.Verb == "create" && a.Subresource == "eviction":
			bound, err := z.graph.PodNode(ctx, a.Namespace, a.Name)
			if err != nil {
				return deny(err.Error())
			}
			if bound != node {
				return deny(fmt.Sprintf("has no relationship with pod %s/%s", a.Namespace, a.Name))
			}
			return nil
		}
		return deny("can only read and delete pods bound to it, update their status and evict them")
	case "/events", "events.k8s.io/events":
		if a.Verb == "create" || a.Verb == "update" || a.Verb == "patch" {
			return nil
		}
		return deny("can only write events")
	case "/services", "/endpoints", "discovery.k8s.io/endpointslices", "node.k8s.io/runtimeclasses",
		// Every node serves the Ingresses of orch's classes.
		"networking.k8s.io/ingresses", "networking.k8s.io/ingressclasses":
		if readOnly(a.Verb) {
			return nil
		}
		return deny("can only read " + a.Resource)
	case "/serviceaccounts":
		// The kubelet reads the service accounts of its pods and asks
		// tokens for them (NodeRestriction binds each to one of its pods).
		readsAccount := a.Verb == "get" && a.Subresource == ""
		asksToken := a.Verb == "create" && a.Subresource == "token"
		if a.Name == "" || !readsAccount && !asksToken {
			return deny("can only get the service accounts its pods use, and create their tokens")
		}
		uses, err := z.graph.Uses(ctx, node, a.Resource, a.Namespace, a.Name)
		if err != nil {
			return deny(err.Error())
		}
		if !uses {
			return deny(fmt.Sprintf("has no relationship with serviceaccount %s/%s", a.Namespace, a.Name))
		}
		return nil
	case "/secrets", "/configmaps", "/persistentvolumeclaims":
		name := a.Name
		if name == "" && (a.Verb == "list" || a.Verb == "watch") {
			name, _ = selected(a.FieldSelector, "metadata.name")
		}
		if !readOnly(a.Verb) || name == "" {
			return deny("can only get single " + a.Resource + " its pods use")
		}
		if a.Resource == "configmaps" && a.Namespace == gatewayapi.ConfigNamespace && name == gatewayapi.ConfigName {
			return nil // every node serves the Gateways orch resolves
		}
		uses, err := z.graph.Uses(ctx, node, a.Resource, a.Namespace, name)
		if err == nil && !uses && a.Resource == "secrets" {
			// Every node is the ingress controller of orch's classes.
			uses, err = z.graph.ServesSecret(ctx, a.Namespace, name)
		}
		if err != nil {
			return deny(err.Error())
		}
		if !uses {
			return deny(fmt.Sprintf("has no relationship with %s %s/%s", strings.TrimSuffix(a.Resource, "s"), a.Namespace, name))
		}
		return nil
	case "certificates.k8s.io/podcertificaterequests":
		// The kubelet asks certificates for its pods' podCertificate
		// volumes (NodeRestriction: only for its own pods) and watches
		// its requests.
		switch {
		case a.Verb == "create" && a.Subresource == "", a.Verb == "get" && a.Subresource == "":
			return nil
		case (a.Verb == "list" || a.Verb == "watch") && selectsOnly(a.FieldSelector, "spec.nodeName", node):
			return nil
		}
		return deny("can only create podcertificaterequests and read its own (fieldSelector spec.nodeName=" + node + ")")
	case "certificates.k8s.io/clustertrustbundles":
		// The kubelet projects them into pods (clusterTrustBundle).
		if readOnly(a.Verb) {
			return nil
		}
		return deny("can only read clustertrustbundles")
	case "certificates.k8s.io/certificatesigningrequests":
		// A kubelet asks for its client and serving certificates;
		// NodeRestriction lets it ask only for its own names.
		if a.Subresource == "" && (a.Verb == "create" || readOnly(a.Verb)) {
			return nil
		}
		return deny("can only create and read certificatesigningrequests")
	case "/persistentvolumes":
		if a.Verb != "get" || a.Name == "" {
			return deny("can only get single persistentvolumes its pods' claims are bound to")
		}
		uses, err := z.graph.UsesVolume(ctx, node, a.Name)
		if err != nil {
			return deny(err.Error())
		}
		if !uses {
			return deny(fmt.Sprintf("has no relationship with persistentvolume %s", a.Name))
		}
		return nil
	}
	return deny(fmt.Sprintf("may not %s %s", a.Verb, a.Resource))
}

// selected is the value a field selector requires of field, when it is
// the selector's only requirement and an equality.
func selected(selector, field string) (string, bool) {
	sel, err := fields.ParseSelector(selector)
	if err != nil {
		return "", false
	}
	reqs := sel.Requirements()
	if len(reqs) != 1 || reqs[0].Field != field || reqs[0].Operator != selection.Equals && reqs[0].Operator != selection.DoubleEquals {
		return "", false
	}
	return reqs[0].Value, true
}

// selectsOnly reports whether selector requires field=value (other
// requirements may narrow it further).
func selectsOnly(selector, field, value string) bool {
	sel, err := fields.ParseSelector(selector)
	if err != nil {
		return false
	}
	v, ok := sel.RequiresExactMatch(field)
	return ok && v == value
}
