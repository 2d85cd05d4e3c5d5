// Package roottest marks the root tier: tests that need root and this
// machine's real parts (containerd and runc, network namespaces,
// iptables, mounts). They skip in the unit tier (`go test -short`) and
// without root, so that the unit tier runs in seconds anywhere.
package roottest

import (
	"os"
	"testing"
)

// Require skips tb unless the root tier runs: as root, and not -short.
// why says what needs root.
func Require(tb testing.TB, why string) {
	tb.Helper()
	if testing.Short() {
		tb.Skipf("root tier (%s): not run with -short", why)
	}
	if os.Geteuid() != 0 {
		tb.Skipf("root tier: %s needs root", why)
	}
}
