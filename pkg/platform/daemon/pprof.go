//go:build pprof

package daemon

import (
	"net"
	"net/http"
	_ "net/http/pprof" // registers /debug/pprof on http.DefaultServeMux
	"os"
)

// A service built with -tags pprof serves net/http/pprof on the address in
// FAN_PPROF, so a benchmark that runs the binary as a process of its own
// (the prober's cost, the arbiter's scale) can profile that process alone.
// Release builds do not contain it.
func init() {
	addr := os.Getenv("FAN_PPROF")
	if addr == "" {
		return
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		panic("pprof listen: " + err.Error())
	}
	go func() { _ = http.Serve(ln, nil) }() //nolint:gosec // profiling build only, loopback
}
