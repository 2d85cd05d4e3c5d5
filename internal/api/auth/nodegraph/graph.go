// Package nodegraph is what the node authorizer knows of pods and claims:
// which node each pod is bound to and what the pods of a node use, kept
// from watches as Kubernetes' node authorizer keeps its graph, so that a
// node reading a Secret costs a map lookup instead of a list of pods.
package nodegraph

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Graph is what the node authorizer asks about pods: the node each
// pod is bound to, and the secrets, configmaps and claims the pods on a
// node use (and, for service-account tokens, every pod's UID). It is kept from one watch of pods, as Kubernetes' node
// authorizer keeps its graph, so that a node's every GET of a Secret is a
// map lookup instead of a list of every pod.
type Graph struct {
	mu     sync.RWMutex
	pods   map[Ref]boundPod
	refs   map[nodeRef]int // how many of the node's pods use each object
	synced chan struct{}
}

// Ref names a namespaced object: a pod, or what a pod uses.
type Ref struct{ Resource, Namespace, Name string }

type nodeRef struct {
	node string
	Ref
}

// boundPod is one pod's place in the graph (node is empty until it is
// scheduled), and what a token bound to it checks.
type boundPod struct {
	node    string
	uses    []Ref
	uid     string
	deleted time.Time // its deletionTimestamp, zero when not being deleted
}

// NewGraph is empty until its first list.
func NewGraph() *Graph {
	return &Graph{pods: map[Ref]boundPod{}, refs: map[nodeRef]int{}, synced: make(chan struct{})}
}

// Replace implements the API server's follower: the graph becomes that of pods, built
// aside then swapped in whole.
func (g *Graph) Replace(pods []runtime.Object) {
	fresh := NewGraph()
	for _, p := range pods {
		fresh.set(p.(*corev1.Pod))
	}
	g.swap(fresh)
}

// Set implements the API server's follower.
func (g *Graph) Set(pod runtime.Object) { g.set(pod.(*corev1.Pod)) }

// Delete implements the API server's follower.
func (g *Graph) Delete(obj runtime.Object) {
	pod := obj.(*corev1.Pod)
	g.remove(Ref{"pods", pod.Namespace, pod.Name})
}

// swap takes the contents of a graph built from a fresh list.
func (g *Graph) swap(fresh *Graph) {
	g.mu.Lock()
	g.pods, g.refs = fresh.pods, fresh.refs
	g.mu.Unlock()
	select {
	case <-g.synced:
	default:
		close(g.synced)
	}
}

func (g *Graph) set(pod *corev1.Pod) {
	key := Ref{"pods", pod.Namespace, pod.Name}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.removeLocked(key)
	b := boundPod{node: pod.Spec.NodeName, uid: string(pod.UID)}
	if pod.DeletionTimestamp != nil {
		b.deleted = pod.DeletionTimestamp.Time
	}
	if b.node != "" {
		b.uses = PodReferences(pod)
	}
	g.pods[key] = b
	for _, u := range b.uses {
		g.refs[nodeRef{b.node, u}]++
	}
}

func (g *Graph) remove(key Ref) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.removeLocked(key)
}

func (g *Graph) removeLocked(key Ref) {
	b, ok := g.pods[key]
	if !ok {
		return
	}
	delete(g.pods, key)
	for _, u := range b.uses {
		r := nodeRef{b.node, u}
		if g.refs[r]--; g.refs[r] <= 0 {
			delete(g.refs, r)
		}
	}
}

// wait blocks until the graph has its first list, or ctx ends.
func (g *Graph) wait(ctx context.Context) error {
	select {
	case <-g.synced:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// PodNode is the node a pod is bound to, "" for none or no such pod.
func (g *Graph) PodNode(ctx context.Context, namespace, name string) (string, error) {
	if err := g.wait(ctx); err != nil {
		return "", err
	}
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.pods[Ref{"pods", namespace, name}].node, nil
}

// Pod is what a token bound to a pod checks: the pod's UID and when it
// is to be deleted (zero when not); ok is false when it does not exist.
func (g *Graph) Pod(ctx context.Context, namespace, name string) (uid string, deleted time.Time, ok bool, err error) {
	if err := g.wait(ctx); err != nil {
		return "", time.Time{}, false, err
	}
	g.mu.RLock()
	defer g.mu.RUnlock()
	b, ok := g.pods[Ref{"pods", namespace, name}]
	return b.uid, b.deleted, ok, nil
}

// Uses reports whether a pod bound to node uses the object (resource is
// secrets, configmaps, persistentvolumeclaims or serviceaccounts).
func (g *Graph) Uses(ctx context.Context, node, resource, namespace, name string) (bool, error) {
	if err := g.wait(ctx); err != nil {
		return false, err
	}
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.refs[nodeRef{node, Ref{resource, namespace, name}}] > 0, nil
}

// PodReferences are the secrets, configmaps, claims and service account
// a pod uses, each once.
func PodReferences(pod *corev1.Pod) []Ref {
	seen := map[Ref]bool{}
	var out []Ref
	add := func(resource, name string) {
		r := Ref{resource, pod.Namespace, name}
		if name != "" && !seen[r] {
			seen[r] = true
			out = append(out, r)
		}
	}
	add("serviceaccounts", pod.Spec.ServiceAccountName)
	for _, s := range pod.Spec.ImagePullSecrets {
		add("secrets", s.Name)
	}
	for _, v := range pod.Spec.Volumes {
		switch {
		case v.Secret != nil:
			add("secrets", v.Secret.SecretName)
		case v.ConfigMap != nil:
			add("configmaps", v.ConfigMap.Name)
		case v.PersistentVolumeClaim != nil:
			add("persistentvolumeclaims", v.PersistentVolumeClaim.ClaimName)
		case v.Projected != nil:
			for _, src := range v.Projected.Sources {
				if src.Secret != nil {
					add("secrets", src.Secret.Name)
				}
				if src.ConfigMap != nil {
					add("configmaps", src.ConfigMap.Name)
				}
			}
		}
	}
	type envSources struct {
		from []corev1.EnvFromSource
		env  []corev1.EnvVar
	}
	var containers []envSources
	for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		containers = append(containers, envSources{c.EnvFrom, c.Env})
	}
	for _, c := range pod.Spec.EphemeralContainers {
		containers = append(containers, envSources{c.EnvFrom, c.Env})
	}
	for _, c := range containers {
		for _, e := range c.from {
			if e.SecretRef != nil {
				add("secrets", e.SecretRef.Name)
			}
			if e.ConfigMapRef != nil {
				add("configmaps", e.ConfigMapRef.Name)
			}
		}
		for _, e := range c.env {
			if e.ValueFrom == nil {
				continue
			}
			if e.ValueFrom.SecretKeyRef != nil {
				add("secrets", e.ValueFrom.SecretKeyRef.Name)
			}
			if e.ValueFrom.ConfigMapKeyRef != nil {
				add("configmaps", e.ValueFrom.ConfigMapKeyRef.Name)
			}
		}
	}
	return out
}
