package plugins

import (
	"context"
	"fmt"

	"github.com/orch-dev/orch/internal/upgradeapi"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var upgradesResource = schema.GroupResource{Group: upgradeapi.GroupVersion.Group, Resource: "upgrades"}

// admitOneUpgrade refuses a new Upgrade while another runs: one plan at a
// time, whichever way it is made (kubectl apply as well as orch upgrade
// apply), instead of a second plan that the loop would only mark Failed.
func (p *Plugins) admitOneUpgrade(ctx context.Context, obj, old runtime.Object) error {
	if old != nil {
		return nil
	}
	st := p.storage(upgradesResource.Group, upgradesResource.Resource)
	if st == nil {
		return nil // its definition going as the object comes: nothing runs
	}
	list, err := st.List(ctx, "", &metav1.ListOptions{})
	if err != nil {
		return err
	}
	items, err := meta.ExtractList(list)
	if err != nil {
		return err
	}
	name := ""
	if m, err := meta.Accessor(obj); err == nil {
		name = m.GetName()
	}
	for _, item := range items {
		u, ok := item.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		phase, _, _ := unstructured.NestedString(u.Object, "status", "phase")
		if phase == upgradeapi.PhaseSucceeded || phase == upgradeapi.PhaseFailed {
			continue
		}
		return apierrors.NewForbidden(upgradesResource, name,
			fmt.Errorf("the upgrade %s is under way: one plan runs at a time (wait for it, or delete it)", u.GetName()))
	}
	return nil
}
