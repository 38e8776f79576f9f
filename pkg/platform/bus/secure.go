package bus

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/nats-io/nats-server/v2/server"
)

// ErrInsecure is what a client or an embedded server returns when it would
// speak on a network other than loopback without TLS or without an identity
// and its configuration does not say it is a throwaway lab. Anyone who can
// reach such a port can read every event and forge every command.
var ErrInsecure = errors.New("insecure bus refused")

// checkSecure refuses a client configuration that would reach a server off
// loopback in clear text or anonymously. Loopback and in-process connections
// stay on this machine, so they may go without.
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

// checkListeners refuses to start a server whose client or route listener is
// reachable from other machines without authentication and TLS. It names
// each listener that is wrong (errors.Join), the client's first.
func checkListeners(o *server.Options, insecureLab bool) error {
	if insecureLab {
		return nil
	}
	var errs []error
	if !o.DontListen && !loopbackHost(o.Host) {
		var missing []string
		if !hasClientAuth(o) {
			missing = append(missing, "authentication")
		}
		if o.TLSConfig == nil {
			missing = append(missing, "TLS")
		}
		if len(missing) > 0 {
			errs = append(errs, &listenerError{route: false, err: fmt.Errorf("%w: nats client listener %s is not loopback and has no %s; give a server configuration "+
				"with authorization and tls blocks (fanctl nats-config writes one), or the insecure-lab flag for a throwaway lab",
				ErrInsecure, net.JoinHostPort(o.Host, fmt.Sprint(o.Port)), strings.Join(missing, " and "))})
		}
	}
	if o.Cluster.Port != 0 && !loopbackHost(o.Cluster.Host) && o.Cluster.TLSConfig == nil {
		errs = append(errs, &listenerError{route: true, err: fmt.Errorf("%w: nats route listener %s is not loopback and has no TLS; give the cluster block a tls block "+
			"(verify: true), or the insecure-lab flag for a throwaway lab",
			ErrInsecure, net.JoinHostPort(o.Cluster.Host, fmt.Sprint(o.Cluster.Port)))})
	}
	return errors.Join(errs...)
}

// listenerError is checkListeners' refusal of one listener: the client's
// (listen) or the routes' (cluster.listen).
type listenerError struct {
	route bool
	err   error
}

func (e *listenerError) Error() string { return e.err.Error() }
func (e *listenerError) Unwrap() error { return e.err }

// hasClientAuth reports whether every client must prove who it is: users,
// nkeys, a token, an operator's JWTs, or a client certificate. A no_auth_user
// lets anonymous clients in, so it counts as none.
func hasClientAuth(o *server.Options) bool {
	if o.NoAuthUser != "" {
		return false
	}
	return len(o.Nkeys) > 0 || len(o.Users) > 0 || o.Username != "" || o.Authorization != "" ||
		len(o.TrustedOperators) > 0 || len(o.TrustedKeys) > 0 || (o.TLSConfig != nil && o.TLSVerify)
}
