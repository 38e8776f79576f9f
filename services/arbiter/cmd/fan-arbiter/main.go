// Command fan-arbiter decides when floating addresses move. Several may run;
// one leads through a lease on the bus.
package main

import (
	"os"

	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/services/arbiter/internal/app"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(daemon.Run(os.Args[1:], "fan-arbiter", version, "/etc/fan/arbiter.yaml", app.Build))
}
