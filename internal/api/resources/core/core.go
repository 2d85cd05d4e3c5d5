// Package core describes the kinds of the core API group (v1): one file per
// kind, each holding everything the API server does for it.
package core

import "github.com/orch-dev/orch/internal/api/resources"

// Resources describes the core group's (v1) kinds.
func Resources() []*resources.Resource {
	return []*resources.Resource{
		namespaces(), pods(), nodes(), services(), endpoints(), configMaps(), secrets(), events(), serviceAccounts(), limitRanges(), resourceQuotas(), persistentVolumes(), persistentVolumeClaims(), podTemplates(), replicationControllers(),
	}
}
