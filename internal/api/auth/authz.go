package auth

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
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

// Pods looks up pods for the node authorizer.
type Pods interface {
	Get(ctx context.Context, namespace, name string) (*corev1.Pod, error)
	OnNode(ctx context.Context, node string) ([]*corev1.Pod, error)
}

// Authorizer decides requests.
type Authorizer struct {
	pods Pods
}

// NewAuthorizer returns an authorizer that asks pods for the node graph.
func NewAuthorizer(pods Pods) *Authorizer { return &Authorizer{pods: pods} }

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

// authorizeNode is the node authorizer's graph, checked against the API.
func (z *Authorizer) authorizeNode(ctx context.Context, node string, a Attributes) error {
	deny := func(why string) error { return fmt.Errorf("node %q %s", node, why) }
	if !a.IsResource {
		return nil
	}
	switch a.Group + "/" + a.Resource {
	case "/nodes":
		if readOnly(a.Verb) || a.Name == node || a.Verb == "create" {
			return nil
		}
		return deny("can only modify its own Node object")
	case "coordination.k8s.io/leases":
		if a.Namespace == corev1.NamespaceNodeLease && (a.Name == node || a.Verb == "create") {
			return nil
		}
		return deny("can only access its own Lease in " + corev1.NamespaceNodeLease)
	case "/pods":
		if readOnly(a.Verb) && a.Subresource == "" {
			return nil
		}
		if a.Verb == "create" && a.Subresource == "eviction" {
			return nil
		}
		if a.Name == "" || (a.Verb != "delete" && a.Subresource != "status") {
			return deny("can only delete pods bound to it and update their status")
		}
		pod, err := z.pods.Get(ctx, a.Namespace, a.Name)
		if err != nil || pod.Spec.NodeName != node {
			return deny(fmt.Sprintf("has no relationship with pod %s/%s", a.Namespace, a.Name))
		}
		return nil
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
	case "/secrets", "/configmaps":
		name := a.Name
		if name == "" && strings.HasPrefix(a.FieldSelector, "metadata.name=") && !strings.Contains(a.FieldSelector, ",") {
			name = strings.TrimPrefix(a.FieldSelector, "metadata.name=")
		}
		if !readOnly(a.Verb) || name == "" {
			return deny("can only get single " + a.Resource + " its pods use")
		}
		pods, err := z.pods.OnNode(ctx, node)
		if err != nil {
			return deny(err.Error())
		}
		for _, p := range pods {
			if p.Namespace == a.Namespace && references(p, a.Resource, name) {
				return nil
			}
		}
		return deny(fmt.Sprintf("has no relationship with %s %s/%s", strings.TrimSuffix(a.Resource, "s"), a.Namespace, name))
	}
	return deny(fmt.Sprintf("may not %s %s", a.Verb, a.Resource))
}

// references reports whether pod uses the secret or configmap name.
func references(pod *corev1.Pod, resource, name string) bool {
	secret := resource == "secrets"
	for _, s := range pod.Spec.ImagePullSecrets {
		if secret && s.Name == name {
			return true
		}
	}
	for _, v := range pod.Spec.Volumes {
		if secret && v.Secret != nil && v.Secret.SecretName == name || !secret && v.ConfigMap != nil && v.ConfigMap.Name == name {
			return true
		}
		if v.Projected != nil {
			for _, src := range v.Projected.Sources {
				if secret && src.Secret != nil && src.Secret.Name == name || !secret && src.ConfigMap != nil && src.ConfigMap.Name == name {
					return true
				}
			}
		}
	}
	containers := append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...)
	for _, c := range containers {
		for _, e := range c.EnvFrom {
			if secret && e.SecretRef != nil && e.SecretRef.Name == name || !secret && e.ConfigMapRef != nil && e.ConfigMapRef.Name == name {
				return true
			}
		}
		for _, e := range c.Env {
			if e.ValueFrom == nil {
				continue
			}
			if secret && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Name == name ||
				!secret && e.ValueFrom.ConfigMapKeyRef != nil && e.ValueFrom.ConfigMapKeyRef.Name == name {
				return true
			}
		}
	}
	return false
}
