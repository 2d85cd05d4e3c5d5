package plugins

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/orch-dev/orch/internal/api/auth"
	"github.com/orch-dev/orch/internal/api/auth/nodegraph"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kubeletapis "k8s.io/kubelet/pkg/apis"
)

// nodeRestriction is Kubernetes' NodeRestriction admission for what a
// node's credentials write: its own Node only, with only the labels a
// kubelet may set and no change to its taints once registered; its own
// Lease; and, of pods, only mirror pods bound to itself. Everything else
// a node may do the node authorizer has already narrowed.
func nodeRestriction(gr schema.GroupResource) Func {
	return func(ctx context.Context, obj, old runtime.Object) error {
		u, ok := auth.UserFrom(ctx)
		if !ok || !u.InGroup(auth.GroupNodes) || !strings.HasPrefix(u.Name, auth.NodeUserPrefix) {
			return nil
		}
		node := strings.TrimPrefix(u.Name, auth.NodeUserPrefix)
		forbid := func(format string, args ...any) error {
			name := ""
			if m, ok := obj.(interface{ GetName() string }); ok {
				name = m.GetName()
			}
			return apierrors.NewForbidden(gr, name, fmt.Errorf(format, args...))
		}
		switch o := obj.(type) {
		case *corev1.Node:
			if o.Name != node {
				return forbid("node %q is not allowed to modify node %q", node, o.Name)
			}
			var oldLabels map[string]string
			if prev, ok := old.(*corev1.Node); ok {
				oldLabels = prev.Labels
				if !apiequality.Semantic.DeepEqual(o.Spec.Taints, prev.Spec.Taints) {
					return forbid("node %q is not allowed to modify taints", node)
				}
			}
			if bad := forbiddenNodeLabels(o.Labels, oldLabels); len(bad) > 0 {
				return forbid("node %q is not allowed to modify labels: %s", node, strings.Join(bad, ", "))
			}
		case *coordinationv1.Lease:
			if o.Namespace != corev1.NamespaceNodeLease || o.Name != node {
				return forbid("node %q can only access its own lease in %s", node, corev1.NamespaceNodeLease)
			}
		case *corev1.Pod:
			if old != nil {
				return nil // the authorizer allowed only the status of a pod bound to it
			}
			return admitMirrorPod(node, o, forbid)
		}
		return nil
	}
}

// admitMirrorPod allows a node to create only a mirror pod of a static
// pod, bound to itself and using nothing from the API, as Kubernetes does.
func admitMirrorPod(node string, pod *corev1.Pod, forbid func(string, ...any) error) error {
	if _, ok := pod.Annotations[corev1.MirrorPodAnnotationKey]; !ok {
		return forbid("pod does not have %q annotation, node %q can only create mirror pods", corev1.MirrorPodAnnotationKey, node)
	}
	if pod.Spec.NodeName != node {
		return forbid("node %q can only create pods with spec.nodeName set to itself", node)
	}
	for _, ref := range pod.OwnerReferences {
		if ref.APIVersion != "v1" || ref.Kind != "Node" || ref.Name != node {
			return forbid("node %q can only create pods with an owner reference set to itself", node)
		}
	}
	if pod.Spec.ServiceAccountName != "" && pod.Spec.ServiceAccountName != "default" || pod.Spec.ServiceAccountName == "default" && pod.Spec.AutomountServiceAccountToken != nil && *pod.Spec.AutomountServiceAccountToken {
		return forbid("node %q can not create pods that reference a service account", node)
	}
	for _, u := range nodegraph.PodReferences(pod) {
		if u.Resource != "serviceaccounts" { // the default one, checked above
			return forbid("node %q can not create pods that reference %s %q", node, strings.TrimSuffix(u.Resource, "s"), u.Name)
		}
	}
	return nil
}

// labelNamespace is a label key's prefix, the part before its slash.
func labelNamespace(key string) string {
	if ns, _, ok := strings.Cut(key, "/"); ok {
		return ns
	}
	return ""
}

// kubernetesLabel reports whether a label is in Kubernetes' own
// namespaces, kubernetes.io and k8s.io, where a kubelet may set only some.
func kubernetesLabel(key string) bool {
	ns := labelNamespace(key)
	return ns == "kubernetes.io" || strings.HasSuffix(ns, ".kubernetes.io") || ns == "k8s.io" || strings.HasSuffix(ns, ".k8s.io")
}

func nodeRestrictionLabel(key string) bool {
	ns := labelNamespace(key)
	return ns == "node-restriction.kubernetes.io" || strings.HasSuffix(ns, ".node-restriction.kubernetes.io")
}

// forbiddenNodeLabels are the labels a node added, changed or removed
// that it may not: node-restriction.kubernetes.io ones, and kubernetes.io
// or k8s.io ones a kubelet does not set (node-role.kubernetes.io/...).
func forbiddenNodeLabels(labels, old map[string]string) []string {
	var bad []string
	check := func(key string) {
		if nodeRestrictionLabel(key) || kubernetesLabel(key) && !kubeletapis.IsKubeletLabel(key) {
			bad = append(bad, key)
		}
	}
	for k, v := range labels {
		if ov, ok := old[k]; !ok || ov != v {
			check(k)
		}
	}
	for k := range old {
		if _, ok := labels[k]; !ok {
			check(k)
		}
	}
	slices.Sort(bad)
	return bad
}
