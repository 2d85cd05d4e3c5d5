package quota

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
)

func pod(mutate func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app"}}}}
	if mutate != nil {
		mutate(p)
	}
	return p
}

func withCPU(p *corev1.Pod) {
	p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m")}
	p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}
}

// TestScopes: which pods a quota's scopes select, as Kubernetes' pod
// evaluator matches them; scopes select no other kind.
func TestScopes(t *testing.T) {
	scoped := func(scopes ...corev1.ResourceQuotaScope) *corev1.ResourceQuota {
		return &corev1.ResourceQuota{Spec: corev1.ResourceQuotaSpec{Scopes: scopes}}
	}
	priority := func(op corev1.ScopeSelectorOperator, values ...string) *corev1.ResourceQuota {
		return &corev1.ResourceQuota{Spec: corev1.ResourceQuotaSpec{ScopeSelector: &corev1.ScopeSelector{MatchExpressions: []corev1.ScopedResourceSelectorRequirement{
			{ScopeName: corev1.ResourceQuotaScopePriorityClass, Operator: op, Values: values}}}}}
	}
	deadline := func(p *corev1.Pod) { p.Spec.ActiveDeadlineSeconds = ptr.To[int64](60) }
	high := func(p *corev1.Pod) { p.Spec.PriorityClassName = "high" }
	for _, tc := range []struct {
		name string
		q    *corev1.ResourceQuota
		obj  runtime.Object
		want bool
	}{
		{"no scopes, any pod", scoped(), pod(nil), true},
		{"no scopes, a service", scoped(), &corev1.Service{}, true},
		{"a scope, a service", scoped(corev1.ResourceQuotaScopeNotTerminating), &corev1.Service{}, false},
		{"Terminating, a pod with a deadline", scoped(corev1.ResourceQuotaScopeTerminating), pod(deadline), true},
		{"Terminating, a pod without", scoped(corev1.ResourceQuotaScopeTerminating), pod(nil), false},
		{"NotTerminating, a pod without", scoped(corev1.ResourceQuotaScopeNotTerminating), pod(nil), true},
		{"BestEffort, no resources", scoped(corev1.ResourceQuotaScopeBestEffort), pod(nil), true},
		{"BestEffort, a cpu request", scoped(corev1.ResourceQuotaScopeBestEffort), pod(withCPU), false},
		{"NotBestEffort, a cpu request", scoped(corev1.ResourceQuotaScopeNotBestEffort), pod(withCPU), true},
		{"both scopes must hold", scoped(corev1.ResourceQuotaScopeNotBestEffort, corev1.ResourceQuotaScopeTerminating), pod(withCPU), false},
		{"PriorityClass In", priority(corev1.ScopeSelectorOpIn, "high"), pod(high), true},
		{"PriorityClass In, another", priority(corev1.ScopeSelectorOpIn, "low"), pod(high), false},
		{"PriorityClass NotIn", priority(corev1.ScopeSelectorOpNotIn, "low"), pod(high), true},
		{"PriorityClass Exists, none", priority(corev1.ScopeSelectorOpExists), pod(nil), false},
		{"PriorityClass DoesNotExist, none", priority(corev1.ScopeSelectorOpDoesNotExist), pod(nil), true},
	} {
		if got := Matches(tc.q, tc.obj); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestUsage: what objects charge, by Kubernetes' names.
func TestUsage(t *testing.T) {
	pods := schema.GroupResource{Resource: "pods"}
	u := Usage(pods, pod(withCPU))
	if String(u) != "count/pods=1,cpu=250m,limits.cpu=1,pods=1,requests.cpu=250m" {
		t.Errorf("a pod: %s", String(u))
	}
	// Extended resources count by their requests (requests.example.com/dongle).
	dongle := pod(withCPU)
	dongle.Spec.Containers[0].Resources.Requests["example.com/dongle"] = resource.MustParse("2")
	dongle.Spec.Containers[0].Resources.Limits["example.com/dongle"] = resource.MustParse("2")
	if got := String(Usage(pods, dongle)); got != "count/pods=1,cpu=250m,limits.cpu=1,pods=1,requests.cpu=250m,requests.example.com/dongle=2" {
		t.Errorf("a pod asking for an extended resource: %s", got)
	}
	done := pod(withCPU)
	done.Status.Phase = corev1.PodSucceeded
	if u := Usage(pods, done); len(u) != 0 {
		t.Errorf("a finished pod charges %s", String(u))
	}
	lb := &corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Port: 80}, {Port: 443}}}}
	if got := String(Usage(schema.GroupResource{Resource: "services"}, lb)); got != "count/services=1,services=1,services.loadbalancers=1,services.nodeports=2" {
		t.Errorf("a load balancer: %s", got)
	}
	if got := String(Usage(schema.GroupResource{Group: "apps", Resource: "deployments"}, nil)); got != "count/deployments.apps=1" {
		t.Errorf("a deployment: %s", got)
	}
	q := &corev1.ResourceQuota{Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourceLimitsMemory: resource.MustParse("1Gi"), corev1.ResourceCPU: resource.MustParse("2")}}}
	if got := Unspecified(q, pod(withCPU)); len(got) != 1 || got[0] != "limits.memory for: app" {
		t.Errorf("unspecified: %v", got)
	}
}
