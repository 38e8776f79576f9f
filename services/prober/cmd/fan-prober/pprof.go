//go:build pprof

package main

import (
	"net"
	"net/http"
	_ "net/http/pprof" // registers /debug/pprof on http.DefaultServeMux
	"os"
)

// A binary built with -tags pprof serves net/http/pprof on the address in
// FAN_PROBER_PPROF, so the cost benchmark can profile the prober process
// itself (its peers live in the benchmark's process and are not in this
// profile). Release builds do not contain it.
func init() {
	addr := os.Getenv("FAN_PROBER_PPROF")
	if addr == "" {
		return
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		panic("pprof listen: " + err.Error())
	}
	go func() { _ = http.Serve(ln, nil) }() //nolint:gosec // profiling build only, loopback
}
