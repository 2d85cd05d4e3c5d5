package podautoscaler

import (
	"context"

	"github.com/orch-dev/orch/internal/kube"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
)

// InformerScales reads the scale of the built-in workloads from the shared
// informers the other loops keep anyway, and any other kind's, and every
// write, through the API's scale subresource. A read costs no request:
// 1,000 autoscalers would otherwise ask the API server a thousand times a
// period for what the loops already hold.
type InformerScales struct {
	API          *kube.Scales
	deployments  appslisters.DeploymentLister
	replicaSets  appslisters.ReplicaSetLister
	statefulSets appslisters.StatefulSetLister
	rcs          corelisters.ReplicationControllerLister
}

// NewInformerScales reads through factory's informers, falling back to api.
func NewInformerScales(factory *kube.Informers, api *kube.Scales) *InformerScales {
	return &InformerScales{API: api, deployments: factory.Deployments().Lister(), replicaSets: factory.ReplicaSets().Lister(),
		statefulSets: factory.StatefulSets().Lister(), rcs: factory.ReplicationControllers().Lister()}
}

// Get implements ScaleTargets.
func (s *InformerScales) Get(ctx context.Context, gvk schema.GroupVersionKind, ns, name string) (*autoscalingv1.Scale, error) {
	var (
		meta     metav1.ObjectMeta
		desired  *int32
		current  int32
		selector *metav1.LabelSelector
	)
	switch {
	case gvk.Group == appsv1.GroupName && gvk.Version == "v1" && gvk.Kind == "Deployment":
		d, err := s.deployments.Deployments(ns).Get(name)
		if err != nil {
			return nil, err
		}
		meta, desired, current, selector = d.ObjectMeta, d.Spec.Replicas, d.Status.Replicas, d.Spec.Selector
	case gvk.Group == appsv1.GroupName && gvk.Version == "v1" && gvk.Kind == "ReplicaSet":
		rs, err := s.replicaSets.ReplicaSets(ns).Get(name)
		if err != nil {
			return nil, err
		}
		meta, desired, current, selector = rs.ObjectMeta, rs.Spec.Replicas, rs.Status.Replicas, rs.Spec.Selector
	case gvk.Group == appsv1.GroupName && gvk.Version == "v1" && gvk.Kind == "StatefulSet":
		ss, err := s.statefulSets.StatefulSets(ns).Get(name)
		if err != nil {
			return nil, err
		}
		meta, desired, current, selector = ss.ObjectMeta, ss.Spec.Replicas, ss.Status.Replicas, ss.Spec.Selector
	case gvk.Group == "" && gvk.Version == "v1" && gvk.Kind == "ReplicationController":
		rc, err := s.rcs.ReplicationControllers(ns).Get(name)
		if err != nil {
			return nil, err
		}
		meta, desired, current, selector = rc.ObjectMeta, rc.Spec.Replicas, rc.Status.Replicas, &metav1.LabelSelector{MatchLabels: rc.Spec.Selector}
	default:
		return s.API.Get(ctx, gvk, ns, name)
	}
	out := &autoscalingv1.Scale{ObjectMeta: metav1.ObjectMeta{Name: meta.Name, Namespace: meta.Namespace, UID: meta.UID,
		CreationTimestamp: meta.CreationTimestamp}, Status: autoscalingv1.ScaleStatus{Replicas: current}}
	out.Spec.Replicas = 1
	if desired != nil {
		out.Spec.Replicas = *desired
	}
	if selector != nil {
		if sel, err := metav1.LabelSelectorAsSelector(selector); err == nil {
			out.Status.Selector = sel.String()
		}
	}
	return out, nil
}

// Update implements ScaleTargets: through the API, for the replicas only
// (what the autoscaler decided on the replicas it read, whatever else
// changed since).
func (s *InformerScales) Update(ctx context.Context, gvk schema.GroupVersionKind, scale *autoscalingv1.Scale) (*autoscalingv1.Scale, error) {
	scale = scale.DeepCopy()
	scale.ResourceVersion = ""
	return s.API.Update(ctx, gvk, scale)
}
