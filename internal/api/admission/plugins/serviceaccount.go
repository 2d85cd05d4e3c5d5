package plugins

import (
	"context"
	"fmt"
	"github.com/orch-dev/orch/internal/api/auth/satoken"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/utils/ptr"
)

// What a pod's API credentials are called and where they are mounted,
// as in Kubernetes.
const (
	apiAccessVolumePrefix = "kube-api-access-"
	apiAccessMountPath    = "/var/run/secrets/kubernetes.io/serviceaccount"
	// RootCAConfigMap is the ConfigMap every namespace has with the
	// cluster CA (key ca.crt), which the pods' credentials include.
	RootCAConfigMap = "kube-root-ca.crt"
)

// defaultAccountWait is how long a new pod waits for its namespace's
// default service account, which the service account loop makes just
// after the namespace: a pod created at once does not fail for it.
const defaultAccountWait = 3 * time.Second

// admitServiceAccount is Kubernetes' ServiceAccount admission for new
// pods: the service account must exist; its image pull secrets are the
// pod's when it names none; and, unless the pod or the account opts out
// (automountServiceAccountToken: false), every container gets the
// projected kube-api-access volume (a token the node asks for the pod,
// the cluster CA, the namespace) at
// /var/run/secrets/kubernetes.io/serviceaccount.
func (p *Plugins) admitServiceAccount(ctx context.Context, obj, old runtime.Object) error {
	pod := obj.(*corev1.Pod)
	if old != nil {
		return nil
	}
	if _, mirror := pod.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
		return nil // a static pod's mirror uses nothing from the API
	}
	name := pod.Spec.ServiceAccountName
	if name == "" {
		name = "default"
	}
	sa, err := p.serviceAccount(ctx, pod.Namespace, name)
	if err != nil {
		return apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, pod.Name,
			fmt.Errorf("error looking up service account %s/%s: %w", pod.Namespace, name, err))
	}
	if len(pod.Spec.ImagePullSecrets) == 0 {
		pod.Spec.ImagePullSecrets = append(pod.Spec.ImagePullSecrets, sa.ImagePullSecrets...)
	}
	automount := pod.Spec.AutomountServiceAccountToken
	if automount == nil {
		automount = sa.AutomountServiceAccountToken
	}
	if automount == nil || *automount {
		mountAPIAccess(pod)
	}
	return nil
}

// serviceAccount reads the named service account, waiting a little for
// a default one that is not made yet.
func (p *Plugins) serviceAccount(ctx context.Context, namespace, name string) (*corev1.ServiceAccount, error) {
	deadline := time.Now().Add(defaultAccountWait)
	for {
		obj, err := p.storage("", "serviceaccounts").Get(ctx, namespace, name)
		if err == nil {
			return obj.(*corev1.ServiceAccount), nil
		}
		if !apierrors.IsNotFound(err) || name != "default" || time.Now().After(deadline) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// mountAPIAccess adds the kube-api-access volume, unless the pod has
// one, and mounts it read-only in every container that has nothing
// mounted at its path.
func mountAPIAccess(pod *corev1.Pod) {
	volume := ""
	for _, v := range pod.Spec.Volumes {
		if strings.HasPrefix(v.Name, apiAccessVolumePrefix) {
			volume = v.Name
			break
		}
	}
	mountIn := func(containers []corev1.Container) {
		for i := range containers {
			c := &containers[i]
			has := false
			for _, m := range c.VolumeMounts {
				if m.MountPath == apiAccessMountPath {
					has = true
					break
				}
			}
			if has {
				continue
			}
			if volume == "" {
				volume = apiAccessVolumePrefix + utilrand.String(5)
				pod.Spec.Volumes = append(pod.Spec.Volumes, apiAccessVolume(volume))
			}
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: volume, ReadOnly: true, MountPath: apiAccessMountPath})
		}
	}
	mountIn(pod.Spec.InitContainers)
	mountIn(pod.Spec.Containers)
}

// apiAccessVolume is the projected volume Kubernetes gives a pod: its
// service account's token (3607 s, which the server extends to a year),
// the cluster CA and the namespace.
func apiAccessVolume(name string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{ExpirationSeconds: ptr.To[int64](satoken.ExtendedSeconds), Path: "token"}},
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: RootCAConfigMap},
				Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
			{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{
				{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}},
		},
		DefaultMode: ptr.To[int32](0o644),
	}}}
}
