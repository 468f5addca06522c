// kubectl for guardedcron's local control plane and tests: the upstream command, unchanged.
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	// RunNoErrOutput leaves the error to CheckErr, which prints it the way kubectl users
	// expect and picks the exit code.
	util.CheckErr(cli.RunNoErrOutput(cmd.NewDefaultKubectlCommand()))
}
