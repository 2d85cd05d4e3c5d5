package main

import (
	"fmt"

	"github.com/orch-dev/orch/internal/api"
	"github.com/urfave/cli/v2"
)

// secretsEncryptCommand is `orch secrets-encrypt`: k3s's commands for the
// encryption of Secrets at rest, asked of the running server.
func secretsEncryptCommand() *cli.Command {
	dataDir := serverDataDirFlag()
	action := func(name string) cli.ActionFunc {
		return func(c *cli.Context) error {
			status, err := api.SecretsEncrypt(c.Context, c.String("data-dir"), name)
			if err != nil {
				return err
			}
			_, err = fmt.Fprint(c.App.Writer, status.String())
			return err
		}
	}
	return &cli.Command{
		Name:  "secrets-encrypt",
		Usage: "show and rotate the keys Secrets are encrypted with at rest (server started with --secrets-encryption)",
		Subcommands: []*cli.Command{
			{Name: "status", Usage: "whether Secrets are encrypted, the key that writes them, and how many each key wrote", Flags: []cli.Flag{dataDir}, Action: action("status")},
			{Name: "rotate", Usage: "write Secrets with a new AES-CBC key from now on; the old keys still read what they wrote", Flags: []cli.Flag{dataDir}, Action: action("rotate")},
			{Name: "reencrypt", Usage: "write every Secret again with the current key, then drop the keys nothing uses any more", Flags: []cli.Flag{dataDir}, Action: action("reencrypt")},
		},
	}
}
