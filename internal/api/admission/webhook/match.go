package webhook

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/orch-dev/orch/internal/api/admission"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
)

var errNoCEL = errors.New("matchConditions are not supported by this server")

// selector reads a label selector; nil (unset) selects everything, as
// Kubernetes defaults it to {}.
func selector(ls *metav1.LabelSelector) (labels.Selector, error) {
	if ls == nil {
		return labels.Everything(), nil
	}
	return metav1.LabelSelectorAsSelector(ls)
}

// rulesMatch is Kubernetes' rule matching: the operation, group, version
// and resource (with subresource: "pods" is the main resource only,
// "pods/*" its subresources, "*/status" every status, "*/*" everything)
// and the scope.
func rulesMatch(rules []admissionregistrationv1.RuleWithOperations, a *admission.Attributes) bool {
	for _, r := range rules {
		if ruleMatches(r, a) {
			return true
		}
	}
	return false
}

func ruleMatches(r admissionregistrationv1.RuleWithOperations, a *admission.Attributes) bool {
	if !slices.ContainsFunc(r.Operations, func(op admissionregistrationv1.OperationType) bool {
		return op == admissionregistrationv1.OperationAll || string(op) == a.Operation
	}) {
		return false
	}
	if !matchesOrStar(r.APIGroups, a.Resource.Group) || !matchesOrStar(r.APIVersions, a.Resource.Version) {
		return false
	}
	if r.Scope != nil {
		switch *r.Scope {
		case admissionregistrationv1.ClusterScope:
			if a.Resource.Namespaced {
				return false
			}
		case admissionregistrationv1.NamespacedScope:
			if !a.Resource.Namespaced {
				return false
			}
		}
	}
	for _, res := range r.Resources {
		name, sub, _ := strings.Cut(res, "/")
		switch {
		case res == "*/*":
			return true
		case name == "*" && sub == "" && a.Subresource == "":
			return true
		case name == "*" && sub == a.Subresource && sub != "":
			return true
		case name == a.Resource.Plural && (sub == a.Subresource || sub == "*" && a.Subresource != ""):
			return true
		}
	}
	return false
}

func matchesOrStar(list []string, want string) bool {
	return slices.ContainsFunc(list, func(s string) bool { return s == "*" || s == want })
}

// selectorsMatch checks the namespace selector (on the namespace's labels;
// a Namespace is judged by its own, other cluster-scoped kinds always
// match) and the object selector (on the new object's labels or the old
// one's).
func (d *Dispatcher) selectorsMatch(ctx context.Context, h *hook, a *admission.Attributes) (bool, error) {
	if !h.nsSel.Empty() {
		var nsLabels map[string]string
		switch {
		case a.Resource.Group == "" && a.Resource.Plural == "namespaces":
			nsLabels = labelsOf(firstObject(a))
		case a.Resource.Namespaced:
			var err error
			if nsLabels, err = d.namespaces(ctx, a.Namespace); err != nil {
				if apierrors.IsNotFound(err) {
					return false, nil
				}
				return false, fmt.Errorf("namespace %q: %w", a.Namespace, err)
			}
		default:
			nsLabels = nil
		}
		if a.Resource.Namespaced || a.Resource.Plural == "namespaces" {
			if !h.nsSel.Matches(labels.Set(nsLabels)) {
				return false, nil
			}
		}
	}
	if !h.objSel.Empty() {
		newMatch := a.Object != nil && h.objSel.Matches(labels.Set(labelsOf(a.Object)))
		oldMatch := a.OldObject != nil && h.objSel.Matches(labels.Set(labelsOf(a.OldObject)))
		if !newMatch && !oldMatch {
			return false, nil
		}
	}
	return true, nil
}

func firstObject(a *admission.Attributes) runtime.Object {
	if a.Object != nil {
		return a.Object
	}
	return a.OldObject
}

func labelsOf(obj runtime.Object) map[string]string {
	if obj == nil {
		return nil
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil
	}
	return m.GetLabels()
}
