package pods

import (
	"slices"
	"testing"

	"github.com/orch-dev/orch/internal/iptables"
)

// TestMasquerade: one rule for the node's pods, kept once over restarts,
// sparing traffic to any pod in the cluster; the rule of earlier versions
// (which masqueraded pod-to-pod traffic between nodes) is removed.
func TestMasquerade(t *testing.T) {
	ipt := iptables.NewFake()
	legacy := []string{"-s", "10.42.1.0/24", "!", "-o", bridgeName, "-m", "comment", "--comment", "orch: pod traffic leaving the node", "-j", "MASQUERADE"}
	if err := ipt.EnsureRule("nat", "POSTROUTING", legacy...); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := masquerade(ipt, "10.42.1.0/24", "10.42.0.0/16"); err != nil {
			t.Fatal(err)
		}
	}
	got, err := ipt.Rules("nat", "POSTROUTING")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"-P POSTROUTING ACCEPT",
		"-A POSTROUTING -s 10.42.1.0/24 ! -d 10.42.0.0/16 ! -o orch0 -m comment --comment orch: pod traffic leaving the cluster -j MASQUERADE"}
	if !slices.Equal(got, want) {
		t.Fatalf("POSTROUTING:\n%q\nwant\n%q", got, want)
	}
}
