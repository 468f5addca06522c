// kube-controller-manager for guardedcron's local control plane: the upstream command, unchanged.
package main

import (
	"os"
	_ "time/tzdata" // the CronJob controller evaluates schedules in named time zones

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	os.Exit(cli.Run(app.NewControllerManagerCommand()))
}
