package kube

import (
	"context"
	"path"
	"strings"
	"sync"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
)

// Scales reads and writes the scale subresource of any kind that has one
// (Deployments, StatefulSets, custom resources with scale), found by kind
// through discovery: what the disruption loop and the autoscaler need of
// the workloads they look after.
type Scales struct {
	client *Client
	mu     sync.Mutex
	// known are the kinds found with a scale subresource; a kind missing
	// from its group's discovery is looked up again next time.
	known map[schema.GroupVersionKind]scaled
}

type scaled struct {
	plural     string
	namespaced bool
}

// NewScales makes a scale client.
func NewScales(c *Client) *Scales {
	return &Scales{client: c, known: map[schema.GroupVersionKind]scaled{}}
}

// Get reads the Scale of the named object of kind gvk; a kind that is not
// served, or has no scale subresource, is NotFound.
func (s *Scales) Get(ctx context.Context, gvk schema.GroupVersionKind, namespace, name string) (*autoscalingv1.Scale, error) {
	p, err := s.path(ctx, gvk, namespace, name)
	if err != nil {
		return nil, err
	}
	out := &autoscalingv1.Scale{}
	return out, s.client.core().Get().AbsPath(p).Do(ctx).Into(out)
}

// Update writes a Scale's spec.replicas back to the named object.
func (s *Scales) Update(ctx context.Context, gvk schema.GroupVersionKind, scale *autoscalingv1.Scale) (*autoscalingv1.Scale, error) {
	p, err := s.path(ctx, gvk, scale.Namespace, scale.Name)
	if err != nil {
		return nil, err
	}
	out := &autoscalingv1.Scale{}
	return out, s.client.core().Put().AbsPath(p).Body(scale).Do(ctx).Into(out)
}

func (s *Scales) path(ctx context.Context, gvk schema.GroupVersionKind, namespace, name string) (string, error) {
	plural, namespaced, err := s.resource(ctx, gvk)
	if err != nil {
		return "", err
	}
	p := "/apis/" + gvk.Group + "/" + gvk.Version
	if gvk.Group == "" {
		p = "/api/" + gvk.Version
	}
	if namespaced {
		p = path.Join(p, "namespaces", namespace)
	}
	return path.Join(p, plural, name, "scale"), nil
}

// resource finds the kind's plural and scope in its group version's
// discovery, and whether it serves scale.
func (s *Scales) resource(ctx context.Context, gvk schema.GroupVersionKind) (plural string, namespaced bool, err error) {
	s.mu.Lock()
	known, ok := s.known[gvk]
	s.mu.Unlock()
	if ok {
		return known.plural, known.namespaced, nil
	}
	p := "/apis/" + gvk.GroupVersion().String()
	if gvk.Group == "" {
		p = "/api/" + gvk.Version
	}
	var list metav1.APIResourceList
	if err := getJSON(ctx, s.client.core(), p, &list); err != nil {
		if apierrors.IsNotFound(err) {
			return "", false, apierrors.NewNotFound(schema.GroupResource{Group: gvk.Group, Resource: gvk.Kind}, "")
		}
		return "", false, err
	}
	hasScale := map[string]bool{}
	for _, r := range list.APIResources {
		if base, sub, ok := strings.Cut(r.Name, "/"); ok && sub == "scale" {
			hasScale[base] = true
		}
	}
	for _, r := range list.APIResources {
		if r.Kind == gvk.Kind && !strings.Contains(r.Name, "/") {
			if !hasScale[r.Name] {
				break
			}
			s.mu.Lock()
			s.known[gvk] = scaled{plural: r.Name, namespaced: r.Namespaced}
			s.mu.Unlock()
			return r.Name, r.Namespaced, nil
		}
	}
	return "", false, apierrors.NewNotFound(schema.GroupResource{Group: gvk.Group, Resource: gvk.Kind + "/scale"}, "")
}

// core is the client of the core group, whose requests may take any path.
func (c *Client) core() *rest.RESTClient { return c.groups[schema.GroupVersion{Version: "v1"}] }
