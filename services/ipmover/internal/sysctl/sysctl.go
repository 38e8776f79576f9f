// Package sysctl reads and writes kernel parameters under /proc/sys in one
// network namespace. Network sysctls are per namespace: /proc/sys/net is
// resolved against the namespace of the thread that opens the file, so a
// Namespace-bound writer opens it from a thread inside that namespace.
package sysctl

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vishvananda/netns"
)

// Namespace reads and writes sysctls inside one network namespace;
// netns.None() (the zero value works too) means the caller's own.
type Namespace struct {
	NS netns.NsHandle
}

func path(key string) (string, error) {
	if key == "" || strings.Contains(key, "..") || strings.ContainsAny(key, "/ ") {
		return "", fmt.Errorf("sysctl: bad key %q (dotted form, e.g. net.ipv4.ip_forward)", key)
	}
	return filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/")), nil
}

// Get returns the current value, trimmed.
func (n Namespace) Get(key string) (string, error) {
	p, err := path(key)
	if err != nil {
		return "", err
	}
	var b []byte
	err = n.do(func() error {
		var err error
		b, err = os.ReadFile(p)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("sysctl: read %s: %w", key, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// Set writes value.
func (n Namespace) Set(key, value string) error {
	p, err := path(key)
	if err != nil {
		return err
	}
	err = n.do(func() error { return os.WriteFile(p, []byte(value), 0o644) })
	if err != nil {
		return fmt.Errorf("sysctl: set %s=%s: %w", key, value, err)
	}
	return nil
}

// do runs fn inside the namespace on a thread that is thrown away after
// (never unlocked), so no goroutine later runs in the wrong namespace.
func (n Namespace) do(fn func() error) error {
	if n.NS == 0 || !n.NS.IsOpen() {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(n.NS); err != nil {
			errc <- fmt.Errorf("sysctl: enter namespace: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}
