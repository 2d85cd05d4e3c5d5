package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/orch-dev/orch/internal/api/registry"
	"github.com/orch-dev/orch/internal/api/resources"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	pdbhelper "k8s.io/component-helpers/apps/poddisruptionbudget"
)

// maxDisruptedPods bounds a budget's status.disruptedPods: past it, evictions
// the disruption loop has not yet seen through are too many, and more are
// refused (Kubernetes' MaxDisruptedPodSize).
const maxDisruptedPods = 2000

// evictionRetries bounds how often an eviction decides again on a pod
// that changed while it was being evicted.
const evictionRetries = 20

var evictionGVK = policyv1.SchemeGroupVersion.WithKind("Eviction")

// serveEvictions adds pods/eviction to the pods resource among all: what
// `kubectl drain` finds in discovery and uses instead of deleting pods.
func (s *Server) serveEvictions(all []*resources.Resource) {
	for _, r := range all {
		if r.GroupResource() == (schema.GroupResource{Resource: "pods"}) {
			r.Subresources = append(r.Subresources, resources.Subresource{
				Name: "eviction", Serve: resources.ServeAnswer, Kind: evictionGVK, Verbs: metav1.Verbs{"create"},
				NewBody: func() runtime.Object { return &policyv1.Eviction{} }, Answer: s.evict,
			})
		}
	}
}

// evict is Kubernetes' eviction API: a pod is deleted, with its
// DisruptionTarget condition set first, only if the one
// PodDisruptionBudget that selects it allows a disruption, which the
// eviction then takes from the budget's status (the disruption loop gives
// it back if the pod is not gone within two minutes). A pod that is not
// running (pending, finished or already being deleted) is deleted
// whatever its budget says; one that is not ready is deleted when its
// budget is met without it or lets unhealthy pods go (AlwaysAllow).
func (s *Server) evict(ctx context.Context, body, current runtime.Object, opts resources.AnswerOptions) (runtime.Object, error) {
	eviction, pod := body.(*policyv1.Eviction), current.(*corev1.Pod)
	deleteOpts, err := evictionDeleteOptions(eviction, opts.DryRun)
	if err != nil {
		return nil, err
	}
	wopts := registry.WriteOptions{DryRun: dryRunAll(deleteOpts.DryRun)}
	rvUnset := deleteOpts.Preconditions == nil || deleteOpts.Preconditions.ResourceVersion == nil
	for attempt := 0; disrupted(pod); attempt++ {
		// Its disruption already happened: no budget is asked, unless it
		// started running meanwhile (the delete is of the pod as read).
		opts := deleteOpts
		if rvUnset && pod.Status.Phase == corev1.PodPending {
			opts = withResourceVersion(deleteOpts, pod.ResourceVersion)
		}
		out, err := s.deleteEvicted(ctx, pod, opts, wopts)
		if !apierrors.IsConflict(err) || !rvUnset || attempt == evictionRetries {
			return out, err
		}
		// Changed under us (its node starting it): decide again on it as it is.
		got, err := s.storage("", "pods").Get(ctx, pod.Namespace, pod.Name)
		if err != nil {
			return nil, err
		}
		pod = got.(*corev1.Pod)
	}
	budgets, err := s.budgetsOf(ctx, pod)
	if err != nil {
		return nil, err
	}
	if len(budgets) > 1 {
		return &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure, Code: http.StatusInternalServerError,
			Message: "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."}, nil
	}
	guarded := false
	if len(budgets) == 1 {
		pdb := budgets[0]
		switch {
		case !podReady(pod) && pdb.Spec.UnhealthyPodEvictionPolicy != nil && *pdb.Spec.UnhealthyPodEvictionPolicy == policyv1.AlwaysAllow,
			!podReady(pod) && pdb.Status.CurrentHealthy >= pdb.Status.DesiredHealthy && pdb.Status.DesiredHealthy > 0:
			// An unready pod counts for nothing in the budget: it goes
			// unless it became ready meanwhile.
			guarded = true
		default:
			if err := s.takeDisruption(ctx, pdb, pod.Name, wopts.DryRun); err != nil {
				return nil, err
			}
		}
		if guarded && rvUnset {
			deleteOpts = withResourceVersion(deleteOpts, pod.ResourceVersion)
		}
		out, err := s.deleteEvicted(ctx, pod, deleteOpts, wopts)
		if apierrors.IsConflict(err) && guarded && rvUnset {
			return nil, budgetBusy(pdb.Name)
		}
		return out, err
	}
	return s.deleteEvicted(ctx, pod, deleteOpts, wopts)
}

// disrupted: a pod that runs nothing the budget counts (pending, finished)
// or is already on its way out, which an eviction deletes outright.
func disrupted(pod *corev1.Pod) bool {
	switch pod.Status.Phase {
	case corev1.PodSucceeded, corev1.PodFailed, corev1.PodPending:
		return true
	}
	return pod.DeletionTimestamp != nil
}

// evictionDeleteOptions are the eviction's delete options with the
// request's dryRun, which must agree with theirs.
func evictionDeleteOptions(e *policyv1.Eviction, dryRun bool) (*metav1.DeleteOptions, error) {
	var requested []string
	if dryRun {
		requested = []string{metav1.DryRunAll}
	}
	if e.DeleteOptions == nil {
		return &metav1.DeleteOptions{DryRun: requested}, nil
	}
	o := e.DeleteOptions.DeepCopy()
	switch {
	case len(o.DryRun) == 0:
		o.DryRun = requested
	case len(requested) > 0 && !slices.Equal(o.DryRun, requested):
		return nil, apierrors.NewBadRequest(fmt.Sprintf("Non-matching dry-run options in request and content: %v and %v", requested, o.DryRun))
	}
	for _, d := range o.DryRun {
		if d != metav1.DryRunAll {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("Invalid dry run value: %q, only %q is supported", d, metav1.DryRunAll))
		}
	}
	return o, nil
}

func dryRunAll(values []string) bool { return slices.Contains(values, metav1.DryRunAll) }

func withResourceVersion(o *metav1.DeleteOptions, rv string) *metav1.DeleteOptions {
	o = o.DeepCopy()
	if o.Preconditions == nil {
		o.Preconditions = &metav1.Preconditions{}
	}
	o.Preconditions.ResourceVersion = &rv
	return o
}

// budgetsOf returns the budgets in the pod's namespace whose selector
// matches it: a budget without a selector matches nothing, an empty one
// every pod (policy/v1).
func (s *Server) budgetsOf(ctx context.Context, pod *corev1.Pod) ([]*policyv1.PodDisruptionBudget, error) {
	got, err := s.storage("policy", "poddisruptionbudgets").List(ctx, pod.Namespace, &metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []*policyv1.PodDisruptionBudget
	for i := range got.(*policyv1.PodDisruptionBudgetList).Items {
		pdb := &got.(*policyv1.PodDisruptionBudgetList).Items[i]
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil || !sel.Matches(labels.Set(pod.Labels)) {
			continue
		}
		out = append(out, pdb)
	}
	return out, nil
}

// takeDisruption takes one allowed disruption from the budget for the
// named pod, on the budget as stored at the time (a concurrent eviction
// is seen), and records the pod among its disrupted ones; a dry run only
// checks.
func (s *Server) takeDisruption(ctx context.Context, pdb *policyv1.PodDisruptionBudget, podName string, dryRun bool) error {
	_, _, err := s.storage("policy", "poddisruptionbudgets").Update(ctx, pdb.Namespace, pdb.Name, func(_ context.Context, current runtime.Object) (runtime.Object, error) {
		if current == nil {
			return nil, apierrors.NewNotFound(policyv1.Resource("poddisruptionbudgets"), pdb.Name)
		}
		p := current.(*policyv1.PodDisruptionBudget).DeepCopy()
		if err := checkDisruptionAllowed(p); err != nil {
			return nil, err
		}
		p.Status.DisruptionsAllowed--
		if p.Status.DisruptionsAllowed == 0 {
			pdbhelper.UpdateDisruptionAllowedCondition(p)
		}
		if p.Status.DisruptedPods == nil {
			p.Status.DisruptedPods = map[string]metav1.Time{}
		}
		p.Status.DisruptedPods[podName] = metav1.Time{Time: time.Now()}
		// Written over whatever was stored meanwhile: the check runs again on it.
		p.ResourceVersion = ""
		return p, nil
	}, registry.UpdateOptions{WriteOptions: registry.WriteOptions{DryRun: dryRun}, Subresource: "status"})
	return err
}

// checkDisruptionAllowed is Kubernetes' decision on a budget: 429 while
// the disruption loop has not seen its latest spec or when it allows no
// disruption, 403 when it cannot be trusted.
func checkDisruptionAllowed(p *policyv1.PodDisruptionBudget) error {
	if p.Status.ObservedGeneration < p.Generation {
		return budgetBusy(p.Name)
	}
	if p.Status.DisruptionsAllowed < 0 {
		return apierrors.NewForbidden(policyv1.Resource("poddisruptionbudget"), p.Name, errors.New("pdb disruptions allowed is negative"))
	}
	if len(p.Status.DisruptedPods) > maxDisruptedPods {
		return apierrors.NewForbidden(policyv1.Resource("poddisruptionbudget"), p.Name, errors.New("DisruptedPods map too big - too many evictions not confirmed by PDB controller"))
	}
	if p.Status.DisruptionsAllowed == 0 {
		err := apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
		err.ErrStatus.Details.Causes = append(err.ErrStatus.Details.Causes, metav1.StatusCause{Type: policyv1.DisruptionBudgetCause,
			Message: fmt.Sprintf("The disruption budget %s needs %d healthy pods and has %d currently", p.Name, p.Status.DesiredHealthy, p.Status.CurrentHealthy)})
		return err
	}
	return nil
}

// budgetBusy is the 429 of a budget whose status is not yet up to date.
func budgetBusy(name string) error {
	err := apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 10)
	err.ErrStatus.Details.Causes = append(err.ErrStatus.Details.Causes, metav1.StatusCause{Type: policyv1.DisruptionBudgetCause,
		Message: fmt.Sprintf("The disruption budget %s is still being processed by the server.", name)})
	return err
}

// deleteEvicted marks the pod as disrupted by an eviction (its
// DisruptionTarget condition, so that its controller and its containers'
// exit are told why) and deletes it as the eviction's options say.
func (s *Server) deleteEvicted(ctx context.Context, pod *corev1.Pod, opts *metav1.DeleteOptions, wopts registry.WriteOptions) (runtime.Object, error) {
	pods := s.storage("", "pods")
	if !wopts.DryRun {
		out, _, err := pods.Update(ctx, pod.Namespace, pod.Name, func(_ context.Context, current runtime.Object) (runtime.Object, error) {
			if current == nil {
				return nil, apierrors.NewNotFound(corev1.Resource("pods"), pod.Name)
			}
			p := current.(*corev1.Pod).DeepCopy()
			if pre := opts.Preconditions; pre != nil {
				if pre.UID != nil && *pre.UID != "" && *pre.UID != p.UID {
					return nil, apierrors.NewConflict(corev1.Resource("pods"), p.Name, fmt.Errorf("Precondition failed: UID in precondition: %v, UID in object meta: %v", *pre.UID, p.UID)) //nolint:staticcheck // Kubernetes' own wording
				}
				if pre.ResourceVersion != nil && *pre.ResourceVersion != "" && *pre.ResourceVersion != p.ResourceVersion {
					return nil, apierrors.NewConflict(corev1.Resource("pods"), p.Name, fmt.Errorf("Precondition failed: ResourceVersion in precondition: %v, ResourceVersion in object meta: %v", *pre.ResourceVersion, p.ResourceVersion)) //nolint:staticcheck // Kubernetes' own wording
				}
			}
			setDisruptionTarget(p)
			p.ResourceVersion = ""
			return p, nil
		}, registry.UpdateOptions{Subresource: "status"})
		if err != nil {
			return nil, err
		}
		if opts.Preconditions != nil && opts.Preconditions.ResourceVersion != nil {
			// The condition's write is ours: the delete goes on from it.
			opts = withResourceVersion(opts, out.(*corev1.Pod).ResourceVersion)
		}
	}
	if _, err := pods.Delete(ctx, pod.Namespace, pod.Name, opts, wopts); err != nil {
		return nil, err
	}
	return &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusSuccess, Code: http.StatusCreated}, nil
}

// setDisruptionTarget sets the pod's DisruptionTarget condition as the
// eviction API sets it.
func setDisruptionTarget(p *corev1.Pod) {
	cond := corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "EvictionByEvictionAPI",
		Message: "Eviction API: evicting", LastTransitionTime: metav1.Now()}
	for i := range p.Status.Conditions {
		if c := &p.Status.Conditions[i]; c.Type == cond.Type {
			if c.Status == cond.Status {
				cond.LastTransitionTime = c.LastTransitionTime
			}
			*c = cond
			return
		}
	}
	p.Status.Conditions = append(p.Status.Conditions, cond)
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
