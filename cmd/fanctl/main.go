// Command fanctl is the operator's view of a fan cluster: the event trail
// and who holds what.
package main

import (
	"os"

	"github.com/fanpbx/fan/cmd/internal/fanctl"
)

var version = "dev"

func main() {
	os.Exit(fanctl.Main(os.Args[1:], os.Stdout, os.Stderr, version))
}
