package plugins

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
)

// admitRuntimeClass is Kubernetes' RuntimeClass admission for a new pod:
// the RuntimeClass it names must exist; its overhead becomes the pod's
// spec.overhead (which the scheduler and quota add to the pod's requests);
// its scheduling constraints join the pod's node selector (refused on a
// conflict) and tolerations.
func (p *Plugins) admitRuntimeClass(ctx context.Context, obj, old runtime.Object) error {
	if old != nil {
		return nil
	}
	pod := obj.(*corev1.Pod)
	reject := func(format string, args ...any) error {
		return apierrors.NewForbidden(corev1.Resource("pods"), pod.Name, fmt.Errorf("pod rejected: "+format, args...))
	}
	if pod.Spec.RuntimeClassName == nil || *pod.Spec.RuntimeClassName == "" {
		if pod.Spec.Overhead != nil {
			return reject("Pod Overhead set without corresponding RuntimeClass")
		}
		return nil
	}
	name := *pod.Spec.RuntimeClassName
	got, err := p.storage("node.k8s.io", "runtimeclasses").Get(ctx, "", name)
	if apierrors.IsNotFound(err) {
		return reject("RuntimeClass %q not found", name)
	}
	if err != nil {
		return err
	}
	rc := got.(*nodev1.RuntimeClass)
	switch {
	case rc.Overhead != nil && pod.Spec.Overhead != nil && !apiequality.Semantic.DeepEqual(rc.Overhead.PodFixed, pod.Spec.Overhead):
		return reject("Pod's Overhead doesn't match RuntimeClass's defined Overhead")
	case rc.Overhead != nil:
		pod.Spec.Overhead = rc.Overhead.PodFixed.DeepCopy()
	case pod.Spec.Overhead != nil:
		return reject("RuntimeClass %q does not define Overhead, but Pod's Overhead is set", name)
	}
	if rc.Scheduling == nil {
		return nil
	}
	for k, v := range rc.Scheduling.NodeSelector {
		if have, ok := pod.Spec.NodeSelector[k]; ok && have != v {
			return reject("conflict: runtimeClass.scheduling.nodeSelector[%s] = %s; pod.spec.nodeSelector[%s] = %s", k, v, k, have)
		}
		if pod.Spec.NodeSelector == nil {
			pod.Spec.NodeSelector = map[string]string{}
		}
		pod.Spec.NodeSelector[k] = v
	}
	for _, t := range rc.Scheduling.Tolerations {
		dup := false
		for _, have := range pod.Spec.Tolerations {
			dup = dup || apiequality.Semantic.DeepEqual(have, t)
		}
		if !dup {
			pod.Spec.Tolerations = append(pod.Spec.Tolerations, t)
		}
	}
	return nil
}
