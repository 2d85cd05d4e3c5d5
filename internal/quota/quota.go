// Package quota says what an object charges against its namespace's
// ResourceQuotas, as Kubernetes' quota evaluators count it: object counts
// (pods, services, configmaps, ... and count/<resource>.<group> for any
// kind), a pod's compute requests and limits (while it is not finished),
// a Service's node ports and load balancers; and which quotas a pod's
// scopes (Terminating, BestEffort, PriorityClass, ...) put it under. The
// API server's quota admission and the quota loop both count with it.
package quota

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	resourcehelper "k8s.io/component-helpers/resource"
)

// CountKey is the object-count resource name of a kind:
// count/<resource> for the core group, count/<resource>.<group> else.
func CountKey(gr schema.GroupResource) corev1.ResourceName {
	if gr.Group == "" {
		return corev1.ResourceName("count/" + gr.Resource)
	}
	return corev1.ResourceName("count/" + gr.Resource + "." + gr.Group)
}

// classicCounts are the object counts quota had before count/: the core
// kinds by their plural.
var classicCounts = map[string]corev1.ResourceName{
	"pods": corev1.ResourcePods, "services": corev1.ResourceServices, "configmaps": corev1.ResourceConfigMaps,
	"secrets": corev1.ResourceSecrets, "resourcequotas": corev1.ResourceQuotas,
	"replicationcontrollers": corev1.ResourceReplicationControllers, "persistentvolumeclaims": corev1.ResourcePersistentVolumeClaims,
}

// computeResources are what a pod's containers request and are limited to.
var computeResources = []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage}

// Usage is what obj, of resource gr, charges.
func Usage(gr schema.GroupResource, obj runtime.Object) corev1.ResourceList {
	one := resource.MustParse("1")
	u := corev1.ResourceList{CountKey(gr): one}
	if name := ClassicName(gr); name != "" {
		u[name] = one
	}
	switch o := obj.(type) {
	case *corev1.Pod:
		if Finished(o) {
			return corev1.ResourceList{}
		}
		// A pod being resized is charged the larger of what it asks and
		// what its node gave it, as Kubernetes charges it.
		opts := resourcehelper.PodResourcesOptions{UseStatusResources: true}
		requests, limits := resourcehelper.PodRequests(o, opts), resourcehelper.PodLimits(o, opts)
		for _, r := range computeResources {
			if q, ok := requests[r]; ok {
				u["requests."+r] = q
				u[r] = q // cpu is requests.cpu, memory requests.memory, as in Kubernetes
			}
			if q, ok := limits[r]; ok {
				u["limits."+r] = q
			}
		}
		// Extended resources (example.com/dongle) and huge pages count by
		// their requests, as Kubernetes' pod evaluator counts them.
		for name, q := range requests {
			if extended(name) || strings.HasPrefix(string(name), corev1.ResourceHugePagesPrefix) {
				u[corev1.DefaultResourceRequestsPrefix+name] = q
			}
		}
	case *corev1.PersistentVolumeClaim:
		// Kubernetes' claim evaluator: storage asked, in all and per class.
		class := ClaimClass(o)
		if class != "" {
			u[corev1.ResourceName(class+storageClassSuffix+string(corev1.ResourcePersistentVolumeClaims))] = one
		}
		if q, ok := o.Spec.Resources.Requests[corev1.ResourceStorage]; ok {
			u[corev1.ResourceRequestsStorage] = q
			if class != "" {
				u[corev1.ResourceName(class+storageClassSuffix+string(corev1.ResourceRequestsStorage))] = q
			}
		}
	case *corev1.Service:
		ports := int64(len(o.Spec.Ports))
		switch o.Spec.Type {
		case corev1.ServiceTypeNodePort:
			u[corev1.ResourceServicesNodePorts] = *resource.NewQuantity(ports, resource.DecimalSI)
		case corev1.ServiceTypeLoadBalancer:
			u[corev1.ResourceServicesLoadBalancers] = one
			if o.Spec.AllocateLoadBalancerNodePorts == nil || *o.Spec.AllocateLoadBalancerNodePorts {
				u[corev1.ResourceServicesNodePorts] = *resource.NewQuantity(ports, resource.DecimalSI)
			}
		}
	}
	return u
}

// storageClassSuffix joins a class to what a quota limits of its claims:
// gold.storageclass.storage.k8s.io/requests.storage.
const storageClassSuffix = ".storageclass.storage.k8s.io/"

// extended reports whether name is an extended resource: a domain-prefixed
// name outside kubernetes.io, not itself a quota's "requests." name.
func extended(name corev1.ResourceName) bool {
	n := string(name)
	domain, _, ok := strings.Cut(n, "/")
	return ok && domain != "kubernetes.io" && !strings.HasSuffix(domain, ".kubernetes.io") && !strings.HasPrefix(n, corev1.DefaultResourceRequestsPrefix)
}

// ClaimClass is the class a claim asks for ("" for none).
func ClaimClass(pvc *corev1.PersistentVolumeClaim) string {
	if pvc.Spec.StorageClassName != nil {
		return *pvc.Spec.StorageClassName
	}
	return ""
}

// Finished reports whether a pod no longer counts: it has succeeded or
// failed.
func Finished(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

// Limited is the part of usage that hard limits.
func Limited(hard, usage corev1.ResourceList) corev1.ResourceList {
	out := corev1.ResourceList{}
	for r, q := range usage {
		if _, ok := hard[r]; ok {
			out[r] = q
		}
	}
	return out
}

// ClassicName is the classic count name of a core kind (pods,
// configmaps, ...), "" for others.
func ClassicName(gr schema.GroupResource) corev1.ResourceName {
	if gr.Group != "" {
		return ""
	}
	return classicCounts[gr.Resource]
}

// CountedKind is the kind an object-count resource name (pods,
// count/deployments.apps) counts.
func CountedKind(r corev1.ResourceName) (schema.GroupResource, bool) {
	for plural, name := range classicCounts {
		if name == r {
			return schema.GroupResource{Resource: plural}, true
		}
	}
	rest, ok := strings.CutPrefix(string(r), "count/")
	if !ok {
		return schema.GroupResource{}, false
	}
	name, group, _ := strings.Cut(rest, ".")
	return schema.GroupResource{Group: group, Resource: name}, true
}

// Scoped reports whether q has scopes (which select pods only).
func Scoped(q *corev1.ResourceQuota) bool {
	return len(q.Spec.Scopes) > 0 || q.Spec.ScopeSelector != nil && len(q.Spec.ScopeSelector.MatchExpressions) > 0
}

// Matches reports whether q counts obj: a quota with scopes counts only
// the pods they select, one without counts every object.
func Matches(q *corev1.ResourceQuota, obj runtime.Object) bool {
	var scopes []corev1.ScopedResourceSelectorRequirement
	for _, s := range q.Spec.Scopes {
		scopes = append(scopes, corev1.ScopedResourceSelectorRequirement{ScopeName: s, Operator: corev1.ScopeSelectorOpExists})
	}
	if q.Spec.ScopeSelector != nil {
		scopes = append(scopes, q.Spec.ScopeSelector.MatchExpressions...)
	}
	if len(scopes) == 0 {
		return true
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return false
	}
	for _, s := range scopes {
		if !scopeMatches(s, pod) {
			return false
		}
	}
	return true
}

func scopeMatches(s corev1.ScopedResourceSelectorRequirement, pod *corev1.Pod) bool {
	switch s.ScopeName {
	case corev1.ResourceQuotaScopeTerminating:
		return terminating(pod)
	case corev1.ResourceQuotaScopeNotTerminating:
		return !terminating(pod)
	case corev1.ResourceQuotaScopeBestEffort:
		return bestEffort(pod)
	case corev1.ResourceQuotaScopeNotBestEffort:
		return !bestEffort(pod)
	case corev1.ResourceQuotaScopeCrossNamespacePodAffinity:
		return crossNamespaceAffinity(pod)
	case corev1.ResourceQuotaScopePriorityClass:
		switch s.Operator {
		case corev1.ScopeSelectorOpExists:
			return pod.Spec.PriorityClassName != ""
		case corev1.ScopeSelectorOpDoesNotExist:
			return pod.Spec.PriorityClassName == ""
		case corev1.ScopeSelectorOpIn:
			return slices.Contains(s.Values, pod.Spec.PriorityClassName)
		case corev1.ScopeSelectorOpNotIn:
			return !slices.Contains(s.Values, pod.Spec.PriorityClassName)
		}
	}
	return false
}

func terminating(pod *corev1.Pod) bool {
	return pod.Spec.ActiveDeadlineSeconds != nil && *pod.Spec.ActiveDeadlineSeconds >= 0
}

// bestEffort is the BestEffort QoS class: no container requests or is
// limited to any compute resource.
func bestEffort(pod *corev1.Pod) bool {
	for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if _, ok := c.Resources.Requests[r]; ok {
				return false
			}
			if _, ok := c.Resources.Limits[r]; ok {
				return false
			}
		}
	}
	return true
}

func crossNamespaceAffinity(pod *corev1.Pod) bool {
	a := pod.Spec.Affinity
	if a == nil {
		return false
	}
	var terms []corev1.PodAffinityTerm
	if a.PodAffinity != nil {
		terms = append(terms, a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution...)
		for _, w := range a.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
			terms = append(terms, w.PodAffinityTerm)
		}
	}
	if a.PodAntiAffinity != nil {
		terms = append(terms, a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution...)
		for _, w := range a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
			terms = append(terms, w.PodAffinityTerm)
		}
	}
	for _, t := range terms {
		if len(t.Namespaces) > 0 || t.NamespaceSelector != nil {
			return true
		}
	}
	return false
}

// Unspecified is, for a pod under q, each compute resource q limits that
// some container does not say, with those containers: a quota on
// requests.cpu takes a cpu request of every container, as Kubernetes
// demands ("limits.cpu for: app,sidecar").
func Unspecified(q *corev1.ResourceQuota, pod *corev1.Pod) []string {
	var out []string
	for _, r := range computeResources {
		for _, kind := range []string{"requests", "limits"} {
			name := corev1.ResourceName(kind + "." + string(r))
			_, limited := q.Spec.Hard[name]
			if kind == "requests" && r != corev1.ResourceEphemeralStorage {
				_, plain := q.Spec.Hard[r]
				limited = limited || plain
			}
			if !limited {
				continue
			}
			var missing []string
			for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
				list := c.Resources.Requests
				if kind == "limits" {
					list = c.Resources.Limits
				}
				if _, ok := list[r]; !ok {
					missing = append(missing, c.Name)
				}
			}
			if len(missing) > 0 {
				out = append(out, fmt.Sprintf("%s for: %s", name, strings.Join(missing, ",")))
			}
		}
	}
	return out
}

// Add adds amount to *l, or takes it away.
func Add(l *corev1.ResourceList, amount corev1.ResourceList, subtract bool) {
	if *l == nil {
		*l = corev1.ResourceList{}
	}
	for r, v := range amount {
		u := (*l)[r]
		if subtract {
			u.Sub(v)
		} else {
			u.Add(v)
		}
		(*l)[r] = u
	}
}

// String prints a resource list as Kubernetes' quota messages do:
// name=quantity, sorted, comma-separated.
func String(l corev1.ResourceList) string {
	names := make([]string, 0, len(l))
	for r := range l {
		names = append(names, string(r))
	}
	slices.Sort(names)
	parts := make([]string, 0, len(names))
	for _, n := range names {
		q := l[corev1.ResourceName(n)]
		parts = append(parts, n+"="+q.String())
	}
	return strings.Join(parts, ",")
}
