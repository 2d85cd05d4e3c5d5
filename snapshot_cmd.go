package main

import (
	"fmt"

	"github.com/orch-dev/orch/internal/api"
	"github.com/urfave/cli/v2"
)

// snapshotCommand is `orch snapshot`: k3s's etcd-snapshot for orch's store.
func snapshotCommand() *cli.Command {
	return &cli.Command{
		Name:  "snapshot",
		Usage: "snapshot the server's store",
		Subcommands: []*cli.Command{{
			Name:  "save",
			Usage: "save a consistent copy of the store now (from the running server, or from the store itself when none runs)",
			Flags: []cli.Flag{
				serverDataDirFlag(),
				&cli.StringFlag{Name: "name", Value: "on-demand", Usage: "the snapshot's name, before -<host>-<unix time>"},
				&cli.StringFlag{Name: "dir", EnvVars: []string{"ORCH_SNAPSHOT_DIR"}, Usage: "where to write it (default DATA/server/db/snapshots)"},
			},
			Action: func(c *cli.Context) error {
				snap, err := api.SaveSnapshot(c.Context, c.String("data-dir"), c.String("name"), c.String("dir"))
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(c.App.Writer, "Snapshot %s saved at revision %d (%d bytes)\n", snap.Path, snap.Revision, snap.Size)
				return err
			},
		}},
	}
}
