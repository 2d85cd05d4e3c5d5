// Command fakeorch is a binary that passes for an orch release (it is
// built from orch's module and answers `orch version` as orch does) but
// fails to start anything else: the release tests' stand-in for a
// release that does not start.
package main

import (
	"fmt"
	"os"
	"runtime"
)

var version = "v0.0.0-dev"

func main() {
	if len(os.Args) > 1 && os.Args[1] == "version" {
		fmt.Printf("orch version %s (commit fake, %s, %s/%s)\n", version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
		return
	}
	fmt.Fprintln(os.Stderr, "fakeorch: this release does not start")
	os.Exit(1)
}
