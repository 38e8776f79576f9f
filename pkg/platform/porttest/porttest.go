// Package porttest finds a loopback port for a test's listener or program,
// once for the whole repository.
package porttest

import (
	"errors"
	"fmt"
	"net"
	"testing"
)

// Free finds a loopback port free for both TCP and UDP (Kamailio, named and
// the SIP peers listen on both). The port is released before it is returned,
// so a program may still lose it to another: a caller retries a start that
// fails.
func Free() (int, error) {
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("listen on a loopback port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", port))
		l.Close()
		if err == nil {
			u.Close()
			return port, nil
		}
	}
	return 0, errors.New("porttest: no loopback port free for both TCP and UDP")
}

// Port is Free that fails the test.
func Port(t testing.TB) int {
	t.Helper()
	port, err := Free()
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	return port
}

// Addr is a free loopback address, host:port, for a listener.
func Addr(t testing.TB) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", Port(t))
}
