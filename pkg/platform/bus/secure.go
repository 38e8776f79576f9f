package bus

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/fanpbx/fan/pkg/platform/config"
)

// ErrInsecure is what a client or a server (package natsserver) returns when it would
// speak on a network other than loopback without TLS or without an identity
// and its configuration does not say it is a throwaway lab. Anyone who can
// reach such a port can read every event and forge every command.
var ErrInsecure = errors.New("insecure bus refused")

// checkSecure refuses a client configuration that would reach a server off
// loopback in clear text or anonymously. Loopback connections stay on this
// machine, so they may go without.
func (c *Config) checkSecure() error {
	if c.InsecureLab || c.URL == "" {
		return nil
	}
	var remote []string
	for _, u := range strings.Split(c.URL, ",") {
		if u = strings.TrimSpace(u); u != "" && !loopbackURL(u) {
			remote = append(remote, redact(u))
		}
	}
	if len(remote) == 0 {
		return nil
	}
	var missing []string
	if c.TLS.CA == "" {
		missing = append(missing, "bus.tls.ca (TLS)")
	}
	if c.Creds == "" && c.NKeySeed == "" && c.TLS.Cert == "" {
		missing = append(missing, "an identity (bus.nkey_seed, bus.creds or bus.tls.cert)")
	}
	if len(missing) == 0 {
		return nil
	}
	return &config.FieldError{Key: "bus.url", Err: fmt.Errorf(
		"%w: %s is not loopback, so the connection needs %s; only a throwaway lab may set bus.insecure_lab: true",
		ErrInsecure, strings.Join(remote, ","), strings.Join(missing, " and "))}
}

// loopbackURL reports whether a NATS URL (nats://h:p, tls://h:p, h:p or h)
// names this machine.
func loopbackURL(raw string) bool {
	if !strings.Contains(raw, "://") {
		raw = "nats://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return false
	}
	return loopbackHost(u.Hostname())
}

// IsLoopbackHost reports whether host is a loopback name or address, the
// test every listener that may skip TLS applies.
func IsLoopbackHost(host string) bool { return loopbackHost(host) }

// loopbackHost reports whether host is a loopback name or address. An empty
// host or 0.0.0.0 listens on every interface, so it is not.
func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}
