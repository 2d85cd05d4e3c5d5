// Command kubectl is the stock kubectl, built from the k8s.io/kubectl module
// at the release go.mod pins, for orch's end-to-end tests. It lives in its own
// module so kubectl's many dependencies never enter orch's binary.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
)

func main() {
	os.Exit(cli.Run(cmd.NewDefaultKubectlCommand()))
}
