package main

import (
	"fmt"

	"github.com/orch-dev/orch/internal/api"
	"github.com/urfave/cli/v2"
)

// certificateCommand is `orch certificate`: k3s's certificate rotate for
// the server's own certificates, and rotate-ca for the cluster CA.
func certificateCommand() *cli.Command {
	return &cli.Command{
		Name:  "certificate",
		Usage: "manage the server's certificates",
		Subcommands: []*cli.Command{{
			Name: "rotate",
			Usage: "issue the server's certificates (serving, admin, kubelet client) again now, the old ones kept in a backup directory: " +
				"a running server presents them at once and rewrites the admin kubeconfig; a stopped one makes them at its next start. " +
				"Nodes renew their own before they expire.",
			Flags: []cli.Flag{
				serverDataDirFlag(),
			},
			Action: func(c *cli.Context) error {
				out, err := api.RotateCertificates(c.Context, c.String("data-dir"))
				if err != nil {
					return err
				}
				when := "at the server's next start"
				if out.Running {
					when = "by the running server, in force now"
				}
				_, err = fmt.Fprintf(c.App.Writer, "Certificates rotated %s; the old ones are in %s\n", when, out.Backup)
				return err
			},
		}, {
			Name: "rotate-ca",
			Usage: "replace the cluster CA with a new one, which the old one endorses: both stay trusted, so nodes, kubeconfigs and pods " +
				"that trust the old one keep working while the nodes renew their certificates from the new one (within ten minutes, or at their restart). " +
				"With --drop-previous, stop trusting the old one once they have.",
			Flags: []cli.Flag{
				serverDataDirFlag(),
				&cli.BoolFlag{Name: "drop-previous", Usage: "stop trusting the CA the last rotation replaced, and certificates it signed (refused while a Ready node still presents one)"},
				&cli.BoolFlag{Name: "force", Usage: "with --drop-previous: drop it though nodes have not renewed (they must join again)"},
			},
			Action: func(c *cli.Context) error {
				out, err := api.RotateCA(c.Context, c.String("data-dir"), c.Bool("drop-previous"), c.Bool("force"))
				if err != nil {
					return err
				}
				what := "Cluster CA rotated; the previous CA is still trusted"
				if c.Bool("drop-previous") {
					what = "The previous cluster CA is no longer trusted"
				}
				when := "at the server's next start"
				if out.Running {
					when = "by the running server, in force now"
				}
				_, err = fmt.Fprintf(c.App.Writer, "%s, %s; the old files are in %s\nThe join token is now: %s\n", what, when, out.Backup, out.Token)
				return err
			},
		}},
	}
}
