// Command fan-scheduler runs fan's scheduler service.
package main

import (
	"os"

	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/services/scheduler/internal/app"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(daemon.Run(os.Args[1:], "fan-scheduler", version, "/etc/fan/scheduler.yaml", app.Build))
}
