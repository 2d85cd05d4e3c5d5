package webhook

import (
	"context"
	"errors"

	"github.com/orch-dev/orch/internal/api/admission"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
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

func rulesMatch(rules []admissionregistrationv1.RuleWithOperations, a *admission.Attributes) bool {
	for _, r := range rules {
		if admission.RuleMatches(r, a) {
			return true
		}
	}
	return false
}

func (d *Dispatcher) selectorsMatch(ctx context.Context, h *hook, a *admission.Attributes) (bool, error) {
	return admission.SelectorsMatch(ctx, a, h.nsSel, h.objSel, d.namespaces)
}
