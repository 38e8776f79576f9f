// Command fan-ipmover is fan's node executor: it moves floating addresses
// onto and off this node as the arbiter commands.
package main

import (
	"os"

	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/services/ipmover/internal/app"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(daemon.Run(os.Args[1:], "fan-ipmover", version, "/etc/fan/ipmover.yaml", app.Build))
}
