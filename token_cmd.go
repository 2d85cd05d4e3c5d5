package main

import (
	"fmt"

	"github.com/orch-dev/orch/internal/api"
	"github.com/urfave/cli/v2"
)

// tokenCommand is `orch token`: k3s's token rotate for orch's join token.
func tokenCommand() *cli.Command {
	return &cli.Command{
		Name:  "token",
		Usage: "manage the join token",
		Subcommands: []*cli.Command{{
			Name: "rotate",
			Usage: "replace the join token's secret (the running server's, or the data dir's when none runs): joins with the old one are refused, " +
				"nodes that joined keep their certificates; change --token wherever the server's configuration sets it",
			Flags: []cli.Flag{
				serverDataDirFlag(),
				&cli.StringFlag{Name: "new-token", Usage: "the new secret, or a whole K10 token (default: a random one)"},
			},
			Action: func(c *cli.Context) error {
				token, err := api.RotateToken(c.Context, c.String("data-dir"), c.String("new-token"))
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(c.App.Writer, "Token rotated; agents join with:\n%s\n", token)
				return err
			},
		}},
	}
}
