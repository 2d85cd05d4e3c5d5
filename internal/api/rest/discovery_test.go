package rest

import (
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestGroupVersions: a group served at several versions lists them all,
// highest first (GA, then beta, then alpha; by number within each), the
// first being preferred, as Kubernetes' discovery orders a custom
// resource's versions whatever order its definition gives them.
func TestGroupVersions(t *testing.T) {
	groups := []groupVersion{
		{GroupVersion: schema.GroupVersion{Version: "v1"}},
		{GroupVersion: schema.GroupVersion{Group: "example.com", Version: "v2"}},
		{GroupVersion: schema.GroupVersion{Group: "apps", Version: "v1"}},
		{GroupVersion: schema.GroupVersion{Group: "example.com", Version: "v1beta1"}},
		{GroupVersion: schema.GroupVersion{Group: "example.com", Version: "v10"}},
	}
	if got := groupNames(groups); len(got) != 3 || got[0] != "" || got[1] != "example.com" || got[2] != "apps" {
		t.Fatalf("groups in discovery order: %q", got)
	}
	ag := apiGroup(groups, "example.com")
	if len(ag.Versions) != 3 || ag.Versions[0].GroupVersion != "example.com/v10" || ag.Versions[1].Version != "v2" || ag.Versions[2].Version != "v1beta1" {
		t.Fatalf("versions: %+v", ag.Versions)
	}
	if ag.PreferredVersion.Version != "v10" {
		t.Fatalf("preferred: %+v", ag.PreferredVersion)
	}
}

// TestAggregatedVersionOrder: the aggregated document orders a group's
// versions as the unaggregated one does.
func TestAggregatedVersionOrder(t *testing.T) {
	groups := []groupVersion{
		{GroupVersion: schema.GroupVersion{Group: "example.com", Version: "v1"}},
		{GroupVersion: schema.GroupVersion{Group: "example.com", Version: "v2"}},
	}
	list := aggregated(groups, false)
	if len(list.Items) != 1 || len(list.Items[0].Versions) != 2 || list.Items[0].Versions[0].Version != "v2" {
		t.Fatalf("aggregated: %+v", list.Items)
	}
}
