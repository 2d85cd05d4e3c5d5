package auth

import (
	"context"
	"fmt"
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
}

// Authorizer decides requests.
type Authorizer struct {
	graph Graph
}

// NewAuthorizer returns an authorizer that asks graph about nodes' pods.
func NewAuthorizer(graph Graph) *Authorizer { return &Authorizer{graph: graph} }

// Authorize returns nil if u may do a, or the reason it may not.
func (z *Authorizer) Authorize(ctx context.Context, u User, a Attributes) error {
	switch {
	case u.InGroup(GroupMasters), u.Name == LoopsUser:
		return nil
	case u.InGroup(GroupNodes) && strings.HasPrefix(u.Name, NodeUserPrefix):
		return z.authorizeNode(ctx, strings.TrimPrefix(u.Name, NodeUserPrefix), a)
	}
	if !a.IsResource {
		switch a.Path {
		case "/api", "/apis", "/version", "/healthz", "/livez", "/readyz", "/openapi/v2", "/openapi/v3":
			return nil
		}
		if strings.HasPrefix(a.Path, "/api/") || strings.HasPrefix(a.Path, "/apis/") || strings.HasPrefix(a.Path, "/openapi/") {
			return nil // discovery is open to every authenticated user, as in Kubernetes
		}
	}
	return fmt.Errorf("RBAC is not enabled yet: only system:masters and nodes are authorized")
}

func readOnly(verb string) bool { return verb == "get" || verb == "list" || verb == "watch" }

// authorizeNode is Kubernetes' node authorizer with selector
// authorization (1.32+), and the rules its system:node role adds: a node
// reads its own Node, lists and watches pods only with
// spec.nodeName=<itself>, gets pods bound to it and the secrets,
// configmaps and claims they use, and writes its own Node, Lease, pod
// statuses, mirror pods and events. What a node may write into those
// objects is NodeRestriction admission's to check.
func (z *Authorizer) authorizeNode(ctx context.Context, node string, a Attributes) error {
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
	case "/services", "/endpoints", "discovery.k8s.io/endpointslices":
		if readOnly(a.Verb) {
			return nil
		}
		return deny("can only read " + a.Resource)
	case "/secrets", "/configmaps", "/persistentvolumeclaims":
		name := a.Name
		if name == "" && (a.Verb == "list" || a.Verb == "watch") {
			name, _ = selected(a.FieldSelector, "metadata.name")
		}
		if !readOnly(a.Verb) || name == "" {
			return deny("can only get single " + a.Resource + " its pods use")
		}
		uses, err := z.graph.Uses(ctx, node, a.Resource, a.Namespace, name)
		if err != nil {
			return deny(err.Error())
		}
		if !uses {
			return deny(fmt.Sprintf("has no relationship with %s %s/%s", strings.TrimSuffix(a.Resource, "s"), a.Namespace, name))
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
