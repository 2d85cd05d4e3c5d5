package rest

import (
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestGroupVersions: a group served at several versions lists them all,
// the first one served being preferred, as Kubernetes' discovery does.
func TestGroupVersions(t *testing.T) {
	groups := []groupVersion{
		{GroupVersion: schema.GroupVersion{Version: "v1"}},
		{GroupVersion: schema.GroupVersion{Group: "example.com", Version: "v2"}},
		{GroupVersion: schema.GroupVersion{Group: "apps", Version: "v1"}},
		{GroupVersion: schema.GroupVersion{Group: "example.com", Version: "v1beta1"}},
	}
	if got := groupNames(groups); len(got) != 3 || got[0] != "" || got[1] != "example.com" || got[2] != "apps" {
		t.Fatalf("groups in discovery order: %q", got)
	}
	ag := apiGroup(groups, "example.com")
	if len(ag.Versions) != 2 || ag.Versions[0].GroupVersion != "example.com/v2" || ag.Versions[1].Version != "v1beta1" {
		t.Fatalf("versions: %+v", ag.Versions)
	}
	if ag.PreferredVersion.Version != "v2" {
		t.Fatalf("preferred: %+v", ag.PreferredVersion)
	}
}
