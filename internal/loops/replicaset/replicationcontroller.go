package replicaset

import (
	"context"

	"github.com/orch-dev/orch/internal/kube"
	"github.com/orch-dev/orch/internal/loops/controller"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
)

// NewForReplicationControllers registers the loop that keeps
// ReplicationControllers: the ReplicaSet loop over each controller seen as
// the ReplicaSet it converts to (same name, uid and pods; its map selector
// as matchLabels), writing the status back to the controller.
func NewForReplicationControllers(client *kube.Client, factory *kube.Informers, recorder kube.EventRecorder, env controller.Env) (*Controller, error) {
	inf := factory.ReplicationControllers()
	rcs := inf.Lister()
	return newController(client, factory, recorder, env, "replicationcontroller", inf.Informer(), kind{
		gvk: corev1.SchemeGroupVersion.WithKind("ReplicationController"),
		get: func(ns, name string) (*appsv1.ReplicaSet, error) {
			rc, err := rcs.ReplicationControllers(ns).Get(name)
			if err != nil {
				return nil, err
			}
			return asReplicaSet(rc), nil
		},
		list: func(ns string) ([]*appsv1.ReplicaSet, error) {
			list, err := rcs.ReplicationControllers(ns).List(labels.Everything())
			out := make([]*appsv1.ReplicaSet, len(list))
			for i, rc := range list {
				out[i] = asReplicaSet(rc)
			}
			return out, err
		},
		writeStatus: func(ctx context.Context, set *appsv1.ReplicaSet) error {
			rc, err := rcs.ReplicationControllers(set.Namespace).Get(set.Name)
			if err != nil {
				return err
			}
			rc = rc.DeepCopy()
			rc.ResourceVersion = set.ResourceVersion
			rc.Status = asControllerStatus(set.Status)
			_, err = client.ReplicationControllers(set.Namespace).UpdateStatus(ctx, rc, metav1.UpdateOptions{})
			return err
		},
		original: func(set *appsv1.ReplicaSet) runtime.Object {
			return &corev1.ReplicationController{ObjectMeta: set.ObjectMeta}
		},
	})
}

// asReplicaSet is Kubernetes' conversion of a ReplicationController to a
// ReplicaSet, as its controller manager keeps one with the other's loop.
func asReplicaSet(rc *corev1.ReplicationController) *appsv1.ReplicaSet {
	rs := &appsv1.ReplicaSet{ObjectMeta: *rc.ObjectMeta.DeepCopy(), Spec: appsv1.ReplicaSetSpec{
		Replicas: rc.Spec.Replicas, MinReadySeconds: rc.Spec.MinReadySeconds,
		Selector: &metav1.LabelSelector{MatchLabels: rc.Spec.Selector},
	}, Status: appsv1.ReplicaSetStatus{
		Replicas: rc.Status.Replicas, FullyLabeledReplicas: rc.Status.FullyLabeledReplicas, ReadyReplicas: rc.Status.ReadyReplicas,
		AvailableReplicas: rc.Status.AvailableReplicas, ObservedGeneration: rc.Status.ObservedGeneration,
	}}
	if rc.Spec.Template != nil {
		rs.Spec.Template = *rc.Spec.Template.DeepCopy()
	}
	for _, c := range rc.Status.Conditions {
		rs.Status.Conditions = append(rs.Status.Conditions, appsv1.ReplicaSetCondition{Type: appsv1.ReplicaSetConditionType(c.Type),
			Status: c.Status, LastTransitionTime: c.LastTransitionTime, Reason: c.Reason, Message: c.Message})
	}
	return rs
}

func asControllerStatus(s appsv1.ReplicaSetStatus) corev1.ReplicationControllerStatus {
	out := corev1.ReplicationControllerStatus{Replicas: s.Replicas, FullyLabeledReplicas: s.FullyLabeledReplicas, ReadyReplicas: s.ReadyReplicas,
		AvailableReplicas: s.AvailableReplicas, ObservedGeneration: s.ObservedGeneration}
	for _, c := range s.Conditions {
		out.Conditions = append(out.Conditions, corev1.ReplicationControllerCondition{Type: corev1.ReplicationControllerConditionType(c.Type),
			Status: c.Status, LastTransitionTime: c.LastTransitionTime, Reason: c.Reason, Message: c.Message})
	}
	return out
}
