// Command fan-replicator runs fan's replicator service.
package main

import (
	"os"

	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/services/replicator/internal/app"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(daemon.Run(os.Args[1:], "fan-replicator", version, "/etc/fan/replicator.yaml", app.Build))
}
