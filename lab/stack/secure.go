package stack

import (
	"context"
	"path/filepath"

	"github.com/fanpbx/fan/lab/netlab"
)

// natsSecurityArgs are fan-nats's authentication and TLS arguments on host.
func (s *Stack) natsSecurityArgs(host string) []string {
	return []string{"-insecure-lab"}
}

// FanctlArgs are the connection flags fanctl needs to reach the lab's bus
// from the control host.
func (s *Stack) FanctlArgs() []string {
	return []string{"--url", s.NATSURL(), "--insecure-lab"}
}

// Fanctl runs fanctl on the control host, connected to the lab's bus, and
// returns its combined output.
func (s *Stack) Fanctl(ctx context.Context, args ...string) ([]byte, error) {
	argv := append([]string{filepath.Join(s.opts.BinDir, "fanctl")}, s.FanctlArgs()...)
	return s.Lab.Exec(ctx, netlab.ControlHost, append(argv, args...)...)
}

// busAuth is the template data of the bus identity of svc on host (see
// busAuthTemplate); empty while the lab runs a plain bus.
func (s *Stack) busAuth(host, svc string) map[string]any {
	return map[string]any{}
}
