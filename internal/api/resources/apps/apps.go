// Package apps describes the kinds of the apps API group (apps/v1): one file
// per kind.
package apps

import "github.com/orch-dev/orch/internal/api/resources"

// Resources describes the apps group's kinds.
func Resources() []*resources.Resource {
	return []*resources.Resource{deployments(), replicaSets(), daemonSets(), statefulSets(), controllerRevisions()}
}

// replicas is a workload's desired count, defaulted as Kubernetes does.
func replicas(n *int32) int32 {
	if n == nil {
		return 1
	}
	return *n
}
