package api

import (
	"context"

	"github.com/orch-dev/orch/internal/api/resources/storage"
	"github.com/orch-dev/orch/internal/ingressclass"
	"github.com/orch-dev/orch/internal/localpath"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// localPathClass makes the local-path StorageClass, default and binding
// on first use (the volume goes where the pod is scheduled), as k3s
// ships it; unless --disable local-storage. One the user changed is
// kept; one deleted comes back at the next start, as with k3s.
func (s *Server) localPathClass(ctx context.Context) error {
	if s.cfg.DisableLocalStorage {
		return nil
	}
	sc := &storagev1.StorageClass{
		ObjectMeta:  metav1.ObjectMeta{Name: localpath.ClassName, Annotations: map[string]string{storage.DefaultClassAnnotation: "true"}},
		Provisioner: localpath.Provisioner, ReclaimPolicy: ptr.To(corev1.PersistentVolumeReclaimDelete),
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
	}
	return createIfMissing(ctx, s.storage(storagev1.GroupName, "storageclasses"), sc)
}

// RemoveLocalVolume asks the named node's agent to remove the data of a
// deleted local-path volume (the volume loop's, before it deletes the
// volume).
func (s *Server) RemoveLocalVolume(ctx context.Context, nodeName, pv string) error {
	obj, err := s.storage("", "nodes").Get(ctx, "", nodeName)
	if err != nil {
		return err
	}
	return s.kubelets.RemoveLocalVolume(ctx, obj.(*corev1.Node), pv)
}

// ingressClass makes the IngressClass the nodes' ingress proxies serve,
// marked default, as k3s's Traefik chart makes its class; unless
// --disable ingress. One the user changed (unmarked) is kept; one
// deleted comes back at the next start.
func (s *Server) ingressClass(ctx context.Context) error {
	if s.cfg.DisableIngress {
		return nil
	}
	c := &networkingv1.IngressClass{
		ObjectMeta: metav1.ObjectMeta{Name: ingressclass.Name, Annotations: map[string]string{networkingv1.AnnotationIsDefaultIngressClass: "true"}},
		Spec:       networkingv1.IngressClassSpec{Controller: ingressclass.Controller},
	}
	return createIfMissing(ctx, s.storage(networkingv1.GroupName, "ingressclasses"), c)
}
