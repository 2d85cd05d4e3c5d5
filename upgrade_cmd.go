package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/orch-dev/orch/internal/api"
	"github.com/orch-dev/orch/internal/release"
)

// upgradeCommand is `orch upgrade`: the server hands a release to its
// nodes and rolls it over them (internal/loops/upgrade).
func upgradeCommand() *cli.Command {
	return &cli.Command{
		Name:  "upgrade",
		Usage: "roll a new orch release over the cluster: stage its binaries on a server, then apply a plan",
		Subcommands: []*cli.Command{
			{
				Name:      "stage",
				Usage:     "keep release binaries (make release's dist/: orch, orch-arm64, orch-armhf, orch-armv6, sha256sum.txt) on this server for its nodes; with no file, this orch binary itself",
				ArgsUsage: "[FILE...]",
				Flags:     []cli.Flag{serverDataDirFlag()},
				Action: func(c *cli.Context) error {
					files := c.Args().Slice()
					if len(files) == 0 {
						self, err := os.Executable()
						if err != nil {
							return err
						}
						files = []string{self}
					}
					out, err := api.StageReleases(c.Context, c.String("data-dir"), files)
					for _, r := range out.Staged {
						_, _ = fmt.Fprintf(c.App.Writer, "staged orch %s for %s (sha256 %s, %d bytes)\n", r.Version, r.Platform, r.SHA256, r.Size)
					}
					return err
				},
			},
			{
				Name:      "apply",
				Usage:     "make the plan that upgrades the nodes to VERSION: servers first, one at a time, then agents, each cordoned and drained",
				ArgsUsage: "[flags] VERSION",
				Flags: []cli.Flag{
					serverDataDirFlag(),
					&cli.IntFlag{Name: "concurrency", Value: 1, Usage: "agents upgraded at once"},
					&cli.StringFlag{Name: "selector", Usage: "only the nodes with these labels (a label selector)"},
					&cli.BoolFlag{Name: "force", Usage: "allow a downgrade, a skipped minor version, replacing a development build"},
					&cli.BoolFlag{Name: "drain-force", Usage: "evict pods no controller manages too (they do not come back)"},
					&cli.BoolFlag{Name: "delete-emptydir-data", Usage: "evict pods with emptyDir volumes (their data goes)"},
					&cli.DurationFlag{Name: "drain-timeout", Usage: "how long evictions may wait for budgets (default 5m)"},
					&cli.DurationFlag{Name: "node-timeout", Usage: "how long a node has to be Ready on the new version before it goes back (default 10m)"},
				},
				Action: func(c *cli.Context) error {
					switch {
					case c.NArg() == 0:
						return errors.New("orch upgrade apply [flags] VERSION: say which staged version (orch upgrade status lists them)")
					case c.NArg() > 1:
						return fmt.Errorf("orch upgrade apply [flags] VERSION: %q after the version is not read; put flags before it", strings.Join(c.Args().Tail(), " "))
					}
					if c.Int("concurrency") < 1 {
						return fmt.Errorf("--concurrency %d: at least 1", c.Int("concurrency"))
					}
					u, err := api.ApplyUpgrade(c.Context, c.String("data-dir"), api.ApplyOptions{
						Version: c.Args().First(), Concurrency: int32(c.Int("concurrency")), Selector: c.String("selector"),
						Force: c.Bool("force"), DrainForce: c.Bool("drain-force"), DeleteEmpty: c.Bool("delete-emptydir-data"),
						DrainTimeout: c.Duration("drain-timeout"), NodeTimeout: c.Duration("node-timeout"),
					})
					if err != nil {
						return err
					}
					_, err = fmt.Fprintf(c.App.Writer, "upgrade %s created: orch upgrade status (or kubectl get upgrades) follows it\n", u.Name)
					return err
				},
			},
			{
				Name:  "status",
				Usage: "the upgrade plans, their nodes, and the releases staged",
				Flags: []cli.Flag{serverDataDirFlag()},
				Action: func(c *cli.Context) error {
					st, err := api.GetUpgradeStatus(c.Context, c.String("data-dir"))
					if err != nil {
						return err
					}
					return printUpgradeStatus(c, st)
				},
			},
			pauseCommand("pause", true), pauseCommand("resume", false),
			{
				Name:   "guard",
				Usage:  "watch a process running an upgrade on trial and roll it back if it dies or is not Ready in time (started by orch itself)",
				Hidden: true,
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "data-dir", Required: true},
					&cli.IntFlag{Name: "pid", Required: true},
				},
				Action: func(c *cli.Context) error {
					log := slog.New(slog.NewTextHandler(c.App.Writer, nil)).With("guard", c.Int("pid"))
					return release.Guard(c.Context, c.String("data-dir"), c.Int("pid"), 500*time.Millisecond, log)
				},
			},
		},
	}
}

func pauseCommand(name string, paused bool) *cli.Command {
	return &cli.Command{
		Name:      name,
		Usage:     name + " the upgrade under way (or the one named)",
		ArgsUsage: "[NAME]",
		Flags:     []cli.Flag{serverDataDirFlag()},
		Action: func(c *cli.Context) error {
			return api.PauseUpgrade(c.Context, c.String("data-dir"), c.Args().First(), paused)
		},
	}
}

func printUpgradeStatus(c *cli.Context, st api.UpgradeStatus) error {
	w := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
	// The tab writer keeps the first error for Flush.
	line := func(format string, args ...any) { _, _ = fmt.Fprintf(w, format+"\n", args...) }
	if len(st.Upgrades) == 0 {
		line("no upgrade plans")
	} else {
		line("NAME\tVERSION\tPHASE\tUPGRADED\tMESSAGE")
		for _, u := range st.Upgrades {
			line("%s\t%s\t%s\t%s\t%s", u.Name, u.Spec.Version, u.Status.Phase, u.Status.Progress, u.Status.Message)
		}
		// The nodes of the newest plan that has some (the one under way).
		last := st.Upgrades[0]
		for _, u := range st.Upgrades {
			if len(u.Status.Nodes) > 0 && (len(last.Status.Nodes) == 0 || !u.CreationTimestamp.Before(&last.CreationTimestamp)) {
				last = u
			}
		}
		line("\nNODE (%s)\tROLE\tFROM\tPHASE\tMESSAGE", last.Name)
		for _, n := range last.Status.Nodes {
			line("%s\t%s\t%s\t%s\t%s", n.Name, n.Role, n.From, n.Phase, n.Message)
		}
	}
	line("\nSTAGED\tPLATFORM\tSHA256")
	for _, r := range st.Releases {
		line("%s\t%s\t%s", r.Version, r.Platform, r.SHA256)
	}
	return w.Flush()
}

// selfUpgrade is the upgrade side of an orch server or agent process on
// dataDir: the context its parts run under (ended when a swap asks the
// process to start again), and whether a trial rolled back as it started,
// in which case the caller runs nothing and execs at once.
func selfUpgrade(ctx context.Context, dataDir string, log *slog.Logger) (*release.Self, context.Context, bool, error) {
	ctx, stop := context.WithCancel(ctx)
	if err := os.MkdirAll(filepath.Join(dataDir, "upgrade"), 0o700); err != nil {
		stop()
		return nil, nil, false, err
	}
	self, err := release.NewSelf(dataDir, version, log, stop)
	if err != nil {
		stop()
		return nil, nil, false, err
	}
	restart, err := self.Start()
	if err != nil {
		stop()
		return nil, nil, false, fmt.Errorf("the upgrade on trial: %w", err)
	}
	return self, ctx, restart, nil
}

// execIfRestarting replaces the process with its new binary when a swap
// asked for it (after its parts have stopped); otherwise it returns err.
func execIfRestarting(self *release.Self, err error) error {
	if self == nil || !self.Restarting() {
		return err
	}
	return fmt.Errorf("start the new binary: %w", self.Exec())
}
