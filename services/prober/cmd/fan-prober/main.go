// Command fan-prober runs fan's health checks on one node.
package main

import (
	"os"

	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/services/prober/internal/app"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(daemon.Run(os.Args[1:], "fan-prober", version, "/etc/fan/prober.yaml", app.Build))
}
