// kube-apiserver for guardedcron's local control plane: the upstream command, unchanged.
package main

import (
	"os"
	_ "time/tzdata" // CronJob time zones must resolve without a system zoneinfo

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
