// Package builtin lists the descriptions of every kind orch serves out of
// the box, group by group: the API server's catalog starts from them.
package builtin

import (
	"github.com/orch-dev/orch/internal/api/admission/policy"
	"github.com/orch-dev/orch/internal/api/resources"
	"github.com/orch-dev/orch/internal/api/resources/admissionregistration"
	"github.com/orch-dev/orch/internal/api/resources/apiextensions"
	"github.com/orch-dev/orch/internal/api/resources/apiregistration"
	"github.com/orch-dev/orch/internal/api/resources/apps"
	"github.com/orch-dev/orch/internal/api/resources/autoscaling"
	"github.com/orch-dev/orch/internal/api/resources/batch"
	"github.com/orch-dev/orch/internal/api/resources/certificates"
	"github.com/orch-dev/orch/internal/api/resources/coordination"
	"github.com/orch-dev/orch/internal/api/resources/core"
	"github.com/orch-dev/orch/internal/api/resources/discovery"
	"github.com/orch-dev/orch/internal/api/resources/dra"
	"github.com/orch-dev/orch/internal/api/resources/events"
	"github.com/orch-dev/orch/internal/api/resources/flowcontrol"
	"github.com/orch-dev/orch/internal/api/resources/networking"
	"github.com/orch-dev/orch/internal/api/resources/node"
	policies "github.com/orch-dev/orch/internal/api/resources/policy"
	"github.com/orch-dev/orch/internal/api/resources/rbac"
	"github.com/orch-dev/orch/internal/api/resources/scheduling"
	"github.com/orch-dev/orch/internal/api/resources/storage"
	"github.com/orch-dev/orch/internal/api/resources/storagemigration"
)

// Resources returns the built-in descriptions, freshly built so callers
// may not share mutable state by accident.
func Resources() []*resources.Resource {
	var all []*resources.Resource
	for _, group := range []func() []*resources.Resource{
		core.Resources, apps.Resources, autoscaling.Resources, batch.Resources, certificates.Resources, coordination.Resources, discovery.Resources, events.Resources, networking.Resources, flowcontrol.Resources, node.Resources, policies.Resources, dra.Resources, rbac.Resources, scheduling.Resources, storage.Resources, storagemigration.Resources,
		apiextensions.Resources, apiregistration.Resources, func() []*resources.Resource {
			return admissionregistration.Resources(policy.ValidateMatchConditions, policy.ValidatePolicy, policy.ValidateMutatingPolicy)
		},
	} {
		all = append(all, group()...)
	}
	return all
}
