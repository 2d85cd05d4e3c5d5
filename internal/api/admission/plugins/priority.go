package plugins

import (
	"context"
	"errors"
	"fmt"

	"github.com/orch-dev/orch/internal/api/resources/scheduling"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

var priorityClassesResource = schedulingv1.Resource("priorityclasses")

// admitPodPriority is Kubernetes' Priority admission: a new pod takes the
// value and preemption policy of the PriorityClass it names (which must
// exist), or of the cluster's default class, or 0; a value the pod sends
// must agree. An update keeps what the pod was given.
func (p *Plugins) admitPodPriority(ctx context.Context, obj, old runtime.Object) error {
	pod := obj.(*corev1.Pod)
	if old != nil {
		was := old.(*corev1.Pod)
		if pod.Spec.Priority == nil {
			pod.Spec.Priority = was.Spec.Priority
		}
		if pod.Spec.PreemptionPolicy == nil {
			pod.Spec.PreemptionPolicy = was.Spec.PreemptionPolicy
		}
		return nil
	}
	forbid := func(format string, args ...any) error {
		return apierrors.NewForbidden(corev1.Resource("pods"), pod.Name, fmt.Errorf(format, args...))
	}
	var priority int32
	var policy *corev1.PreemptionPolicy
	if pod.Spec.PriorityClassName == "" {
		def, err := p.defaultPriorityClass(ctx)
		if err != nil {
			return fmt.Errorf("failed to get default priority class: %w", err)
		}
		if def != nil {
			pod.Spec.PriorityClassName, priority, policy = def.Name, def.Value, def.PreemptionPolicy
		}
	} else {
		got, err := p.storage("scheduling.k8s.io", "priorityclasses").Get(ctx, "", pod.Spec.PriorityClassName)
		if apierrors.IsNotFound(err) {
			return forbid("no PriorityClass with name %v was found", pod.Spec.PriorityClassName)
		}
		if err != nil {
			return fmt.Errorf("failed to get PriorityClass with name %s: %w", pod.Spec.PriorityClassName, err)
		}
		pc := got.(*schedulingv1.PriorityClass)
		priority, policy = pc.Value, pc.PreemptionPolicy
	}
	if pod.Spec.Priority != nil && *pod.Spec.Priority != priority {
		return forbid("the integer value of priority (%d) must not be provided in pod spec; priority admission controller computed %d from the given PriorityClass name", *pod.Spec.Priority, priority)
	}
	pod.Spec.Priority = &priority
	if policy != nil {
		if pod.Spec.PreemptionPolicy != nil && *pod.Spec.PreemptionPolicy != *policy {
			return forbid("the string value of PreemptionPolicy (%s) must not be provided in pod spec; priority admission controller computed %s from the given PriorityClass name", *pod.Spec.PreemptionPolicy, *policy)
		}
		p := *policy
		pod.Spec.PreemptionPolicy = &p
	}
	return nil
}

// defaultPriorityClass is the class marked globalDefault (the highest, if
// several slipped in), or nil.
func (p *Plugins) defaultPriorityClass(ctx context.Context) (*schedulingv1.PriorityClass, error) {
	got, err := p.storage("scheduling.k8s.io", "priorityclasses").List(ctx, "", &metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var def *schedulingv1.PriorityClass
	for i := range got.(*schedulingv1.PriorityClassList).Items {
		pc := &got.(*schedulingv1.PriorityClassList).Items[i]
		if pc.GlobalDefault && (def == nil || def.Value < pc.Value) {
			def = pc
		}
	}
	return def, nil
}

// admitPriorityClass keeps one default class: a class may not become the
// default while another is.
func (p *Plugins) admitPriorityClass(ctx context.Context, obj, old runtime.Object) error {
	pc := obj.(*schedulingv1.PriorityClass)
	if !pc.GlobalDefault {
		return nil
	}
	def, err := p.defaultPriorityClass(ctx)
	if err != nil {
		return fmt.Errorf("failed to get default priority class: %w", err)
	}
	if def != nil && (old == nil || def.Name != pc.Name) {
		return apierrors.NewForbidden(priorityClassesResource, pc.Name, fmt.Errorf("PriorityClass %v is marked as default. Only one default can exist", def.Name))
	}
	return nil
}

// keepSystemPriorityClasses refuses to delete the system's classes.
func keepSystemPriorityClasses(_ context.Context, obj runtime.Object) error {
	pc := obj.(*schedulingv1.PriorityClass)
	for _, sys := range scheduling.SystemPriorityClasses() {
		if pc.Name == sys.Name {
			return apierrors.NewForbidden(priorityClassesResource, pc.Name, errors.New("this is a system priority class and cannot be deleted"))
		}
	}
	return nil
}
