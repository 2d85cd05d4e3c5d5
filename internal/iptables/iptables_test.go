package iptables

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/orch-dev/orch/internal/roottest"
	"golang.org/x/sys/unix"
)

// contract is what every Interface does, the Fake as the kernel. It
// returns the first way ipt differs, so that it may run on a goroutine of
// its own (TestReal's, in another network namespace).
func contract(ipt Interface) error {
	rule := []string{"-s", "10.42.0.0/24", "-j", "MASQUERADE"}
	if err := ipt.EnsureRule("nat", "ORCH-TEST", rule...); err == nil {
		return errors.New("a rule was added to a chain that does not exist")
	}
	for range 2 {
		if err := ipt.EnsureChain("nat", "ORCH-TEST"); err != nil {
			return err
		}
		if err := ipt.EnsureRule("nat", "ORCH-TEST", rule...); err != nil {
			return err
		}
	}
	if err := ipt.EnsureRule("nat", "ORCH-TEST", "-d", "10.43.0.10/32", "-j", "RETURN"); err != nil {
		return err
	}
	want := []string{"-N ORCH-TEST", "-A ORCH-TEST -s 10.42.0.0/24 -j MASQUERADE", "-A ORCH-TEST -d 10.43.0.10/32 -j RETURN"}
	if got, err := ipt.Rules("nat", "ORCH-TEST"); err != nil || !slices.Equal(got, want) {
		return fmt.Errorf("rules after ensuring twice:\n%q\nwant\n%q (%w)", got, want, err)
	}
	for range 2 {
		if err := ipt.EnsureFirstRule("nat", "ORCH-TEST", "-d", "10.43.0.11/32", "-j", "RETURN"); err != nil {
			return err
		}
	}
	if got, err := ipt.Rules("nat", "ORCH-TEST"); err != nil || len(got) != 4 || got[1] != "-A ORCH-TEST -d 10.43.0.11/32 -j RETURN" {
		return fmt.Errorf("rules after ensuring one first twice:\n%q (%w)", got, err)
	}
	if err := ipt.DeleteRule("nat", "ORCH-TEST", "-d", "10.43.0.11/32", "-j", "RETURN"); err != nil {
		return err
	}
	for range 2 {
		if err := ipt.DeleteRule("nat", "ORCH-TEST", rule...); err != nil {
			return err
		}
	}
	if got, err := ipt.Rules("nat", "ORCH-TEST"); err != nil || !slices.Equal(got, []string{want[0], want[2]}) {
		return fmt.Errorf("rules after deleting: %q (%w)", got, err)
	}
	if got, err := ipt.Rules("nat", "POSTROUTING"); err != nil || len(got) != 1 || got[0] != "-P POSTROUTING ACCEPT" {
		return fmt.Errorf("a fresh POSTROUTING: %q (%w)", got, err)
	}
	if err := restoreContract(ipt); err != nil {
		return err
	}
	return removeOwnedContract(ipt)
}

// removeOwnedContract: RemoveOwned takes one owner's chains, the jumps to
// them and its commented rules, in one go, and nothing else.
func removeOwnedContract(ipt Interface) error {
	for _, c := range []string{"ORCH-OWNED-A", "ORCH-OWNED-B"} {
		if err := ipt.EnsureChain("nat", c); err != nil {
			return err
		}
	}
	for _, r := range [][]string{
		{"ORCH-OWNED-A", "-j", "ORCH-OWNED-B"},
		{"POSTROUTING", "-m", "comment", "--comment", "owned: leaving", "-j", "ORCH-OWNED-A"},
		{"POSTROUTING", "-s", "10.42.0.0/24", "-m", "comment", "--comment", "owned: masquerade", "-j", "MASQUERADE"},
		{"POSTROUTING", "-s", "10.99.0.0/24", "-m", "comment", "--comment", "someone else's", "-j", "MASQUERADE"},
	} {
		if err := ipt.EnsureRule("nat", r[0], r[1:]...); err != nil {
			return err
		}
	}
	owned := func(c string) bool { return c == "ORCH-OWNED-A" || c == "ORCH-OWNED-B" }
	byComment := func(r string) bool { return strings.Contains(r, "owned: masquerade") }
	if n, err := RemoveOwned(ipt, "nat", owned, byComment); err != nil || n != 4 {
		return fmt.Errorf("RemoveOwned: %d removed, want 4 (%w)", n, err)
	}
	chains, err := ipt.Chains("nat")
	if err != nil {
		return err
	}
	if slices.Contains(chains, "ORCH-OWNED-A") || slices.Contains(chains, "ORCH-OWNED-B") {
		return fmt.Errorf("owned chains left: %q", chains)
	}
	if got, err := ipt.Rules("nat", "POSTROUTING"); err != nil || len(got) != 2 || !strings.Contains(got[1], "10.99.0.0/24") {
		return fmt.Errorf("POSTROUTING after RemoveOwned: %q, want only someone else's rule (%w)", got, err)
	}
	if n, err := RemoveOwned(ipt, "nat", owned, byComment); err != nil || n != 0 {
		return fmt.Errorf("RemoveOwned again: %d removed (%w)", n, err)
	}
	return nil
}

// restoreContract: iptables-restore --noflush replaces the chains it
// declares, leaves the others, deletes what it says to, and applies all
// or nothing.
func restoreContract(ipt Interface) error {
	first := "*nat\n:ORCH-A - [0:0]\n:ORCH-B - [0:0]\n-A ORCH-A -d 10.43.0.10/32 -p tcp -m comment --comment \"default/web cluster IP\" -m tcp --dport 80 -j ORCH-B\n-A ORCH-B -j RETURN\nCOMMIT\n"
	if err := ipt.Restore("nat", []byte(first)); err != nil {
		return err
	}
	want := []string{"-N ORCH-A", `-A ORCH-A -d 10.43.0.10/32 -p tcp -m comment --comment "default/web cluster IP" -m tcp --dport 80 -j ORCH-B`}
	if got, err := ipt.Rules("nat", "ORCH-A"); err != nil || !slices.Equal(got, want) {
		return fmt.Errorf("rules restored:\n%q\nwant\n%q (%w)", got, want, err)
	}
	// A second restore flushes the chains it declares and deletes one;
	// ORCH-TEST, which it does not name, keeps its rule.
	second := "*nat\n:ORCH-A - [0:0]\n:ORCH-B - [0:0]\n-A ORCH-A -j RETURN\n-X ORCH-B\nCOMMIT\n"
	if err := ipt.Restore("nat", []byte(second)); err != nil {
		return err
	}
	chains, err := ipt.Chains("nat")
	if err != nil {
		return err
	}
	if !slices.Contains(chains, "ORCH-A") || slices.Contains(chains, "ORCH-B") || !slices.Contains(chains, "ORCH-TEST") || !slices.Contains(chains, "POSTROUTING") {
		return fmt.Errorf("chains after the second restore: %q", chains)
	}
	if got, err := ipt.Rules("nat", "ORCH-TEST"); err != nil || len(got) != 2 {
		return fmt.Errorf("a chain the restore did not name: %q (%w)", got, err)
	}
	// A bad line fails the whole restore: ORCH-A keeps its rule.
	bad := "*nat\n:ORCH-A - [0:0]\n-A ORCH-A -j NO-SUCH-CHAIN\nCOMMIT\n"
	if err := ipt.Restore("nat", []byte(bad)); err == nil {
		return errors.New("a restore jumping to no chain succeeded")
	}
	if got, err := ipt.Rules("nat", "ORCH-A"); err != nil || !slices.Equal(got, []string{"-N ORCH-A", "-A ORCH-A -j RETURN"}) {
		return fmt.Errorf("after a failed restore: %q (%w)", got, err)
	}
	return nil
}

func TestFake(t *testing.T) {
	if err := contract(NewFake()); err != nil {
		t.Fatal(err)
	}
}

// TestReal runs the contract against the host's iptables, in a network
// namespace of its own so the host's rules are never touched (root).
func TestReal(t *testing.T) {
	roottest.Require(t, "a network namespace and iptables")
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The thread stays locked and dies with the goroutine: it is the
		// only one in the new namespace, and iptables runs from it.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			t.Errorf("unshare: %v", err)
			return
		}
		ipt, err := IPv4()
		if err != nil {
			t.Error(err)
			return
		}
		if err := contract(ipt); err != nil {
			t.Error(err)
		}
	}()
	<-done
}
