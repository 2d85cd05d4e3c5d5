// Command orch runs a small Kubernetes-compatible cluster: `orch server`
// runs the control plane, `orch agent` turns a machine into a node.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"

	"github.com/orch-dev/orch/internal/hostcheck"
	"github.com/orch-dev/orch/internal/release"
	"github.com/urfave/cli/v2"
)

// version and commit are set at build time with -ldflags "-X
// main.version=... -X main.commit=..." (scripts/build.sh, release.sh); a
// plain go build takes the commit from the build's VCS stamp.
var (
	version = "v0.0.0-dev"
	commit  = ""
)

// buildCommit is the commit orch was built from, "unknown" when neither
// the build nor Go's VCS stamp says.
func buildCommit() string {
	if commit != "" {
		return commit
	}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				return s.Value[:12]
			}
		}
	}
	return "unknown"
}

// gcPercent is the garbage collector's target when GOGC is not set: the
// heap may grow half its live size between collections, not all of it
// (Go's default, 100). A server with its agent and 30 pods: 43.9 MB of
// anonymous memory instead of 53.4, for collections twice as often, which
// an idle board barely notices (docs/operations.md).
const gcPercent = 50

// tuneGC sets gcPercent unless GOGC says otherwise (the runtime has
// applied that already).
func tuneGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
}

func main() {
	tuneGC()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "orch:", err)
		os.Exit(1)
	}
}

// run is main without the process: testable with any arguments and output.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	app := &cli.App{
		Name:                 "orch",
		Usage:                "a small Kubernetes-compatible cluster for edge machines",
		Version:              version,
		Writer:               stdout,
		HideVersion:          true,
		EnableBashCompletion: true,
		// Errors return to main instead of exiting inside the library.
		ExitErrHandler: func(*cli.Context, error) {},
		Commands:       appCommands(),
	}
	return app.RunContext(ctx, args)
}

// serverDataDirFlag is --data-dir of the commands that act on a server's
// data dir (through its control socket when it runs).
func serverDataDirFlag() cli.Flag {
	return &cli.StringFlag{Name: "data-dir", Value: "/var/lib/orch", EnvVars: []string{"ORCH_DATA_DIR"}, Usage: "the server's data dir"}
}

// appCommands are orch's commands.
func appCommands() []*cli.Command {
	return []*cli.Command{
		serverCommand(),
		agentCommand(),
		snapshotCommand(),
		tokenCommand(),
		secretsEncryptCommand(),
		certificateCommand(),
		upgradeCommand(),
		{
			Name:  "check-config",
			Usage: "check this machine's kernel and system for what orch needs, and say how to fix what is missing",
			Action: func(c *cli.Context) error {
				if !hostcheck.Print(c.App.Writer, hostcheck.Check(hostcheck.Local())) {
					return errors.New("this machine lacks what orch needs (see above)")
				}
				return nil
			},
		},
		{
			Name:  "version",
			Usage: "print orch's version",
			Action: func(c *cli.Context) error {
				_, err := fmt.Fprintf(c.App.Writer, "orch version %s (commit %s, %s, %s)\n", version, buildCommit(), runtime.Version(), release.Platform())
				return err
			},
		},
	}
}
