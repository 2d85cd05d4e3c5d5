package podnet

import (
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	"github.com/orch-dev/orch/internal/iptables"
	"github.com/orch-dev/orch/internal/roottest"
	"golang.org/x/sys/unix"
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

// TestNamespaces: a namespace made by NewNamespace outlives the thread
// that made it (its bind mount holds it), is entered by InNetNS, and the
// caller's own namespace is untouched afterwards (root).
func TestNamespaces(t *testing.T) {
	roottest.Require(t, "making namespaces")
	dir := t.TempDir()
	path := filepath.Join(dir, "net")
	if err := NewNamespace(Net, path, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(path, unix.MNT_DETACH) })
	host, err := os.Readlink("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	var inside string
	if err := InNetNS(path, func() (err error) {
		inside, err = os.Readlink("/proc/thread-self/ns/net")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if inside == host || inside == "" {
		t.Fatalf("InNetNS ran in %q, the host's is %q", inside, host)
	}
	if err := bringUpLoopback(path); err != nil {
		t.Fatalf("lo in the new namespace: %v", err)
	}
	for range 20 { // threads come back to the host's namespace
		if now, _ := os.Readlink("/proc/thread-self/ns/net"); now != host {
			t.Fatalf("a thread was left in %q", now)
		}
		runtime.Gosched()
	}
	uts := filepath.Join(dir, "uts")
	if err := NewNamespace(UTS, uts, func() error { return unix.Sethostname([]byte("pod-host")) }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(uts, unix.MNT_DETACH) })
	if name, _ := os.Hostname(); name == "pod-host" {
		t.Fatal("the UTS namespace's hostname leaked to the host")
	}
}
